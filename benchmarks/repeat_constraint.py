"""A repeated constraint over HTTP: how long its answer takes when the compiler already
knows it (a cached grammar, a remembered refusal, a remembered compile timeout), by the
constraint's size, beside the first request that compiled or refused it.

Starts ``thinkstruct serve`` (the embedded model, ``--compile-timeout 5``) as its own
process and sends each request as pre-serialized bytes with httpx, so the client's own
JSON work is not timed. Each request asks for one token: the time is the server's
reading, parsing and canonicalizing the request, the compile service's answer, and one
token (or the 400). Repeats: the median of ``--repeats`` requests, sent one at a time.
The floor is the same body refused by request validation (``max_tokens: -1``) before any
constraint work: reading and parsing that many bytes.

    python benchmarks/repeat_constraint.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import httpx

import alone

SIZES = (100, 10_000, 100_000)  # enum members: about 1 KB, 130 KB and 1.3 MB of schema


def _body(model: str, schema: dict[str, Any], **extra: Any) -> bytes:
    return json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": "Pick one."}],
            "max_tokens": 1,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
            **extra,
        }
    ).encode()


def _cases(n: int, tag: str) -> dict[str, Callable[[str], bytes]]:
    members = [f"{tag}-{n}-{i}" for i in range(n)]
    return {
        "cached grammar": lambda model: _body(model, {"enum": members}),
        "remembered refusal": lambda model: _body(
            model, {"type": "object", "properties": {"a": {"enum": members}, "b": {"$ref": "#/nowhere"}}}
        ),
        "remembered timeout": lambda model: _body(model, {"enum": members}, backend="xgrammar"),
    }


def _timed(client: httpx.Client, body: bytes) -> tuple[float, int]:
    start = time.perf_counter()
    response = client.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    return time.perf_counter() - start, response.status_code


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5)
    alone.add_arguments(parser)
    args = parser.parse_args()
    print(alone.header())
    port = alone.free_port()
    tag = f"r{os.getpid()}"  # constraints no other run of the server has seen
    serve = alone.thinkstruct_serve("--compile-timeout", "5", port=port)
    with alone.Server("serve", serve, port=port, rule=alone.quiet_rule(args)) as server:
        with httpx.Client(base_url=server.url, timeout=120) as client:
            model = client.get("/v1/models").json()["data"][0]["id"]
            print(
                f"{'case':<20} {'schema':>9} {'first':>14} {'repeat (median)':>16} {'ratio':>7} {'floor':>10}"
            )
            for n in SIZES:
                floor_body = _body(model, {"enum": [f"{tag}-{n}-{i}" for i in range(n)]}, max_tokens=-1)
                floor = statistics.median(_timed(client, floor_body)[0] for _ in range(args.repeats))
                for case, make in _cases(n, tag).items():
                    body = make(model)
                    if case == "remembered timeout" and n < SIZES[-1]:
                        continue  # small enums compile in time: nothing to remember
                    first, status = _timed(client, body)
                    repeats = [_timed(client, body) for _ in range(args.repeats)]
                    statuses = sorted({s for _, s in repeats} - {status})
                    median = statistics.median(t for t, _ in repeats)
                    print(
                        f"{case:<20} {len(body) / 1024:>7.0f} K {first * 1000:>9.0f} ms {status}"
                        f" {median * 1000:>13.1f} ms {first / median:>6.0f}x {floor * 1000:>7.1f} ms"
                        + (f"  (repeats answered {statuses} too)" if statuses else "")
                    )


if __name__ == "__main__":
    main()
