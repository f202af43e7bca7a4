"""Concurrent users against ``thinkstruct serve`` over HTTP, one server configuration against
another, each alone on the machine: for 1, 8, 32 and 64 users, free text and JSON answers
(thinking off), completion tokens per second, per-token latency p50/p99 and time to
first token p50/p99.

Each user streams one chat completion after another (a question from a fixed list, the
same schema as ``ab_serve.py`` for JSON) for ``--duration`` seconds a cell; a cell's
tokens/s is the completion tokens of its requests over the time from its start until
its last request ends. Per-token latency is a request's time after its first token over
its tokens after the first; first token, the time from sending to the first content;
``batch``, the server's batch limit (``thinkstruct_batch_limit``) as the cell ended.

A side is one ``thinkstruct serve`` process (its options in ``--side NAME=OPTIONS``; by
default this tree's defaults against the fixed batch of 8 it replaced), started alone,
warmed up, measured over every cell, and stopped before the next side starts; rounds
alternate the sides' order, and each figure is the median over rounds.

    python benchmarks/users.py [--users 1 8 32 64] [--duration 20] [--rounds 2] [--max-tokens 96]
        [--side "default=" --side "batch 8=--max-batch 8 --step-latency-target-ms 0"]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ab_serve import SCHEMA
from serve_process import free_port, start_serve, wait_healthy

QUESTIONS = [
    "Name three primary colors and say which one you like best, in one sentence.",
    "Describe the sea in two sentences.",
    "Give me a short tip for learning to cook.",
    "Suggest three names for a cat and say why.",
    "What do bees make, and how?",
    "Explain what a prime number is to a child.",
    "Say hello in three languages.",
    "Describe a sunny day in the park.",
]
WORKLOADS = ("free", "json")
DEFAULT_SIDES = ["default=", "batch 8=--max-batch 8 --step-latency-target-ms 0"]


@dataclass
class Cell:
    """What one cell's requests measured."""

    tokens: int = 0
    seconds: float = 0.0
    per_token: list[float] = field(default_factory=list)
    first_token: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: The server's batch limit (``thinkstruct_batch_limit``) when the cell ended.
    batch_limit: float = float("nan")


def body(model: str, question: str, json_mode: bool, max_tokens: int) -> dict[str, object]:
    out: dict[str, object] = {
        "model": model,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0.7,
        "stream": True,
        "stream_options": {"include_usage": True},
        "chat_template_kwargs": {"enable_thinking": False},
    }
    if json_mode:
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}
    return out


async def one_request(http: httpx.AsyncClient, url: str, payload: dict[str, object], cell: Cell) -> None:
    sent = time.perf_counter()
    first: float | None = None
    tokens = 0
    async with http.stream("POST", f"{url}/v1/chat/completions", json=payload) as reply:
        if reply.status_code != 200:
            cell.errors.append(f"{reply.status_code} {(await reply.aread())[:200]!r}")
            return
        async for line in reply.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                first = time.perf_counter()
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    done = time.perf_counter()
    cell.tokens += tokens
    if first is not None:
        cell.first_token.append(first - sent)
        if tokens > 1:
            cell.per_token.append((done - first) / (tokens - 1))


