"""thinkstruct and vLLM's CPU build, side by side, on the embedded SmolLM2-135M-Instruct.

Three parts; in (a) and (b) each side is a server process of its own, started for its
turn and stopped after it (nothing else of the project alive meanwhile), turns
interleaved round by round:

(a) ``serve``: thinkstruct's own server (``thinkstruct serve``) against vLLM with its
    xgrammar backend, thinking off, over HTTP: tokens per second with 1, 8 and 32
    closed-loop users (each sends its next request when one finishes), free text and
    JSON (a schema), counted from the ``usage`` of the requests that finish in the window.
(b) ``backends``: inside vLLM, the thinkstruct backend (strict) against vLLM's xgrammar
    and guidance backends (all three writing compact JSON): 8-user JSON tokens per
    second; time to first token of a schema never seen (a fresh property name each time,
    so nothing is cached); a JSONSchemaBench sample (``maskbench_sample``), one request
    per schema (thinking off, greedy): refused (4xx), failed (5xx), finished answers
    valid or invalid against their schema, answers cut by ``max_tokens``; and the
    embedded model thinking: requests with thinking on, counted when the reply has a
    thought and a valid answer.
(c) ``coverage``: no server: the whole JSONSchemaBench sample through the plugin's compile
    service as vLLM's processes build it (strict ``auto``, SmolLM2's tokenizer): compiled
    exactly, enforced at closing tokens, refused (and by which keyword).

Prints each round's figures, then the medians per side and the ratios the targets are
stated in, and the command that reproduces the run. Never asserts.

    python benchmarks/vllm.py [--parts serve backends coverage] [--rounds 2] [--window 60]
        [--users 1 8 32] [--sample 40] [--thinking 5]

vLLM runs from ``.venv-vllm`` (``make venv-vllm``), as ``make vllm-serve`` starts it.
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

from maskbench_sample import load_maskbench, sample_schemas
from vllm_support import (
    PERSON,
    QUESTIONS,
    VLLM_PYTHON,
    Server,
    chat_body,
    closed_loop,
    conformance,
    first_token_s,
    fresh_schema,
    thinking,
    thinkstruct_server,
    vllm_server,
    warm_up,
)

#: vLLM's flag for JSON without whitespace (xgrammar and guidance).
COMPACT = ("--structured-outputs-config.disable_any_whitespace", "true")


def run_coverage() -> None:
    import collections

    from thinkstruct import InvalidConstraint
    from thinkstruct.grammar.constraint import Constraint
    from thinkstruct.integrations.vllm.service import PluginCompiler
    from thinkstruct.integrations.vllm.settings import PluginSettings
    from thinkstruct.tokenizer import smollm2_gguf_path

    service = PluginCompiler(str(smollm2_gguf_path()), 49152, PluginSettings())
    exact = closing = 0
    refused: collections.Counter[str] = collections.Counter()
    schemas = load_maskbench(with_valid_instances=False)
    for entry in schemas:
        try:
            compiled = service.compile(Constraint.json_schema(entry.schema))
        except InvalidConstraint as error:
            message = str(error)
            refused[
                "not enforceable without undo" if "inside vLLM" in message else "refused by thinkstruct"
            ] += 1
            continue
        if compiled.checks is None:
            exact += 1
        else:
            closing += 1
    service.close()
    total = len(schemas)
    print(
        f"(c) coverage, strict, {total} schemas: exact {exact}, enforced at closing tokens {closing}, "
        f"refused {sum(refused.values())} ({100 * sum(refused.values()) / total:.1f} %: "
        + ", ".join(f"{k} {v}" for k, v in refused.items())
        + ")",
        flush=True,
    )


def run_serve_round(server: Server, users: list[int], window: float) -> dict[str, float]:
    warm_up(server)
    figures = {}
    for mode in ("free", "json"):
        schema = PERSON if mode == "json" else None
        for n in users:
            tps = asyncio.run(
                closed_loop(
                    server,
                    n,
                    window,
                    lambda i, s=schema: chat_body(server, QUESTIONS[i % len(QUESTIONS)], schema=s),
                )
            )
            figures[f"{mode} {n} users tok/s"] = tps.tokens_per_s
            print(f"  {server.name:20s} {mode:4s} {n:3d} users: {tps.line()}", flush=True)
    return figures


def run_backend_round(server: Server, window: float, sample: list[Any], thoughts: int) -> dict[str, Any]:
    warm_up(server)
    tps = asyncio.run(
        closed_loop(
            server, 8, window, lambda i: chat_body(server, QUESTIONS[i % len(QUESTIONS)], schema=PERSON)
        )
    )
    ttft = statistics.median(
        asyncio.run(first_token_s(server, chat_body(server, QUESTIONS[0], schema=fresh_schema())))
        for _ in range(3)
    )
    print(
        f"  {server.name:20s} json 8 users: {tps.line()}; first token of a new schema {1000 * ttft:7.0f} ms",
        flush=True,
    )
    figures: dict[str, Any] = {
        "json 8 users tok/s": tps.tokens_per_s,
        "first token of a new schema ms": 1000 * ttft,
    }
    if sample:
        counts = asyncio.run(conformance(server, sample))
        print(f"  {server.name:20s} JSONSchemaBench sample: {counts.line()}", flush=True)
        figures["conformance"] = counts
    if thoughts:
        good, count = asyncio.run(thinking(server, thoughts))
        print(f"  {server.name:20s} thinking: {good}/{count} with a thought and a valid answer", flush=True)
        figures["thinking"] = f"{good}/{count}"
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=("serve", "backends", "coverage"),
        default=["serve", "backends", "coverage"],
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--window", type=float, default=60.0, help="seconds of each closed-loop measurement")
    parser.add_argument("--users", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument(
        "--sample", type=int, default=40, help="JSONSchemaBench schemas per backend (0: none)"
    )
    parser.add_argument("--thinking", type=int, default=5, help="thinking requests per backend (0: none)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not VLLM_PYTHON.is_file():
        raise SystemExit(f"{VLLM_PYTHON} is missing: run `make venv-vllm`")
    sample = sample_schemas(load_maskbench(), count=args.sample, seed=args.seed) if args.sample else []
    if "coverage" in args.parts:
        run_coverage()
    results: dict[str, list[dict[str, Any]]] = {}
    for round_index in range(args.rounds):
        print(f"round {round_index + 1}", flush=True)
        if "serve" in args.parts:
            sides: list[tuple[str, Callable[[], Any]]] = [
                ("thinkstruct serve", thinkstruct_server),
                ("vLLM xgrammar", lambda: vllm_server("xgrammar")),
            ]
            for name, start in sides if round_index % 2 == 0 else reversed(sides):
                with start() as server:
                    results.setdefault(f"(a) {name}", []).append(
                        run_serve_round(server, args.users, args.window)
                    )
        if "backends" in args.parts:
            backends = ["thinkstruct", "xgrammar", "guidance"]
            for backend in backends if round_index % 2 == 0 else reversed(backends):
                # Compact JSON from every backend (thinkstruct's is compact inside vLLM), so
                # that each side writes answers of the same length.
                compact = () if backend == "thinkstruct" else COMPACT
                with vllm_server(backend, extra=compact) as server:
                    results.setdefault(f"(b) vLLM {backend}", []).append(
                        run_backend_round(server, args.window, sample, args.thinking)
                    )
    print("\nmedians over rounds")
    medians: dict[str, dict[str, float]] = {}
    for side, rounds in results.items():
        numbers = {
            k: statistics.median(r[k] for r in rounds) for k in rounds[0] if isinstance(rounds[0][k], float)
        }
        medians[side] = numbers
        print(f"  {side}: " + ", ".join(f"{k} {v:.1f}" for k, v in numbers.items()))
    a, b = medians.get("(a) thinkstruct serve"), medians.get("(a) vLLM xgrammar")
    if a and b:
        print(
            "(a) thinkstruct serve / vLLM xgrammar: "
            + ", ".join(f"{k.removesuffix(' tok/s')} {a[k] / b[k]:.2f}x" for k in a)
        )
    t, x = medians.get("(b) vLLM thinkstruct"), medians.get("(b) vLLM xgrammar")
    if t and x:
        print(
            f"(b) thinkstruct backend / xgrammar backend, 8 users JSON: {t['json 8 users tok/s'] / x['json 8 users tok/s']:.2f}x (target >= 0.95x)"
        )
    print("reproduce: python benchmarks/vllm.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
