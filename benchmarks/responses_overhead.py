"""The Responses API's translation overhead: time to first token of a ``/v1/responses``
stream over a ``/v1/chat/completions`` stream of the same request.

Starts ``thinkstruct serve`` (the embedded model) as its own process once the machine is
quiet (``alone.py``; both sides are requests to that one server) and sends, one at a
time and nothing else running, the same conversation through both endpoints, the two
sides alternating which goes first round by round. Each request's system prompt carries
a fresh nonce of the same length, so neither side finds the other's prompt in the prefix
cache: both prefill the same number of tokens cold. Time to first token is from sending
the request to the first event that carries generated text (chat: a chunk with
``reasoning_content`` or ``content``; responses: ``response.reasoning_text.delta`` or
``response.output_text.delta``), read with plain httpx so no client library's parsing is
measured. Thinking is on (the first token is the thought's), ``max_tokens`` small.

    python benchmarks/responses_overhead.py [--rounds 30] [--max-tokens 8]

Target: the Responses median within 5 % of chat's (ratio <= 1.05).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

import alone

QUESTION = "List three things a lighthouse keeper does each night, and say why each matters."


def _system() -> str:
    return f"Session {uuid.uuid4().hex}. You are a careful assistant; answer in full sentences."


def _first_token(
    http: httpx.Client, path: str, body: dict[str, Any], carries_text: Callable[[str], bool]
) -> float:
    """Seconds from sending ``body`` to the first SSE line that ``carries_text``; the rest
    of the stream is read before returning, so the next request starts alone."""
    started = time.perf_counter()
    with http.stream("POST", path, json=body) as response:
        lines = response.iter_lines()
        for line in lines:
            if carries_text(line):
                elapsed = time.perf_counter() - started
                for _ in lines:
                    pass
                return elapsed
    raise RuntimeError(f"the {path} stream ended without text")


def _chat_text(line: str) -> bool:
    if not line.startswith("data: {"):
        return False
    chunk: dict[str, Any] = json.loads(line[6:])
    deltas = [choice.get("delta", {}) for choice in chunk.get("choices", [])]
    return any(d.get("reasoning_content") or d.get("content") for d in deltas)


def chat_first_token(http: httpx.Client, model: str, max_tokens: int) -> float:
    body = {
        "model": model,
        "messages": [{"role": "system", "content": _system()}, {"role": "user", "content": QUESTION}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    return _first_token(http, "/v1/chat/completions", body, _chat_text)


def responses_first_token(http: httpx.Client, model: str, max_tokens: int) -> float:
    body = {
        "model": model,
        "instructions": _system(),
        "input": QUESTION,
        "max_output_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    deltas = ("event: response.reasoning_text.delta", "event: response.output_text.delta")
    return _first_token(http, "/v1/responses", body, lambda line: line in deltas)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3, help="rounds of both sides not counted")
    alone.add_arguments(parser)
    args = parser.parse_args()
    print(alone.header())
    port = alone.free_port()
    with alone.Server(
        "serve", alone.thinkstruct_serve(port=port), port=port, rule=alone.quiet_rule(args)
    ) as server:
        with httpx.Client(base_url=server.url, timeout=300.0) as http:
            model = http.get("/v1/models").json()["data"][0]["id"]
            sides = {"chat": chat_first_token, "responses": responses_first_token}
            times: dict[str, list[float]] = {name: [] for name in sides}
            for round_ in range(args.warmup + args.rounds):
                order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
                for name in order:
                    elapsed = sides[name](http, model, args.max_tokens)
                    if round_ >= args.warmup:
                        times[name].append(elapsed)
    chat, responses = (statistics.median(times[name]) for name in ("chat", "responses"))
    for name, values in times.items():
        ordered = sorted(values)
        p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
        print(
            f"{name:>10}: first token median {statistics.median(values) * 1e3:7.1f} ms, p90 {p90 * 1e3:7.1f} ms ({len(values)} requests)"
        )
    print(f"responses / chat first-token time (medians): {responses / chat:.3f}x (target <= 1.05)")
    print(alone.summary([server.record]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
