"""Real reasoning models' shapes through the engine, beside transformers and the memory limit.

Random weights (seeded) at the real shapes of Qwen3-0.6B (596 M parameters, tied
embeddings, q/k norms) and DeepSeek-R1-Distill-Qwen-1.5B (Qwen2: q/k/v biases, untied
output layer), with Qwen3's real 151,669-token vocabulary for the engine's grammar masks.
No weights are downloaded: the numbers are speed, not text.

For each model, two sides, each alone on the machine: its own process (which builds the
model from the seed), started after the machine is quiet and ended before the other
(``alone.py``), the side that goes first alternating round by round; each cell is the
median over rounds:

- **engine, int8 weights** (what ``serve`` loads): ``clients`` threads each sending
  requests back to back, ``--new-tokens`` per answer, free text and JSON-constrained (a
  schema whose answers cannot end within that many tokens, so both sides generate the
  same lengths; the mean answer length of each side is printed). Tokens/s counts generated
  tokens over wall time, prefill included.
- **transformers bf16, bare loop**: the model's own modules in bfloat16, ``DynamicCache``,
  the batch's prompts prefilled in one forward, then greedy argmax steps: no scheduler,
  sampling or grammar. The same tokens/s definition.
- **weight-bytes limit**: the bytes one decoding step reads (every int8 weight, scale,
  bias and norm the stacked pass touches, plus the output layer), divided by the read
  bandwidth measured in the same run (``torch.sum`` over a 1 GiB float32 buffer, the best
  of five in each side's process, the best of all): the most tokens/s one client could get if reading
  the weights were all a step did; ``clients`` times that for a batch (one read serves
  every row).

It prints a table and asserts nothing.

    python benchmarks/shapes.py [--models qwen3-0.6b r1-distill-qwen-1.5b]
        [--new-tokens 64] [--rounds 3] [--clients 1 8] [--masks-during-forward auto|on|off]
"""

from __future__ import annotations

import argparse
import inspect
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import alone

#: The real shapes (from each model's config.json), random weights.
SHAPES: dict[str, Callable[[], Any]] = {}


def _qwen3_0_6b() -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=151_936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40_960,
        rms_norm_eps=1e-6, tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        bos_token_id=151_643, eos_token_id=151_645,
    )  # fmt: skip


def _r1_distill_qwen_1_5b() -> Any:
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=151_936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=131_072,
        rms_norm_eps=1e-6, tie_word_embeddings=False, use_sliding_window=False, sliding_window=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
        bos_token_id=151_646, eos_token_id=151_643,
    )  # fmt: skip


SHAPES["qwen3-0.6b"] = _qwen3_0_6b
SHAPES["r1-distill-qwen-1.5b"] = _r1_distill_qwen_1_5b

#: Answers of at least 64 strings: no constrained answer ends within --new-tokens.
LONG_JSON = {
    "type": "object",
    "properties": {"notes": {"type": "array", "items": {"type": "string"}, "minItems": 64}},
    "required": ["notes"],
}
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue.",
    "List three uses of a paperclip.",
    "What is 17 times 23? Show your working.",
    "Give me a short recipe for pancakes.",
    "Translate 'good morning' into Spanish and German.",
    "Name four planets and one fact about each.",
]


@dataclass
class Cell:
    """One measured quantity over rounds."""

    samples: list[float] = field(default_factory=list)
    lengths: list[float] = field(default_factory=list)

    @property
    def value(self) -> float:
        return statistics.median(self.samples) if self.samples else float("nan")


def read_bandwidth_gb_s() -> float:
    """GB/s reading a 1 GiB float32 buffer with ``torch.sum`` (all threads), best of five."""
    import torch

    buffer = torch.ones(1 << 28)
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        float(buffer.sum())
        best = min(best, time.perf_counter() - started)
    return buffer.numel() * 4 / best / 1e9


def step_bytes(model: Any) -> int:
    """Bytes a decoding step reads of an int8-weight model: its int8 layers' weights, scales
    and biases, and every float parameter but the input embeddings (of which a step reads
    a row per token)."""
    from thinkstruct.engine.weights.int8_weights import Int8Linear

    total = 0
    for module in model.modules():
        if isinstance(module, Int8Linear):
            total += sum(t.numel() * t.element_size() for t in (module.weight_int8, module.scale))
            total += 0 if module.bias is None else module.bias.numel() * 4
    embedding = model.get_input_embeddings().weight
    for parameter in model.parameters():
        if parameter is not embedding:
            total += parameter.numel() * parameter.element_size()
    return total


