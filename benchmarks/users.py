"""Concurrent users against LLM servers over HTTP, one server against another, each alone
on the machine: for 1, 8, 32 and 64 users, free text and JSON answers (thinking off),
completion tokens per second, per-token latency p50/p99 and time to first token p50/p99.

Each user streams one chat completion after another (a question from a fixed list, the
same schema as ``ab_serve.py`` for JSON) until ``--duration`` seconds after the cell's
start; the requests running then finish. A cell's tokens/s (``tok/s``) is steady state:
the completion tokens inside the window from the cell's start until that deadline, while
every user is busy, over the window; a request's tokens count as if spread evenly over
its time from its first token to its end, in proportion to that time's overlap with the
window. ``cell tok/s`` is all the cell's completion tokens over the time from its start
until its last request ends (the tail after the deadline, when fewer users are busy,
lowers it: about 10 % at 32 users). Per-token latency is a request's time after its
first token over its tokens after the first; first token, the time from sending to the
first content; ``batch``, the server's batch limit (``thinkstruct_batch_limit``, NaN on
vLLM) as the cell ended. ``x NAME``, on the first side's row: its steady tok/s over
side NAME's.

A side is one server process, started alone, warmed up (one short request of each
answer), measured over every cell, and stopped before the next side starts; rounds
alternate the sides' order, and each figure is the median over rounds. The sides, in
this order: ``thinkstruct serve`` with the options of each ``--side NAME=OPTIONS`` (by
default this tree's defaults against the fixed batch of 8 it replaced); ``before``
(``--baseline-src PATH``): ``thinkstruct serve`` with this tree's defaults on another
tree's ``src`` (``PYTHONPATH=PATH``); ``vLLM`` (``--vllm``): vLLM's CPU build with its
xgrammar backend, from ``.venv-vllm`` (``make venv-vllm``), on the same model.

    python benchmarks/users.py [--users 1 8 32 64] [--duration 20] [--rounds 2] [--max-tokens 96]
        [--side "default=" --side "batch 8=--max-batch 8 --step-latency-target-ms 0"]
        [--baseline-src /tmp/old/src] [--vllm]
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
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from functools import partial
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


@dataclass(frozen=True)
class Request:
    """One request's times (``time.perf_counter`` seconds) and completion tokens."""

    sent: float
    #: When its first content came (``None``: none came).
    first: float | None
    done: float
    tokens: int

    def tokens_in(self, start: float, end: float) -> float:
        """Its tokens spread evenly over [first token, done]: the share inside [start, end]."""
        if self.first is None:
            return 0.0
        if self.done <= self.first:
            return float(self.tokens) if start <= self.first <= end else 0.0
        overlap = max(0.0, min(self.done, end) - max(self.first, start))
        return self.tokens * overlap / (self.done - self.first)


@dataclass
class Cell:
    """What one cell's requests measured."""

    started: float = 0.0
    #: When the users stopped sending: every user was busy from ``started`` until here.
    deadline: float = 0.0
    #: When its last request ended.
    ended: float = 0.0
    requests: list[Request] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: The server's batch limit (``thinkstruct_batch_limit``) when the cell ended.
    batch_limit: float = float("nan")

    def steady_rate(self) -> float:
        """Completion tokens/s while every user was busy: from the start until the deadline."""
        tokens = sum(r.tokens_in(self.started, self.deadline) for r in self.requests)
        return tokens / (self.deadline - self.started)

    def cell_rate(self) -> float:
        """Completion tokens/s from the start until the last request ended."""
        return sum(r.tokens for r in self.requests) / (self.ended - self.started)

    def per_token(self) -> list[float]:
        """Each request's seconds after its first token over its tokens after the first."""
        return [
            (r.done - r.first) / (r.tokens - 1) for r in self.requests if r.first is not None and r.tokens > 1
        ]

    def first_token(self) -> list[float]:
        return [r.first - r.sent for r in self.requests if r.first is not None]


@dataclass(frozen=True)
class Endpoint:
    """A started server: where it answers and the model name it serves."""

    url: str
    model: str


@dataclass(frozen=True)
class Side:
    """A server to measure: its name, what it is (for the report), and how to start it
    (stopped when the context ends)."""

    name: str
    about: str
    start: Callable[[], AbstractContextManager[Endpoint]]


