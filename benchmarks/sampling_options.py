"""What the sampling options cost: closed-loop tokens per second on the embedded SmolLM2
(int8 weights, what ``serve`` loads) with 1 and 8 clients, per option set.

Sides (``--sides``): ``none`` (no option: the path every plain request takes),
``logprobs`` (``logprobs=5``: per token its log-probability and five alternatives),
``penalties`` (presence 0.5, frequency 0.5, repetition 1.1 and a ten-token
``logit_bias``), ``min_p`` (0.05). Besides tokens/s it prints the engine's milliseconds
per decoding step outside the forward pass (masks, sampling, grammars, detokenizing):
where these options cost anything; and the process's CPU milliseconds per generated token,
which moves less than tokens/s when other processes share the cores.

To compare two trees (``none`` runs on a tree without the options too), run this file
against each tree's package in turn, interleaved:

    PYTHONPATH=/tmp/before/src python benchmarks/sampling_options.py --sides none
    PYTHONPATH=src python benchmarks/sampling_options.py --sides none logprobs

Prints a table; never asserts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as serve sets it; before torch loads

sys.path.insert(0, str(Path(__file__).resolve().parent))

import thinkstruct
from forward_baselines import chat_prompt_ids
from thinkstruct.engine import Engine, EngineConfig, GenerationRequest, SamplingParams, load_model

QUESTIONS = [
    "Describe a fictional person who lives in Paris.",
    "Tell me about an old fisherman from Lisbon.",
    "Invent a character: a young painter in Kyoto.",
    "Describe a retired teacher living in Cairo.",
    "Make up a musician from New Orleans.",
    "Describe a scientist who works in Geneva.",
    "Invent a chess player from Buenos Aires.",
    "Describe a nurse in Toronto.",
]

SIDES: dict[str, dict[str, Any]] = {
    "none": {},
    "logprobs": {"logprobs": 5},
    "penalties": {
        "presence_penalty": 0.5,
        "frequency_penalty": 0.5,
        "repetition_penalty": 1.1,
        "logit_bias": tuple((1000 + i, 2.0) for i in range(10)),
    },
    "min_p": {"min_p": 0.05},
}


def closed_loop(
    engine: Engine, prompts: list[list[int]], options: dict[str, Any], *, clients: int, window_s: float
) -> tuple[float, float, float]:
    """``clients`` threads sending requests back to back for ``window_s``: (generated
    tokens per second, engine milliseconds per decoding step outside the forward pass,
    process CPU milliseconds per generated token)."""
    stop_at = time.monotonic() + window_s
    counted = [0] * clients
    steps0, step_s0, forward_s0 = engine.stats.steps, engine.stats.step_seconds, engine.stats.forward_seconds

    def client(k: int) -> None:
        i = k
        while time.monotonic() < stop_at:
            params = SamplingParams(max_tokens=128, temperature=0.7, seed=i, **options)
            handle = engine.submit(GenerationRequest(prompt_ids=prompts[i % len(prompts)], sampling=params))
            for delta in handle:
                if time.monotonic() <= stop_at:
                    counted[k] += len(delta.token_ids)
            i += clients

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    cpu0 = time.process_time()
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = min(time.monotonic(), stop_at) - started
    steps = max(engine.stats.steps - steps0, 1)
    off_forward = (engine.stats.step_seconds - step_s0) - (engine.stats.forward_seconds - forward_s0)
    cpu_ms = 1000 * (time.process_time() - cpu0) / max(sum(counted), 1)
    return sum(counted) / elapsed, 1000 * off_forward / steps, cpu_ms


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sides", nargs="+", default=["none", "logprobs"], choices=sorted(SIDES))
    parser.add_argument("--clients", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--window", type=float, default=10.0, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved repetitions of every side")
    args = parser.parse_args()
    loaded = load_model(quantize="int8-weights", progress=False)
    prompts = [chat_prompt_ids(loaded, q) for q in QUESTIONS]
    results: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    with Engine(loaded, config=EngineConfig(max_batch=8)) as engine:
        closed_loop(engine, prompts, {}, clients=2, window_s=2.0)  # warm-up
        for _ in range(args.rounds):
            for clients in args.clients:
                for side in args.sides:
                    got = closed_loop(engine, prompts, SIDES[side], clients=clients, window_s=args.window)
                    results.setdefault((side, clients), []).append(got)
    print(f"package: {Path(thinkstruct.__file__).resolve().parent}")
    print(f"{'side':<10} {'clients':>7} {'tok/s':>8} {'ms/step off-forward':>20} {'CPU ms/token':>13}")
    for (side, clients), runs in results.items():
        rate, off, cpu = (statistics.median(r[k] for r in runs) for k in range(3))
        print(f"{side:<10} {clients:>7} {rate:>8.1f} {off:>20.2f} {cpu:>13.2f}")


if __name__ == "__main__":
    main()