def transformers_bare_loop(model: Any, prompts: Sequence[Sequence[int]], *, new_tokens: int) -> float:
    """Tokens/s of transformers' own modules: one prefill of equal-length prompts, then
    greedy argmax steps with ``DynamicCache``."""
    import torch
    from transformers import DynamicCache

    # transformers 5.x renames past_key_values to cache; pass whichever forward takes.
    keyword = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    width = min(len(p) for p in prompts)
    ids = torch.tensor([list(p[:width]) for p in prompts])
    started = time.perf_counter()
    with torch.inference_mode():
        cache = DynamicCache()
        logits = model(input_ids=ids, use_cache=True, logits_to_keep=1, **{keyword: cache}).logits
        for _ in range(new_tokens - 1):
            token = logits[:, -1].argmax(-1, keepdim=True)
            logits = model(input_ids=token, use_cache=True, logits_to_keep=1, **{keyword: cache}).logits
        logits[:, -1].argmax(-1)
    return len(prompts) * new_tokens / (time.perf_counter() - started)


def engine_closed_loop(
    engine: Any, prompts: Sequence[list[int]], *, clients: int, grammar: Any, new_tokens: int, requests: int
) -> tuple[float, float]:
    """``clients`` threads, each sending ``requests`` answers of ``new_tokens`` back to
    back (greedy): (tokens/s over the wall time, mean answer length)."""
    from thinkstruct.engine.request import GenerationRequest, SamplingParams

    counted = [0] * clients
    answers: list[int] = []

    def client(k: int) -> None:
        for r in range(requests):
            request = GenerationRequest(
                prompt_ids=prompts[(k + r * clients) % len(prompts)],
                sampling=SamplingParams(max_tokens=new_tokens, temperature=0.0),
                grammar=grammar,
            )
            for delta in engine.submit(request):
                counted[k] += len(delta.token_ids)
                if delta.usage is not None:
                    answers.append(delta.usage.completion_tokens)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    return sum(counted) / elapsed, statistics.mean(answers)