@contextmanager
def serve_side(options: str, pythonpath: str | None = None) -> Iterator[Endpoint]:
    """``thinkstruct serve OPTIONS`` (``pythonpath``: another tree's ``src`` served instead)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_serve(port, *shlex.split(options), pythonpath=pythonpath)
    try:
        wait_healthy(url, proc)
        yield Endpoint(url, httpx.get(f"{url}/v1/models", timeout=60).json()["data"][0]["id"])
    finally:
        proc.terminate()
        proc.wait(timeout=60)


@contextmanager
def vllm_side() -> Iterator[Endpoint]:
    """vLLM's CPU build with its xgrammar backend, from ``.venv-vllm`` as ``make vllm-serve``
    starts it."""
    from vllm_support import vllm_server  # imports torch: only where a vLLM side runs

    with vllm_server("xgrammar") as server:
        yield Endpoint(server.url, server.model)


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
    cell.requests.append(Request(sent, first, time.perf_counter(), tokens))


async def run_cell(server: Endpoint, users: int, json_mode: bool, args: argparse.Namespace) -> Cell:
    started = time.perf_counter()
    cell = Cell(started=started, deadline=started + args.duration)

    async def user(i: int, http: httpx.AsyncClient) -> None:
        n = 0
        while time.perf_counter() < cell.deadline and not cell.errors:
            question = QUESTIONS[(i + n) % len(QUESTIONS)]
            await one_request(
                http, server.url, body(server.model, question, json_mode, args.max_tokens), cell
            )
            n += 1

    limits = httpx.Limits(max_connections=users + 4, max_keepalive_connections=users + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        await asyncio.gather(*(user(i, http) for i in range(users)))
    cell.ended = time.perf_counter()
    return cell


async def warm(server: Endpoint) -> None:
    """One request of each workload: the schema compiled, the kernels built."""
    async with httpx.AsyncClient(timeout=600) as http:
        for json_mode in (False, True):
            await one_request(http, server.url, body(server.model, QUESTIONS[0], json_mode, 8), Cell())


def run_side(side: Side, args: argparse.Namespace) -> dict[tuple[int, str], Cell]:
    """One side's server, alone: started, warmed up, every cell, then stopped."""
    with side.start() as server:
        asyncio.run(warm(server))
        cells = {}
        for users in args.users:
            for workload in WORKLOADS:
                cell = asyncio.run(run_cell(server, users, workload == "json", args))
                cell.batch_limit = batch_limit(server.url)
                print(
                    f"#   {side.name}: {users} users {workload}: {cell.steady_rate():.1f} tok/s steady, "
                    f"{cell.cell_rate():.1f} the whole cell, first token p99 "
                    f"{percentile(cell.first_token(), 0.99):.2f} s, batch {cell.batch_limit:.0f}",
                    flush=True,
                )
                if cell.errors:
                    raise RuntimeError(f"{side.name}, {users} users, {workload}: {cell.errors[0]}")
                cells[(users, workload)] = cell
        return cells


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


def over(a: float, b: float) -> float:
    """``a / b``, NaN where ``b`` is 0 (a side with no token inside the window)."""
    return a / b if b else float("nan")


def sides_of(args: argparse.Namespace) -> list[Side]:
    """``--side`` (or the default pair), then ``before`` (``--baseline-src``), then vLLM (``--vllm``)."""
    sides = [
        Side(name, f"serve {options or '(defaults)'}", partial(serve_side, options))
        for name, options in (s.split("=", 1) for s in (args.side or DEFAULT_SIDES))
    ]
    if args.baseline_src:
        src = str(Path(args.baseline_src).resolve())
        sides.append(Side("before", f"serve (defaults) from {src}", partial(serve_side, "", src)))
    if args.vllm:
        sides.append(Side("vLLM", "vLLM's CPU build, xgrammar", vllm_side))
    return sides


def report(names: list[str], results: dict[str, list[dict[tuple[int, str], Cell]]], users: list[int]) -> None:
    """A row a (users, answer, side): the medians over rounds, percentiles over every
    round's requests; on the first side's row, its steady tok/s over each other side's."""
    width = max(len(n) for n in names)
    ratios = [f"x {n}" for n in names[1:]]
    print(
        f"{'users':>5} {'answer':<6} {'side':<{width}} {'tok/s':>7} {'cell tok/s':>10} {'tpot p50':>9} "
        f"{'p99 ms':>7} {'ttft p50':>9} {'p99 s':>6} {'batch':>5}"
        + "".join(f" {r:>{len(r) + 2}}" for r in ratios)
    )
    for count in users:
        for workload in WORKLOADS:
            cells = {name: [c[(count, workload)] for c in results[name]] for name in names}
            steady = {name: statistics.median(c.steady_rate() for c in cells[name]) for name in names}
            for name in names:
                per_token = [x for c in cells[name] for x in c.per_token()]
                first = [x for c in cells[name] for x in c.first_token()]
                shares = [
                    f"{over(steady[name], steady[other]):.2f}" if name == names[0] else ""
                    for other in names[1:]
                ]
                print(
                    f"{count:>5} {workload:<6} {name:<{width}} {steady[name]:>7.1f} "
                    f"{statistics.median(c.cell_rate() for c in cells[name]):>10.1f} "
                    f"{percentile(per_token, 0.5) * 1e3:>9.1f} {percentile(per_token, 0.99) * 1e3:>7.1f} "
                    f"{percentile(first, 0.5):>9.2f} {percentile(first, 0.99):>6.2f} "
                    f"{statistics.median(c.batch_limit for c in cells[name]):>5.0f}"
                    + "".join(f" {v:>{len(r) + 2}}" for v, r in zip(shares, ratios))
                )


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
    parser.add_argument(
        "--baseline-src", help="another tree's src: a side 'before' serving it with this tree's defaults"
    )
    parser.add_argument("--vllm", action="store_true", help="a side 'vLLM': vLLM's CPU build, xgrammar")
    args = parser.parse_args()
    sides = sides_of(args)
    names = [side.name for side in sides]
    if len(set(names)) < len(names):
        parser.error(f"two sides share a name: {names}")
    results: dict[str, list[dict[tuple[int, str], Cell]]] = {name: [] for name in names}
    for r in range(args.rounds):
        for side in sides if r % 2 == 0 else reversed(sides):
            results[side.name].append(run_side(side, args))
            print(f"# round {r + 1}, {side.name} done (load average {os.getloadavg()[0]:.1f})", flush=True)
    described = "; ".join(f"{side.name}: {side.about}" for side in sides)
    print(f"# sides: {described}, {args.max_tokens} tokens at most an answer, {args.duration:g} s a cell")
    report(names, results, args.users)
    print("# python benchmarks/users.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]))


if __name__ == "__main__":
    main()
