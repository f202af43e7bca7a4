"""One user on the embedded SmolLM2 (or ``--model``, another GGUF of it: a Q4_K_M that
llama.cpp's quantizer made, say): its GGUF blocks (``--quantize gguf``) against int8
weights (``--quantize int8-weights``) and llama.cpp, each side alone on the machine.

Three sides, each in its own process, one at a time (``alone.py``: the machine quiet
before a side starts, everything a side started ended before the next), their order
rotating round by round; in every round each side runs every prompt once, one request
at a time, greedy, up to 128 tokens, thinking off (SmolLM2 has none):

- **gguf**: an :class:`~thinkstruct.engine.Engine` (default configuration, as ``serve``
  runs it) over the model loaded with ``quantize="gguf"``;
- **int8**: the same over the model loaded with ``quantize="int8-weights"``;
- **llama.cpp**: llama-cpp-python over the same GGUF file (``llama_cpp_worker.py``, run
  by ``--llama-python``: a Python with ``llama_cpp`` installed, e.g. the portable wheel in
  ``../shared/wheels``; never a dependency of thinkstruct), as many threads as torch uses
  here, the JSON side through its JSON-schema grammar.

Every side gets the same token ids (the chat template rendered once, by a first worker)
and warms up on a prompt outside the workloads, grammars built before timing; each keeps
its own reuse of a prompt prefix it has just computed (the engine's prefix cache,
llama.cpp's KV prefix match). Workloads: **free** (six short open questions) and **json**
(the same questions answered to a JSON schema). A side's tokens/s is its generated
tokens over its wall time, prompt processing included, summed over rounds; the spread is
the lowest and highest round's ratio. gguf/ceiling is gguf's tokens/s over the decoding
steps a second its weight bytes allow at this machine's read bandwidth (a 256 MiB float32
sum, best of 8, measured in each thinkstruct worker before and after its workloads, the
best of all), so prefill and sampling count against it. Also printed per thinkstruct
side: the bytes of weights a decoding step reads and the engine's forward-pass seconds
per step over the free workload.

    python benchmarks/gguf_speed.py [--rounds 3] [--llama-python /tmp/llv/bin/python] [--model FILE.gguf]
        [--sides gguf int8 llama.cpp]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import alone

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue.",
    "List three uses of a paperclip.",
    "Give me a short recipe for pancakes.",
    "Why do we need sleep?",
]
WARMUP = "Name a color."
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
QUANTIZE = {"gguf": "gguf", "int8": "int8-weights"}


# ---- the workers (each in its own process) --------------------------------------------------------


def prompts_worker(job: dict[str, Any]) -> dict[str, Any]:
    """The model's path, the token ids of every prompt, and torch's thread count here."""
    import torch

    from forward_baselines import chat_prompt_ids
    from thinkstruct.engine import load_model
    from thinkstruct.tokenizer import smollm2_gguf_path

    if job["threads"]:
        torch.set_num_threads(job["threads"])
    path = job["model"] or str(smollm2_gguf_path())
    model = load_model(path, quantize="gguf", progress=False)
    return {
        "model": path,
        "warmup": chat_prompt_ids(model, WARMUP),
        "workloads": {
            "free": [[chat_prompt_ids(model, q), None] for q in QUESTIONS],
            "json": [
                [chat_prompt_ids(model, f"Answer as JSON (answer, confidence, keywords): {q}"), SCHEMA]
                for q in QUESTIONS
            ],
        },
        "threads": torch.get_num_threads(),
    }


def _read_bandwidth() -> float:
    """Bytes per second of a 256 MiB float32 sum on torch's threads (best of 8)."""
    import torch

    data = torch.ones(64 * 1024 * 1024)
    best = float("inf")
    for _ in range(8):
        start = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - start)
    return data.numel() * 4 / best


def _step_bytes(model: Any) -> int:
    """Bytes of weights one decoding step reads: every projection's and the output layer's
    stored weights (GGUF blocks, or int8 rows and their scales)."""
    import torch

    total = 0
    for module in model.modules():
        for name in ("packed", "weight_int8", "scale"):
            tensor = getattr(module, name, None)
            if isinstance(tensor, torch.Tensor):
                total += tensor.numel() * tensor.element_size()
    return total


def thinkstruct_worker(job: dict[str, Any]) -> dict[str, Any]:
    """One thinkstruct side: an engine over the model quantized as ``job["quantize"]``."""
    import torch

    from thinkstruct import Constraint
    from thinkstruct.engine import Engine, GenerationRequest, SamplingParams, load_model

    if job["threads"]:
        torch.set_num_threads(job["threads"])
    model = load_model(job["model"], quantize=job["quantize"], progress=False)
    engine = Engine(model).start()
    try:
        grammar = engine.compiler.compile(Constraint.json_schema(SCHEMA))

        def run(ids: list[int], schema: Any) -> int:
            sampling = SamplingParams(max_tokens=job["max_tokens"], temperature=0.0)
            constraint = None if schema is None else grammar
            request = GenerationRequest(prompt_ids=ids, sampling=sampling, grammar=constraint)
            return len(engine.submit(request).wait().token_ids)

        run(job["warmup"], None)
        run(job["warmup"], SCHEMA)
        bandwidth = _read_bandwidth()
        results = {}
        for name, items in job["workloads"].items():
            steps, forward_s = engine.stats.steps, engine.stats.forward_seconds
            tokens, seconds = 0, 0.0
            for ids, schema in items:
                start = time.perf_counter()
                tokens += run(ids, schema)
                seconds += time.perf_counter() - start
            results[name] = {
                "tokens": tokens,
                "seconds": seconds,
                "steps": engine.stats.steps - steps,
                "forward_s": engine.stats.forward_seconds - forward_s,
            }
        return {
            "workloads": results,
            "bandwidth": max(bandwidth, _read_bandwidth()),
            "step_bytes": _step_bytes(model.model),
            "threads": torch.get_num_threads(),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(active)"),
        }
    finally:
        engine.close()