def build(name: str) -> Any:
    """The bf16 model, seeded: transformers' side, and what the engine's is quantized from."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(SHAPES[name](), dtype=torch.bfloat16).eval()


def int8_weights(bf16: Any) -> Any:
    """``bf16`` turned into the engine's model in place: int8 weights, each Linear's rows
    from its bf16 weight, widened; embeddings and norms float32 (the engine's activations)."""
    from thinkstruct.engine.weights.int8_weights import quantize_int8_weights

    quantize_int8_weights(bf16)
    return bf16.float()


def _prompts() -> list[list[int]]:
    from thinkstruct.tokenizer import Tokenizer

    tokenizer = Tokenizer.qwen3()
    return [
        tokenizer.hf.encode(f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n") for q in QUESTIONS
    ]


def engine_worker(job: dict[str, Any]) -> dict[str, Any]:
    """The engine's side: int8 weights, every client count, free and JSON."""
    import torch

    from thinkstruct import Constraint
    from thinkstruct.engine import Engine, EngineConfig, LoadedModel
    from thinkstruct.engine.runners.decoder_runner import supports
    from thinkstruct.parsers.reasoning_families import get_reasoning_family
    from thinkstruct.tokenizer import Tokenizer

    built = time.perf_counter()
    name = job["model"]
    bf16 = build(name)
    parameters = sum(p.numel() for p in bf16.parameters())
    int8 = int8_weights(bf16)
    context = 1024
    loaded = LoadedModel(
        model=int8, tokenizer=Tokenizer.qwen3(), family=get_reasoning_family("qwen3"), name=name, path=Path(name),
        dtype=torch.float32, quantize="int8-weights", context_length=context, chat_template=None,
        completion_template=None,
    )  # fmt: skip
    out: dict[str, Any] = {
        "parameters": parameters,
        "built_s": time.perf_counter() - built,
        "runner": supports(int8, context_length=context),
        "step_bytes": step_bytes(int8),
        "bandwidth": read_bandwidth_gb_s(),
    }
    prompts = _prompts()
    clients = job["clients"]
    config = EngineConfig(max_batch=max(clients), masks_during_forward=job["masks_during_forward"])
    engine = Engine(loaded, config=config).start()
    try:
        grammar = engine.compiler.compile(Constraint.json_schema(LONG_JSON))
        for c in clients:  # warm-up: first passes allocate the cache and compile the grammar's paths
            for constraint in (None, grammar):
                engine_closed_loop(engine, prompts, clients=c, grammar=constraint, new_tokens=4, requests=1)
        for c in clients:
            for kind, constraint in (("free", None), ("json", grammar)):
                out[f"{kind} {c}"] = engine_closed_loop(
                    engine, prompts, clients=c, grammar=constraint, new_tokens=job["new_tokens"],
                    requests=job["requests"],
                )  # fmt: skip
    finally:
        engine.close()
    out["bandwidth"] = max(out["bandwidth"], read_bandwidth_gb_s())
    return out


def transformers_worker(job: dict[str, Any]) -> dict[str, Any]:
    """transformers' side: the bf16 model's bare loop at every client count."""
    bf16 = build(job["model"])
    prompts = _prompts()
    out: dict[str, Any] = {"bandwidth": read_bandwidth_gb_s()}
    for c in job["clients"]:
        transformers_bare_loop(bf16, prompts[:c], new_tokens=4)  # warm-up
    for c in job["clients"]:
        out[f"bf16 {c}"] = transformers_bare_loop(bf16, prompts[:c], new_tokens=job["new_tokens"])
    out["bandwidth"] = max(out["bandwidth"], read_bandwidth_gb_s())
    return out


WORKERS = {"engine": engine_worker, "transformers": transformers_worker}


def bench(name: str, args: argparse.Namespace, runs: list[alone.Run]) -> list[tuple[str, str]]:
    clients = sorted(set(args.clients))
    during = {"auto": None, "on": True, "off": False}[args.masks_during_forward]
    job = {"model": name, "clients": clients, "new_tokens": args.new_tokens, "requests": args.requests,
           "masks_during_forward": during}  # fmt: skip
    cells: dict[str, Cell] = {}
    engine: dict[str, Any] = {}
    bandwidth = 0.0  # the best of every process's measurement: the limit is not flattered
    for round_ in range(args.rounds):
        for side in alone.rotation(list(WORKERS), round_):
            argv = [sys.executable, os.path.abspath(__file__), "--worker", side]
            result, run = alone.Worker(f"{name} {side}", argv, rule=alone.quiet_rule(args)).run(job)
            runs.append(run)
            bandwidth = max(bandwidth, result["bandwidth"])
            for c in clients:
                if side == "engine":
                    engine = result
                    for kind in ("free", "json"):
                        rate, length = result[f"{kind} {c}"]
                        cell = cells.setdefault(f"engine {kind} {c}", Cell())
                        cell.samples.append(rate)
                        cell.lengths.append(length)
                else:
                    cells.setdefault(f"bf16 {c}", Cell()).samples.append(result[f"bf16 {c}"])
        print(alone.round_report(round_ + 1, runs[-len(WORKERS) :]), flush=True)
    per_step = engine["step_bytes"]
    runner = engine["runner"] or "DecoderRunner (int8 weights: the stacked pass)"
    print(
        f"\n{name}: {engine['parameters'] / 1e6:.0f} M parameters, built in {engine['built_s']:.0f} s;"
        f" engine runner: {runner}; a decoding step reads {per_step / 1e6:.0f} MB of weights",
        flush=True,
    )
    limit = bandwidth * 1e9 / per_step
    print(f"  read bandwidth {bandwidth:.1f} GB/s: the limit is {limit:.1f} tok/s a client", flush=True)
    rows = []
    for c in clients:
        free, json_, bf = cells[f"engine free {c}"], cells[f"engine json {c}"], cells[f"bf16 {c}"]
        rows.append(
            (
                f"{name}, {c} client{'s' if c > 1 else ''}",
                f"engine free {free.value:6.1f} tok/s (answers {statistics.mean(free.lengths):.0f}) | "
                f"JSON {json_.value:6.1f} (answers {statistics.mean(json_.lengths):.0f}, "
                f"{json_.value / free.value:.2f}x free) | transformers bf16 {bf.value:6.1f} "
                f"(engine {free.value / bf.value:.2f}x) | weight-bytes limit {c * limit:6.1f} "
                f"(engine {free.value / (c * limit):.2f}x)",
            )
        )
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--requests", type=int, default=1, help="answers each client asks for per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8])
    parser.add_argument(
        "--masks-during-forward",
        choices=["auto", "on", "off"],
        default="auto",
        help="EngineConfig.masks_during_forward (auto: where a core is left over or a step has 8+ constrained rows)",
    )
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    alone.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.worker:
        alone.worker_main(WORKERS[args.worker])
        return
    # Sleeping OpenMP threads in every side's process (as thinkstruct serve), unless set.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    print(alone.header())
    print(f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']} in each side's process", flush=True)
    rows: list[tuple[str, str]] = []
    runs: list[alone.Run] = []
    for name in args.models:
        rows += bench(name, args, runs)  # each model's rows as soon as they are measured, then all
        for label, text in rows[-len(args.clients) :]:
            print(f"{label:32s} {text}", flush=True)
    print()
    for label, text in rows:
        print(f"{label:32s} {text}")
    print(alone.summary(runs))


if __name__ == "__main__":
    main()
