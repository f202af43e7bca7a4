"""A short, bounded version of ``benchmarks/load.py`` on the tiny model: many concurrent
streaming clients mixing JSON-schema answers, plain chat, reasoning, FIM and hostile
requests. Every request gets an answer (a finished stream or a 4xx error object), none a
5xx, every schema answer that ended with ``stop`` validates, and the server is healthy
after. The load runs for a fixed number of seconds; nothing here asserts on a time.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
from server_harness import RunningServer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import load  # benchmarks/load.py: the same request mix and checks

CLIENTS = 16
SECONDS = 8.0
SCHEMAS = [
    {
        "type": "object",
        "properties": {"answer": {"type": "integer"}, "sure": {"type": "boolean"}},
        "required": ["answer", "sure"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 1, "maxItems": 3},
    {"type": "string", "enum": ["red", "green", "blue"]},
    {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "tags": {"type": "array", "maxItems": 2}},
        "required": ["name"],
    },
]


async def _load(url: str, model: str) -> tuple[list[load.Result], int]:
    limits = httpx.Limits(max_connections=CLIENTS + 4, max_keepalive_connections=CLIENTS + 4)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=httpx.Timeout(120.0)) as client:
        results: list[load.Result] = []
        stop_at = time.monotonic() + SECONDS
        await asyncio.gather(
            *(load.client_loop(k, client, stop_at, SCHEMAS, model, results) for k in range(CLIENTS))
        )
        health = (await client.get("/health")).status_code
    return results, health


def test_concurrent_mixed_load_answers_everything_and_never_5xx(tiny_server: RunningServer) -> None:
    model = httpx.get(f"{tiny_server.url}/v1/models").json()["data"][0]["id"]
    results, health = asyncio.run(_load(tiny_server.url, model))
    kinds = Counter(r.kind.split(":")[0] for r in results)
    assert {"schema", "chat", "hostile"} <= set(kinds), kinds
    assert [r for r in results if r.status < 0 or r.status >= 500] == []
    assert [(r.kind, r.status, r.detail) for r in results if not r.answered] == []
    assert all(400 <= r.status < 500 for r in results if r.kind.startswith("hostile"))
    schema_answers = [r for r in results if r.kind == "schema" and r.status == 200]
    assert schema_answers, kinds
    assert [r.detail for r in schema_answers if r.finish == "stop" and not r.valid] == []
    assert health == 200