WORKERS = {"prompts": prompts_worker, "thinkstruct": thinkstruct_worker}


# ---- the run ---------------------------------------------------------------------------------------


def _worker(side: str, args: argparse.Namespace) -> alone.Worker:
    rule = alone.quiet_rule(args)
    if side == "llama.cpp":
        script = str(Path(__file__).resolve().parent / "llama_cpp_worker.py")
        return alone.Worker(side, [args.llama_python, script], rule=rule)
    kind = "prompts" if side == "prompts" else "thinkstruct"
    rule = alone.UNTIMED if side == "prompts" else rule
    # OpenMP threads that sleep between steps, as thinkstruct serve runs them (unless set here).
    env = {"OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    return alone.Worker(
        side, [sys.executable, os.path.abspath(__file__), "--worker", kind], rule=rule, env=env
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--llama-python", default="/tmp/llv/bin/python", help="'' leaves llama.cpp out")
    parser.add_argument(
        "--sides",
        nargs="+",
        default=[*QUANTIZE, "llama.cpp"],
        choices=[*QUANTIZE, "llama.cpp"],
        help="the sides to run (default all; gguf always runs)",
    )
    parser.add_argument("--model", default=None, help="a GGUF (default: the embedded one)")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    alone.add_arguments(parser)
    args = parser.parse_args()
    if args.worker:
        alone.worker_main(WORKERS[args.worker])
        return
    print(alone.header())
    prompts, _ = _worker("prompts", args).run({"model": args.model, "threads": args.threads})
    threads = prompts["threads"]
    print(f"# {prompts['model']}")
    job = {
        "model": prompts["model"],
        "threads": threads,
        "max_tokens": MAX_TOKENS,
        "warmup": prompts["warmup"],
        "workloads": prompts["workloads"],
    }
    sides = [s for s in [*QUANTIZE, "llama.cpp"] if s == "gguf" or s in args.sides]
    if not args.llama_python and "llama.cpp" in sides:
        sides.remove("llama.cpp")
    print(f"# {threads} threads a side; {args.rounds} rounds, sides in rotating order, each alone")
    results: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    runs = []
    for r in range(args.rounds):
        for side in alone.rotation(sides, r):
            result, run = _worker(side, args).run({**job, "quantize": QUANTIZE.get(side)})
            results[side].append(result)
            runs.append(run)
        rates = "  ".join(
            f"{side} {name} {w['tokens'] / w['seconds']:.1f}"
            for side in sides
            for name, w in results[side][-1]["workloads"].items()
        )
        print(f"  round {r + 1} tok/s: {rates}\n{alone.round_report(r + 1, runs[-len(sides) :])}", flush=True)
    thinkstruct = [res for side in QUANTIZE if side in results for res in results[side]]
    bandwidth = max(res["bandwidth"] for res in thinkstruct)
    ceiling = bandwidth / results["gguf"][0]["step_bytes"]
    print(f"# read bandwidth {bandwidth / 1e9:.1f} GB/s: gguf's ceiling {ceiling:.0f} steps/s")
    print(
        f"{'workload':<9} "
        + " ".join(f"{s + ' tok/s':>15}" for s in sides)
        + f"   {'gguf/int8':>9} {'gguf/llama.cpp (rounds)':>23} {'gguf/ceiling':>12}"
    )

    def rounds(side: str, name: str) -> list[tuple[float, float]]:
        return [(x["workloads"][name]["tokens"], x["workloads"][name]["seconds"]) for x in results[side]]

    for name in job["workloads"]:
        cells = " ".join(f"{alone.rate(rounds(s, name)):>15.1f}" for s in sides)
        versus = (
            alone.ratio(rounds("gguf", name), rounds("llama.cpp", name)) if "llama.cpp" in results else ""
        )
        gguf = alone.rate(rounds("gguf", name))
        over_int8 = f"{gguf / alone.rate(rounds('int8', name)):.2f}x" if "int8" in results else ""
        print(f"{name:<9} {cells}   {over_int8:>9} {versus:>23} {gguf / ceiling:>12.2f}x")
    for side in [s for s in QUANTIZE if s in results]:
        size = results[side][0]["step_bytes"]
        free = [x["workloads"]["free"] for x in results[side]]
        step_ms = 1e3 * sum(w["forward_s"] for w in free) / max(1, sum(w["steps"] for w in free))
        print(
            f"# {side}: {size / 1e6:.1f} MB of weights a step, ceiling {bandwidth / size:.0f} steps/s at"
            f" {bandwidth / 1e9:.1f} GB/s; the engine's forward pass {step_ms:.2f} ms a step (free workload,"
            f" prefill included); OMP_WAIT_POLICY={results[side][0]['omp_wait_policy']}"
        )
    print(alone.summary(runs))


if __name__ == "__main__":
    main()
