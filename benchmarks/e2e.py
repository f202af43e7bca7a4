"""End to end on the embedded SmolLM2-135M-Instruct: the engine against the machine's limit.

Each side alone on the machine: its own process, started after the machine is quiet and
ended with everything it started before the next (``alone.py``), the sides' order
rotating round by round. For each dtype setting (bf16, and dynamic int8 and int8 weights
with ``--quantize``), the sides are

- the engine with 1 and 8 concurrent clients (closed loop: each client sends its next
  request as soon as one finishes), unconstrained and constrained (a JSON schema), in
  tokens generated per second over a fixed window;
- the bare batched forward loop at the same batch size and dtype (prefill, then greedy
  decode with transformers' DynamicCache, argmax only: what the model costs with no
  scheduler, sampling, grammar or streaming);
- the engine's own model runner in a bare loop (prefill, then greedy decode, argmax only):
  the forward passes the engine makes, without its scheduler, sampling and grammars;
- plain transformers ``generate()`` on the same prompts, batch 1 and 8;
- time to first token of a 50-token prompt with the engine idle;
- decoding steps saved by jump-forward (tokens the grammar forced);
- the valid rate of schema answers (the engine's process, first round);
- greedy agreement of each setting with float32 and of int8 with bf16 (one more process,
  no timing).

Prints one table per dtype and the ratios the targets are stated in. Never asserts.

    python benchmarks/e2e.py [--window 20] [--rounds 2] [--dtypes bf16 int8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Spinning OpenMP workers collapse throughput when anything else shares the cores (the
# compile workers, other processes); thinkstruct serve sets the same. Before torch loads,
# here and (inherited) in every side's process.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

sys.path.insert(0, str(Path(__file__).resolve().parent))

import alone
from forward_baselines import (
    VARIANTS,
    bare_forward_tokens_per_s,
    chat_prompt_ids,
    generate_tokens_per_s,
    greedy_agreement,
    runner_loop_tokens_per_s,
)

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "city": {"type": "string", "maxLength": 40},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 4},
    },
    "required": ["name", "age", "city", "hobbies"],
    "additionalProperties": False,
}

QUESTIONS = [
    "Describe a fictional person who lives in Paris.",
    "Tell me about an old fisherman from Lisbon.",
    "Invent a character: a young painter in Kyoto.",
    "Describe a retired teacher living in Cairo.",
    "Who is the baker on the corner in Vienna? Describe them.",
    "Make up a musician from New Orleans.",
    "Describe a scientist who works in Geneva.",
    "Invent a chess player from Buenos Aires.",
    "Describe a nurse in Toronto.",
    "Tell me about a gardener in Cape Town.",
    "Describe a pilot who lives in Sydney.",
    "Invent a librarian from Dublin.",
    "Describe a chef in Mumbai.",
    "Make up a cyclist from Amsterdam.",
    "Describe a poet living in Santiago.",
    "Invent a carpenter from Oslo.",
]


@dataclass
class Side:
    name: str
    samples: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    forced: int = 0
    tokens: int = 0
    #: Requests finished, and the tokens of their answers.
    requests: int = 0
    answer_tokens: int = 0
    steps: int = 0
    #: Engine seconds over the window: all decoding steps, and of them outside the forward
    #: pass (masks, sampling, grammars, detokenizing, streaming).
    step_s: float = 0.0
    off_forward_s: float = 0.0

    @property
    def ms_off_forward_per_step(self) -> float:
        return 1000 * self.off_forward_s / max(self.steps, 1)

    @property
    def mean_answer(self) -> float:
        return self.answer_tokens / max(self.requests, 1)

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens over the seconds of decoding steps only (prefill passes left out)."""
        return self.tokens / self.step_s if self.step_s else float("nan")

    @property
    def value(self) -> float:
        return statistics.median(self.samples) if self.samples else float("nan")


JSON_HINT = " Answer with a JSON object with name, age, city and hobbies."


