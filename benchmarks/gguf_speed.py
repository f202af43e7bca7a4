"""One user on the embedded SmolLM2 (or ``--model``, another GGUF of it: a Q4_K_M that
llama.cpp's quantizer made, say): its GGUF blocks (``--quantize gguf``) against int8
weights (``--quantize int8-weights``) and llama.cpp, side by side in one run.

Three sides, each prompt run on every side in turn (the side that goes first rotates
prompt by prompt, the machine being shared and noisy), one request at a time, greedy,
thinking off (SmolLM2 has none):

- **gguf**: an engine over the model loaded with ``quantize="gguf"``;
- **int8**: an engine over the model loaded with ``quantize="int8-weights"``;
- **llama.cpp**: llama-cpp-python over the same GGUF file, in its own process and
  virtual environment (``--llama-python``: a Python with ``llama_cpp`` installed, e.g. the
  portable wheel in ``../shared/wheels``; never a dependency of thinkstruct), as many
  threads as torch uses here, the JSON side through its JSON-schema grammar.

Workloads: **free** (short open questions, up to 128 tokens) and **json** (answers to a
JSON schema, up to 128 tokens). A side's tokens/s is its generated tokens over its wall
time, prompt processing included; gguf/ceiling is gguf's tokens/s over the steps a second
its weight bytes allow at the read bandwidth measured before the workloads (so prefill
and sampling count against it). Also printed: the load average before and after, the
bytes of weights a decoding step reads for each format, this machine's read bandwidth
(a 256 MiB sum, best of 8, same threads; the better of before and after) and the ceiling
they set (bandwidth / bytes).

    python benchmarks/gguf_speed.py [--rounds 2] [--llama-python /tmp/llv/bin/python] [--model FILE.gguf]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from forward_baselines import chat_prompt_ids
from thinkstruct import Constraint
from thinkstruct.engine import Engine, GenerationRequest, SamplingParams, load_model
from thinkstruct.tokenizer import smollm2_gguf_path

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue.",
    "List three uses of a paperclip.",
    "Give me a short recipe for pancakes.",
    "Why do we need sleep?",
]
SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "string"},
        "confidence": {"type": "number"},
        "keywords": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["answer", "confidence", "keywords"],
    "additionalProperties": False,
}
MAX_TOKENS = 128

# The llama.cpp side: a process reading one JSON request a line ({"ids", "max_tokens",
# "schema"}) and answering {"tokens", "seconds"}.
LLAMA_WORKER = r"""
import json, sys, time
from llama_cpp import Llama, LlamaGrammar
llm = Llama(model_path=sys.argv[1], n_ctx=2048, n_threads=int(sys.argv[2]), n_batch=512, verbose=False)
grammars = {}
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    job = json.loads(line)
    grammar = None
    if job["schema"] is not None:
        key = json.dumps(job["schema"], sort_keys=True)
        if key not in grammars:
            grammars[key] = LlamaGrammar.from_json_schema(key, verbose=False)
        grammar = grammars[key]
    llm.reset()
    start = time.perf_counter()
    out = []
    for token in llm.generate(job["ids"], temp=0.0, top_k=1, grammar=grammar, reset=True):
        if llm.token_eos() == token or len(out) >= job["max_tokens"]:
            break
        out.append(token)
    print(json.dumps({"tokens": len(out), "seconds": time.perf_counter() - start}), flush=True)
"""


def _run(engine: Engine, ids: list[int], grammar: Any) -> tuple[int, float]:
    start = time.perf_counter()
    out = engine.submit(
        GenerationRequest(
            prompt_ids=ids, sampling=SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0), grammar=grammar
        )
    ).wait()
    return len(out.token_ids), time.perf_counter() - start


class _LlamaCpp:
    """The llama.cpp worker process."""

    def __init__(self, python: str, path: str, threads: int) -> None:
        self._process = subprocess.Popen(
            [python, "-c", LLAMA_WORKER, str(path), str(threads)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._read()

    def _read(self) -> dict[str, Any]:
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line:
            raise RuntimeError("the llama.cpp worker exited")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def run(self, ids: list[int], schema: dict[str, Any] | None) -> tuple[int, float]:
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps({"ids": ids, "max_tokens": MAX_TOKENS, "schema": schema}) + "\n")
        self._process.stdin.flush()
        reply = self._read()
        return int(reply["tokens"]), float(reply["seconds"])

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        self._process.wait(timeout=30)


def _read_bandwidth() -> float:
    """Bytes per second of a 256 MiB float32 sum on torch's threads (best of 8)."""
    data = torch.ones(64 * 1024 * 1024)
    best = float("inf")
    for _ in range(8):
        start = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - start)
    return data.numel() * 4 / best


