"""Two ``thinkstruct serve`` over HTTP: this tree against another source tree (the same
code before a change, say), each side alone on the machine, the sides alternating round
by round.

Each side is its own process on the embedded model (the other tree's code through
``PYTHONPATH``, the same virtual environment), started for its round after the machine
is quiet and stopped, with everything it started, before the other side's (``alone.py``);
after start it answers one JSON request unmeasured (its schema compiled). Per round and
side, with thinking off and ``max_tokens`` fixed:

- ``1 free`` / ``1 json``: one client sending requests back to back (a chat question;
  the same question answered to a JSON schema);
- ``8 free`` / ``8 json``: eight clients at once.

Tokens/s counts completion tokens over the wall time of the round's requests. Each cell is
the median over rounds; the ratio is this tree over the other. Prints a table and asserts
nothing.

    python benchmarks/ab_serve.py --baseline-src ../other/src [--rounds 3] [--requests 6]
        [--args "--quantize int8-weights"] [--baseline-args "..."]
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

import alone

QUESTION = "Name three primary colors and say which one you like best, in one sentence."
SCHEMA = {
    "type": "object",
    "properties": {
        "colors": {
            "type": "array",
            "items": {"type": "string", "maxLength": 12},
            "minItems": 3,
            "maxItems": 3,
        },
        "favorite": {"type": "string", "maxLength": 12},
        "why": {"type": "string", "maxLength": 200},
    },
    "required": ["colors", "favorite", "why"],
    "additionalProperties": False,
}
WORKLOADS = (("1 free", 1, False), ("1 json", 1, True), ("8 free", 8, False), ("8 json", 8, True))


def body(model: str, json_mode: bool, max_tokens: int) -> dict[str, object]:
    out: dict[str, object] = {
        "model": model,
        "messages": [{"role": "user", "content": QUESTION}],
        "max_tokens": max_tokens,
        "temperature": 0.7,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    if json_mode:
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}
    return out


def run(url: str, clients: int, json_mode: bool, requests: int, max_tokens: int) -> float:
    """Completion tokens per second of ``clients`` clients sending ``requests`` each."""
    tokens = [0] * clients
    errors: list[str] = []
    model = httpx.get(f"{url}/v1/models", timeout=60).json()["data"][0]["id"]

    def client(i: int) -> None:
        with httpx.Client(timeout=600) as http:
            for _ in range(requests):
                reply = http.post(f"{url}/v1/chat/completions", json=body(model, json_mode, max_tokens))
                if reply.status_code != 200:
                    errors.append(reply.text[:300])
                    return
                tokens[i] += reply.json()["usage"]["completion_tokens"]

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"{url}: {errors[0]}")
    return sum(tokens) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--baseline-src", required=True, help="the other tree's src directory")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=6, help="requests per client per workload and round")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--args", default="", help="serve options of this tree, one string")
    parser.add_argument("--baseline-args", default=None, help="the other tree's (default: --args)")
    alone.add_arguments(parser)
    options = parser.parse_args()
    this_args = shlex.split(options.args)
    baseline_args = this_args if options.baseline_args is None else shlex.split(options.baseline_args)
    sides = {"this": (None, this_args), "baseline": (options.baseline_src, baseline_args)}
    print(alone.header())
    cells: dict[tuple[str, str], list[float]] = {}
    runs: list[alone.Run] = []
    for r in range(options.rounds):
        for name in alone.rotation(list(sides), r):
            src, args = sides[name]
            port = alone.free_port()
            env = {"OMP_WAIT_POLICY": "PASSIVE", **({"PYTHONPATH": src} if src is not None else {})}
            server = alone.Server(
                name,
                alone.thinkstruct_serve(*args, port=port),
                port=port,
                rule=alone.quiet_rule(options),
                env=env,
            )
            with server:
                run(server.url, 1, True, 1, options.max_tokens)  # warm: compile the schema once
                for label, clients, json_mode in WORKLOADS:
                    rate = run(server.url, clients, json_mode, options.requests, options.max_tokens)
                    cells.setdefault((label, name), []).append(rate)
            runs.append(server.record)
        print(alone.round_report(r + 1, runs[-len(sides) :]), flush=True)
    print(f"this tree {this_args or '(defaults)'} vs {options.baseline_src} {baseline_args or '(defaults)'}")
    for label, _, _ in WORKLOADS:
        this = statistics.median(cells[(label, "this")])
        base = statistics.median(cells[(label, "baseline")])
        print(f"{label:7s} this {this:7.1f} tok/s | baseline {base:7.1f} tok/s | ratio {this / base:.2f}")
    print(alone.summary(runs))


if __name__ == "__main__":
    main()