def closed_loop(
    engine: Any,
    prompts: list[list[int]],
    *,
    clients: int,
    grammar: Any,
    window_s: float,
    side: Side,
    max_tokens: int = 128,
) -> None:
    """``clients`` threads sending requests back to back for ``window_s``; tokens/s over the window."""
    from thinkstruct.engine import GenerationRequest, SamplingParams

    stop_at = time.monotonic() + window_s
    counted = [0] * clients
    steps0 = engine.stats.steps
    step_s0, forward_s0 = engine.stats.step_seconds, engine.stats.forward_seconds

    def client(k: int) -> None:
        i = k
        while time.monotonic() < stop_at:
            params = SamplingParams(max_tokens=max_tokens, temperature=0.7, seed=i)
            handle = engine.submit(
                GenerationRequest(prompt_ids=prompts[i % len(prompts)], sampling=params, grammar=grammar)
            )
            for delta in handle:
                if time.monotonic() <= stop_at:
                    counted[k] += len(delta.token_ids)
                if delta.usage is not None:
                    side.requests += 1
                    side.answer_tokens += delta.usage.completion_tokens
                    side.forced += delta.usage.jump_forward_tokens
                    if delta.usage.time_to_first_token_s is not None:
                        side.ttft.append(delta.usage.time_to_first_token_s)
            i += clients

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = min(time.monotonic(), stop_at) - started
    side.samples.append(sum(counted) / elapsed)
    side.tokens += sum(counted)
    side.steps += engine.stats.steps - steps0
    step_s = engine.stats.step_seconds - step_s0
    side.step_s += step_s
    side.off_forward_s += step_s - (engine.stats.forward_seconds - forward_s0)


def idle_ttft(engine: Any, prompt: list[int], repeats: int = 5) -> float:
    from thinkstruct.engine import GenerationRequest, SamplingParams

    times = []
    for _ in range(repeats):
        handle = engine.submit(
            GenerationRequest(prompt_ids=prompt, sampling=SamplingParams(max_tokens=1, temperature=0))
        )
        times.append(handle.wait().usage.time_to_first_token_s)
    return statistics.median(times)


def valid_rate(engine: Any, prompts: list[list[int]], grammar: Any) -> tuple[float, float, float]:
    """Greedy, one pass each: (valid share of the constrained answers that finished with
    ``stop`` — must be 1.0 —, share of constrained answers that finished with ``stop`` (the
    rest hit ``max_tokens``), valid share without a constraint when the prompt asks for the
    same JSON)."""
    import jsonschema

    from thinkstruct.engine import GenerationRequest, SamplingParams

    def run(g: Any) -> list[Any]:
        handles = [
            engine.submit(
                GenerationRequest(
                    prompt_ids=p, sampling=SamplingParams(max_tokens=160, temperature=0), grammar=g
                )
            )
            for p in prompts
        ]
        return [h.wait() for h in handles]

    def valid(out: Any) -> bool:
        try:
            jsonschema.validate(json.loads(out.content), PERSON)
        except (ValueError, jsonschema.ValidationError):
            return False
        return True

    constrained = run(grammar)
    stopped = [out for out in constrained if out.finish_reason == "stop"]
    free = run(None)
    return (
        sum(map(valid, stopped)) / max(1, len(stopped)),
        len(stopped) / len(constrained),
        sum(map(valid, free)) / len(free),
    )


def _load(label: str) -> Any:
    from thinkstruct.engine import load_model

    dtype, quantize = VARIANTS[label]
    return load_model(dtype=dtype, quantize=quantize, progress=False)