async def run_cell(url: str, model: str, users: int, json_mode: bool, args: argparse.Namespace) -> Cell:
    cell = Cell()
    started = time.perf_counter()
    deadline = started + args.duration

    async def user(i: int, http: httpx.AsyncClient) -> None:
        n = 0
        while time.perf_counter() < deadline and not cell.errors:
            question = QUESTIONS[(i + n) % len(QUESTIONS)]
            await one_request(http, url, body(model, question, json_mode, args.max_tokens), cell)
            n += 1

    limits = httpx.Limits(max_connections=users + 4, max_keepalive_connections=users + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        await asyncio.gather(*(user(i, http) for i in range(users)))
    cell.seconds = time.perf_counter() - started
    return cell


async def warm(url: str, model: str) -> None:
    """One request of each workload: the schema compiled, the kernels built."""
    async with httpx.AsyncClient(timeout=600) as http:
        for json_mode in (False, True):
            await one_request(http, url, body(model, QUESTIONS[0], json_mode, 8), Cell())


def run_side(options: str, args: argparse.Namespace) -> dict[tuple[int, str], Cell]:
    """One server with ``options``, alone: every cell, then stopped."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_serve(port, *shlex.split(options))
    try:
        wait_healthy(url, proc)
        model = httpx.get(f"{url}/v1/models", timeout=60).json()["data"][0]["id"]
        asyncio.run(warm(url, model))
        cells = {}
        for users in args.users:
            for workload in WORKLOADS:
                cells[(users, workload)] = asyncio.run(run_cell(url, model, users, workload == "json", args))
                cell = cells[(users, workload)]
                cell.batch_limit = batch_limit(url)
                print(
                    f"#   {options or '(defaults)'}: {users} users {workload}: {cell.tokens / cell.seconds:.1f} tok/s, "
                    f"first token p99 {percentile(cell.first_token, 0.99):.2f} s, batch {cell.batch_limit:.0f}",
                    flush=True,
                )
                if cells[(users, workload)].errors:
                    raise RuntimeError(
                        f"{options!r}, {users} users, {workload}: {cells[(users, workload)].errors[0]}"
                    )
        return cells
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def batch_limit(url: str) -> float:
    """The server's ``thinkstruct_batch_limit`` gauge (NaN where it has none)."""
    for line in httpx.get(f"{url}/metrics", timeout=60).text.splitlines():
        if line.startswith("thinkstruct_batch_limit "):
            return float(line.split()[1])
    return float("nan")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--users", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of requests a cell")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument(
        "--side", action="append", default=None, help="NAME=SERVE OPTIONS (repeatable; default: %(default)s)"
    )
    args = parser.parse_args()
    sides = dict(s.split("=", 1) for s in (args.side or DEFAULT_SIDES))
    results: dict[str, list[dict[tuple[int, str], Cell]]] = {name: [] for name in sides}
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for name in order:
            results[name].append(run_side(sides[name], args))
            print(f"# round {r + 1}, {name} done (load average {os.getloadavg()[0]:.1f})", flush=True)
    names = list(sides)
    described = "; ".join(f"{n}: serve {o or '(defaults)'}" for n, o in sides.items())
    print(f"# sides: {described}, {args.max_tokens} tokens at most an answer, {args.duration:g} s a cell")
    print(
        f"{'users':>5} {'answer':<6} {'side':<10} {'tok/s':>7} {'tpot p50':>9} {'p99 ms':>7} "
        f"{'ttft p50':>9} {'p99 s':>6} {'batch':>5}  {'tok/s x ' + names[-1]:>12}"
    )
    for users in args.users:
        for workload in WORKLOADS:
            base = statistics.median(
                c[(users, workload)].tokens / c[(users, workload)].seconds for c in results[names[-1]]
            )
            for name in names:
                cells = [c[(users, workload)] for c in results[name]]
                rate = statistics.median(c.tokens / c.seconds for c in cells)
                per_token = [x for c in cells for x in c.per_token]
                first = [x for c in cells for x in c.first_token]
                print(
                    f"{users:>5} {workload:<6} {name:<10} {rate:>7.1f} {percentile(per_token, 0.5) * 1e3:>9.1f} "
                    f"{percentile(per_token, 0.99) * 1e3:>7.1f} {percentile(first, 0.5):>9.2f} "
                    f"{percentile(first, 0.99):>6.2f} {statistics.median(c.batch_limit for c in cells):>5.0f}  "
                    f"{rate / base:>12.2f}"
                )
    print("# python benchmarks/users.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]))


if __name__ == "__main__":
    main()