def _step_bytes(model: torch.nn.Module) -> int:
    """Bytes of weights one decoding step reads: every projection's and the output layer's
    stored weights (GGUF blocks, or int8 rows and their scales)."""
    total = 0
    for module in model.modules():
        for name in ("packed", "weight_int8", "scale"):
            tensor = getattr(module, name, None)
            if isinstance(tensor, torch.Tensor):
                total += tensor.numel() * tensor.element_size()
    return total


def _step_seconds(models: dict[str, Any], ids: list[int], *, steps: int = 40) -> dict[str, float]:
    """Each model's decoding step at batch 1 on the engine's runner (the decoder stack and
    the output layer, no sampling or scheduling): the best of ``steps``, sides interleaved
    step by step."""
    from thinkstruct.engine.runners.decoder_runner import DecoderRunner

    runners = {label: DecoderRunner(m.model, slots=1, context_length=len(ids) + steps + 1) for label, m in models.items()}  # fmt: skip
    best = dict.fromkeys(models, float("inf"))
    with torch.inference_mode():
        for runner in runners.values():
            runner.forward(0, [ids], [0])
        for step in range(steps):
            for label, runner in runners.items():
                start = time.perf_counter()
                runner.forward(0, [[100 + step]], [len(ids) + step])
                best[label] = min(best[label], time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--llama-python", default="/tmp/llv/bin/python", help="'' skips llama.cpp")
    parser.add_argument(
        "--model", default=str(smollm2_gguf_path()), help="a GGUF (default: the embedded one)"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"# load average before: {os.getloadavg()}, torch threads {torch.get_num_threads()}, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(active)')}")  # fmt: skip
    print(f"# {args.model}")
    models = {"gguf": load_model(args.model, quantize="gguf", progress=False), "int8": load_model(args.model, quantize="int8-weights", progress=False)}  # fmt: skip
    engines = {label: Engine(m).start() for label, m in models.items()}
    llama = _LlamaCpp(args.llama_python, args.model, torch.get_num_threads()) if args.llama_python else None
    first = models["gguf"]
    try:
        grammars = {label: e.compiler.compile(Constraint.json_schema(SCHEMA)) for label, e in engines.items()}
        jobs = {
            "free": [(chat_prompt_ids(first, q), None) for q in QUESTIONS],
            "json": [(chat_prompt_ids(first, f"Answer as JSON (answer, confidence, keywords): {q}"), SCHEMA) for q in QUESTIONS],
        }  # fmt: skip
        for engine in engines.values():  # warm-up
            _run(engine, jobs["free"][0][0], None)
        if llama is not None:
            llama.run(jobs["free"][0][0], None)
            llama.run(jobs["json"][0][0], SCHEMA)
        sides = [*engines, *(["llama.cpp"] if llama is not None else [])]
        bandwidth = _read_bandwidth()
        ceiling = bandwidth / _step_bytes(first.model)
        print(f"# read bandwidth {bandwidth / 1e9:.1f} GB/s: gguf's ceiling {ceiling:.0f} steps/s")
        print(
            f"{'workload':<9} "
            + " ".join(f"{s + ' tok/s':>15}" for s in sides)
            + "   gguf/int8  gguf/llama.cpp  gguf/ceiling"
        )
        for name, items in jobs.items():
            tokens = dict.fromkeys(sides, 0)
            seconds = dict.fromkeys(sides, 0.0)
            for r in range(args.rounds):
                for k, (ids, schema) in enumerate(items):
                    shift = (r * len(items) + k) % len(sides)
                    for side in sides[shift:] + sides[:shift]:
                        if side == "llama.cpp":
                            assert llama is not None
                            n, elapsed = llama.run(ids, schema)
                        else:
                            n, elapsed = _run(engines[side], ids, None if schema is None else grammars[side])
                        tokens[side] += n
                        seconds[side] += elapsed
            rate = {s: tokens[s] / seconds[s] for s in sides}
            cells = " ".join(f"{rate[s]:>15.1f}" for s in sides)
            versus = f"{rate['gguf'] / rate['llama.cpp']:>14.2f}x" if llama is not None else ""
            print(
                f"{name:<9} {cells}   {rate['gguf'] / rate['int8']:>8.2f}x {versus} {rate['gguf'] / ceiling:>12.2f}x"
            )
        bandwidth = max(bandwidth, _read_bandwidth())
        step = _step_seconds(models, jobs["free"][0][0])
        for label, loaded in models.items():
            size = _step_bytes(loaded.model)
            print(f"# {label}: {size / 1e6:.1f} MB of weights a step; ceiling {bandwidth / size:.0f} steps/s "
                  f"at {bandwidth / 1e9:.1f} GB/s read; a decoding step on the runner (best of 40) "
                  f"{step[label] * 1e3:.2f} ms = {size / bandwidth / step[label]:.2f}x the ceiling")  # fmt: skip
        print(f"# load average after: {os.getloadavg()}")
    finally:
        for engine in engines.values():
            engine.close()
        if llama is not None:
            llama.close()


if __name__ == "__main__":
    sys.exit(main())
