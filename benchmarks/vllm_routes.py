"""Which way into vLLM: thinkstruct as a structured-output backend (the plugin's route)
against thinkstruct as a logits processor (vLLM's public per-request extension point,
``vllm_logits_route/route_processor.py``), on the embedded SmolLM2 in vLLM's CPU build.

Each route a vLLM server of its own, started for its turn and stopped after it, turns
interleaved round by round; per route: 8 closed-loop users asking for JSON (tokens per
second), and the first-token time of a request whose schema was never seen (a cold
compile) while those 8 users run (how long the new schema holds its own request up) and
the same users' tokens per second meanwhile. Thinking off, the same schema and prompts.
Never asserts; prints the medians, the ratios and the reproduce command.

    python benchmarks/vllm_routes.py [--rounds 2] [--window 60]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vllm_support import (
    PERSON,
    QUESTIONS,
    Server,
    chat_body,
    closed_loop,
    first_token_s,
    fresh_schema,
    vllm_server,
)

ROUTE_DIR = Path(__file__).resolve().parent / "vllm_logits_route"
PROCESSOR = "route_processor:GrammarLogitsProcessor"


def backend_body(server: Server, question: str, schema: dict[str, Any]) -> dict[str, Any]:
    return chat_body(server, question, schema=schema)


def processor_body(server: Server, question: str, schema: dict[str, Any]) -> dict[str, Any]:
    import json

    return {
        **chat_body(server, question, schema=None),
        "vllm_xargs": {"thinkstruct_json": json.dumps(schema)},
    }


async def cold_while_loaded(
    server: Server, window: float, body: Callable[[Server, str, dict[str, Any]], dict[str, Any]]
) -> tuple[float, float]:
    """(first-token seconds of a new schema, the 8 users' tok/s) with both at once."""
    load = asyncio.create_task(
        closed_loop(server, 8, window, lambda i: body(server, QUESTIONS[i % 8], PERSON))
    )
    await asyncio.sleep(window / 3)  # let the users reach a steady batch first
    cold = await first_token_s(server, body(server, QUESTIONS[0], fresh_schema()))
    return cold, (await load).tokens_per_s


def run_round(
    server: Server, window: float, body: Callable[[Server, str, dict[str, Any]], dict[str, Any]]
) -> dict[str, float]:
    asyncio.run(
        closed_loop(server, 1, 1.0, lambda i: body(server, QUESTIONS[0], PERSON))
    )  # start-up, not measured
    tps = asyncio.run(
        closed_loop(server, 8, window, lambda i: body(server, QUESTIONS[i % 8], PERSON))
    ).tokens_per_s
    cold, loaded_tps = asyncio.run(cold_while_loaded(server, window, body))
    figures = {
        "json 8 users tok/s": tps,
        "new schema first token ms": 1000 * cold,
        "8 users tok/s meanwhile": loaded_tps,
    }
    print(f"  {server.name:24s} " + ", ".join(f"{k} {v:.1f}" for k, v in figures.items()), flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--window", type=float, default=60.0)
    args = parser.parse_args()
    routes: list[tuple[str, Callable[[], Any], Callable[[Server, str, dict[str, Any]], dict[str, Any]]]] = [
        (
            "structured-output backend",
            lambda: vllm_server("thinkstruct", name="structured-output backend"),
            backend_body,
        ),
        (
            "logits processor",
            lambda: vllm_server(
                "xgrammar",
                extra=["--logits-processors", PROCESSOR],
                pythonpath=str(ROUTE_DIR),
                name="logits processor",
            ),
            processor_body,
        ),
    ]
    results: dict[str, list[dict[str, float]]] = {}
    for round_index in range(args.rounds):
        print(f"round {round_index + 1}", flush=True)
        for name, start, body in routes if round_index % 2 == 0 else reversed(routes):
            with start() as server:
                results.setdefault(name, []).append(run_round(server, args.window, body))
    medians = {
        name: {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
        for name, rounds in results.items()
    }
    for name, figures in medians.items():
        print(f"median {name}: " + ", ".join(f"{k} {v:.1f}" for k, v in figures.items()))
    backend, processor = medians["structured-output backend"], medians["logits processor"]
    print(
        "backend / processor: "
        + ", ".join(f"{k} {backend[k] / processor[k]:.2f}x" for k in backend if processor[k])
    )
    print("reproduce: python benchmarks/vllm_routes.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