def engine_worker(job: dict[str, Any]) -> dict[str, Any]:
    """The engine's side for one round: the closed loops (1 and 8 clients; free, json and
    free cut to json's mean length), and in the first round the idle time to first token
    and the valid rates."""
    import torch

    from thinkstruct import Constraint
    from thinkstruct.engine import Engine, EngineConfig

    torch.manual_seed(0)
    model = _load(job["dtype"])
    json_prompts = [chat_prompt_ids(model, q + JSON_HINT) for q in QUESTIONS]
    engine = Engine(model, config=EngineConfig(max_batch=8)).start()
    try:
        grammar = engine.compiler.compile(Constraint.json_schema(PERSON))
        out: dict[str, Any] = {"threads": torch.get_num_threads()}
        if job["first"]:
            out["ttft"] = idle_ttft(engine, (json_prompts[0] * 4)[:50])
        sides = {}
        for c in (1, 8):
            # The same prompts on both sides: only the constraint differs.
            for kind, constraint in (("free", None), ("json", grammar)):
                side = sides[f"{c} {kind}"] = Side(kind)
                closed_loop(
                    engine, json_prompts, clients=c, grammar=constraint, window_s=job["window"], side=side
                )
            # Free answers cut to the constrained ones' mean length: the same prefill per
            # generated token on both sides, so the ratio is the grammar's own cost.
            side = sides[f"{c} free-matched"] = Side("free-matched")
            length = max(1, round(sides[f"{c} json"].mean_answer))
            closed_loop(
                engine,
                json_prompts,
                clients=c,
                grammar=None,
                window_s=job["window"],
                side=side,
                max_tokens=length,
            )
        out["sides"] = {key: asdict(side) for key, side in sides.items()}
        if job["first"]:
            out["valid"] = valid_rate(engine, json_prompts, grammar)
        return out
    finally:
        engine.close()


BASELINES = {
    "bare": bare_forward_tokens_per_s,
    "runner": runner_loop_tokens_per_s,
    "generate": generate_tokens_per_s,
}


def baseline_worker(job: dict[str, Any]) -> dict[str, Any]:
    """One baseline (``job["kind"]``: bare forward, the engine's runner in a bare loop, or
    ``generate()``) at batch 1 and 8, 64 new tokens, after a warm-up."""
    model = _load(job["dtype"])
    prompts = [chat_prompt_ids(model, q) for q in QUESTIONS]
    measure = BASELINES[job["kind"]]
    measure(model, prompts[:1], new_tokens=2)
    return {str(c): measure(model, prompts[:c], new_tokens=64) for c in (1, 8)}


def agreement_worker(job: dict[str, Any]) -> dict[str, Any]:
    """Greedy agreement, each setting against float32 and each int8 against bf16 (every
    model in this one process: no timing)."""
    dtypes = job["dtypes"]
    loaded = {d: _load(d) for d in dtypes}
    pairs = [(d, "fp32") for d in dtypes if d != "fp32" and "fp32" in loaded]
    if "bf16" in loaded:
        pairs += [(d, "bf16") for d in ("int8", "int8w") if d in loaded]
    lines = []
    for candidate, reference in pairs:
        ref = loaded[reference]
        prompts = [chat_prompt_ids(ref, q) for q in QUESTIONS]
        agreement = greedy_agreement(loaded[candidate], ref, prompts, new_tokens=64)
        lines.append(
            f"{candidate} vs {reference} greedy agreement, {len(QUESTIONS)} prompts x 64 tokens: {agreement}"
        )
    return {"lines": lines}


WORKERS = {"engine": engine_worker, "baseline": baseline_worker, "agreement": agreement_worker}
BASELINE_NAMES = {
    "bare": "bare forward, batch {c}",
    "runner": "engine's runner, bare loop, batch {c}",
    "generate": "transformers generate(), batch {c}",
}


def _merge(into: Side, got: dict[str, Any]) -> None:
    into.samples += got["samples"]
    into.ttft += got["ttft"]
    for name in ("forced", "tokens", "requests", "answer_tokens", "steps", "step_s", "off_forward_s"):
        setattr(into, name, getattr(into, name) + got[name])


def bench_dtype(label: str, args: argparse.Namespace, runs: list[alone.Run]) -> dict[str, float]:
    sides = {
        f"{c} {kind}": Side(f"engine {kind}, {c} client{'s' if c > 1 else ''}")
        for c in (1, 8)
        for kind in ("free", "json", "free-matched")
    }
    baselines = {(kind, c): Side(BASELINE_NAMES[kind].format(c=c)) for kind in BASELINES for c in (1, 8)}
    rule = alone.quiet_rule(args)
    first: dict[str, Any] = {}
    for r in range(args.rounds):
        for kind in alone.rotation(["engine", *BASELINES], r):
            argv = [
                sys.executable,
                os.path.abspath(__file__),
                "--worker",
                "engine" if kind == "engine" else "baseline",
            ]
            job = {"dtype": label, "kind": kind, "window": args.window, "first": r == 0}
            result, run = alone.Worker(f"{label} {kind}", argv, rule=rule).run(job)
            runs.append(run)
            if kind == "engine":
                first = first or result
                for key, got in result["sides"].items():
                    _merge(sides[key], got)
            else:
                for c in (1, 8):
                    baselines[kind, c].samples.append(result[str(c)])
        print(alone.round_report(r + 1, runs[-1 - len(BASELINES) :]), flush=True)
    valid_json, stopped_json, valid_free = first["valid"]
    print(f"\n## {label}  (SmolLM2-135M-Instruct, {first['threads']} threads)")
    print(f"{'side':42} {'tok/s':>8} {'ttft p50 s':>11}")
    order = [*sides.values(), *(baselines[k, c] for k in ("bare", "runner", "generate") for c in (1, 8))]
    for side in order:
        t = f"{statistics.median(side.ttft):.3f}" if side.ttft else "-"
        print(f"{side.name:42} {side.value:8.1f} {t:>11}")
    json8, free8, free1 = sides["8 json"], sides["8 free"], sides["1 free"]
    results = {
        "constrained/unconstrained, 8 clients": json8.value / free8.value,
        "constrained/unconstrained, 8 clients, equal answer lengths": json8.value
        / sides["8 free-matched"].value,
        "constrained/unconstrained, 8 clients, decoding steps only": json8.decode_tokens_per_s
        / free8.decode_tokens_per_s,
        "mean answer tokens, 8 clients, json / free": json8.mean_answer / free8.mean_answer,
        "engine/bare forward, batch 8 (free)": free8.value / baselines["bare", 8].value,
        "engine/bare forward, batch 1 (free)": free1.value / baselines["bare", 1].value,
        "engine/its runner's bare loop, batch 8 (free)": free8.value / baselines["runner", 8].value,
        "engine/its runner's bare loop, batch 1 (free)": free1.value / baselines["runner", 1].value,
        "engine 8 clients vs generate() batch 8": free8.value / baselines["generate", 8].value,
        "per step outside the forward pass, ms, 8 clients free": free8.ms_off_forward_per_step,
        "per step outside the forward pass, ms, 8 clients json": json8.ms_off_forward_per_step,
        "engine 8 clients, tok/s (json)": json8.value,
        "engine 8 clients, tok/s (free)": free8.value,
        "engine 1 client, tok/s (free)": free1.value,
        "idle time to first token, 50-token prompt, s": first["ttft"],
        "jump-forward share of json tokens": json8.forced / max(json8.tokens, 1),
        "valid json, constrained, of those ending with stop": valid_json,
        "constrained answers ending with stop (not length)": stopped_json,
        "valid json, unconstrained": valid_free,
    }
    for name, value in results.items():
        print(f"  {name:52} {value:.3f}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--window", type=float, default=15.0, help="seconds per closed-loop measurement")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of every side, in rotating order")
    parser.add_argument("--dtypes", nargs="+", default=["int8", "bf16"], choices=sorted(VARIANTS))
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    alone.add_arguments(parser)
    args = parser.parse_args()
    if args.worker:
        alone.worker_main(WORKERS[args.worker])
        return
    print(alone.header())
    runs: list[alone.Run] = []
    for d in args.dtypes:
        bench_dtype(d, args, runs)
    argv = [sys.executable, os.path.abspath(__file__), "--worker", "agreement"]
    agreement, _ = alone.Worker("agreement", argv, rule=alone.UNTIMED).run({"dtypes": args.dtypes})
    print("\n".join(agreement["lines"]))
    print(alone.summary(runs))


if __name__ == "__main__":
    main()
