"""Isolation: one tenant's slow compiles never hold up another tenant's request, nor the
batch that is generating.

Sixteen requests carry schemas that are slow to compile but bounded: ``allOf`` of three
29-way ``anyOf`` lists, which llguidance compiles by intersecting them (24,389
intersections, about 8 s on 2 cores; bounded by llguidance's own "schema too large"
limit). They go to the killable llguidance worker, one at a time, each until the server's
short compile timeout (``short_timeout_server``: 5 s). Before the fix that sends such
schemas to the worker, they ran on the four in-process compile threads, and a simple
request's compile waited behind them until its own deadline.

No wall-clock assertion: the test checks order and progress (the simple request is
answered while every slow one is still compiling; the engine's step counter and a
generating stream advance while they compile). The simple request's time to first
token is printed for the record (``pytest -s``).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import openai
from server_harness import RunningServer

from polling import wait_until_async

SLOW_REQUESTS = 16


def _slow_schema(i: int) -> dict[str, Any]:
    # Each its own cache key (the letter), so sixteen compiles, not one shared.
    letter = chr(ord("a") + i)
    alternatives = {"anyOf": [{"type": "string", "pattern": f"^{letter}{{{n}}}$"} for n in range(1, 30)]}
    return {"allOf": [alternatives, alternatives, alternatives]}


def _format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def test_slow_compiles_hold_up_neither_a_simple_request_nor_the_batch(
    short_timeout_server: RunningServer,
) -> None:
    server = short_timeout_server
    engine = server.state.engine
    compiler = engine.compiler
    compiler.warm_up(("llguidance",), timeout_s=120.0)  # the scenario starts with its worker ready
    model = server.state.model_name
    messages = [{"role": "user", "content": "hi"}]
    # A fresh schema (a new property name), so it is compiled now, not found in the cache.
    simple = {"type": "object", "properties": {f"k{uuid.uuid4().hex[:8]}": {"type": "integer"}}}

    async def scenario() -> dict[str, Any]:
        client = server.async_openai(timeout=120.0)
        seen: dict[str, Any] = {"slow": [], "stream_chunks": 0}

        # The batch: a long free-text answer, streaming while everything else happens.
        long_stream = await client.chat.completions.create(
            model=model, messages=messages, max_tokens=2000, stream=True, seed=1
        )

        async def read_long() -> None:
            async for _ in long_stream:
                seen["stream_chunks"] += 1

        reader = asyncio.ensure_future(read_long())
        await wait_until_async(lambda: seen["stream_chunks"] >= 2, "the long answer streaming")

        async def slow(i: int) -> None:
            try:
                await client.chat.completions.create(
                    model=model, messages=messages, max_tokens=2, response_format=_format(_slow_schema(i))
                )
                seen["slow"].append((time.monotonic(), 200, None))
            except openai.APIStatusError as e:
                seen["slow"].append((time.monotonic(), e.status_code, e.code))

        misses = compiler.stats.misses
        slow_tasks = [asyncio.ensure_future(slow(i)) for i in range(SLOW_REQUESTS)]
        await wait_until_async(
            lambda: compiler.stats.misses >= misses + SLOW_REQUESTS, "all slow compiles started"
        )
        seen["steps_in_flight"] = engine.stats.steps
        seen["chunks_in_flight"] = seen["stream_chunks"]

        sent = time.monotonic()
        answer = await client.chat.completions.create(
            model=model, messages=messages, max_tokens=4, seed=3, response_format=_format(simple), stream=True
        )
        async for chunk in answer:
            if chunk.choices and chunk.choices[0].delta.content:
                seen.setdefault("first_token", time.monotonic())
                seen.setdefault("slow_done_at_first_token", len(seen["slow"]))
                seen.setdefault("first_token_s", time.monotonic() - sent)
            if chunk.choices and chunk.choices[0].finish_reason:
                seen["simple_finish"] = chunk.choices[0].finish_reason
        seen["slow_done_at_simple_end"] = len(seen["slow"])

        # Progress while the slow ones compile: up to the first of them answering.
        await wait_until_async(lambda: bool(seen["slow"]), "a slow request answered")
        seen["steps_at_first_slow"] = engine.stats.steps
        seen["chunks_at_first_slow"] = seen["stream_chunks"]
        await asyncio.gather(*slow_tasks)
        reader.cancel()  # closes the stream: the server cancels the long request
        await long_stream.close()
        await client.close()
        return seen

    seen = asyncio.run(scenario())
    summary = {k: v for k, v in seen.items() if k != "slow"}
    print(f"\nisolation: {json.dumps(summary)}; slow answers: {sorted({(s, c) for _, s, c in seen['slow']})}")
    # Seeded, on a batch-invariant engine: the same ending beside the long answer as alone.
    assert engine.runner.batch_invariant
    assert "first_token" in seen and seen["simple_finish"] == "length", seen
    # The simple request got its first token, and its whole answer, while every slow
    # compile was still running or queued.
    assert seen["slow_done_at_first_token"] == 0
    assert seen["slow_done_at_simple_end"] == 0
    # The batch kept stepping and streaming while they compiled.
    assert seen["steps_at_first_slow"] > seen["steps_in_flight"] + 5
    assert seen["chunks_at_first_slow"] > seen["chunks_in_flight"] + 5
    # Each slow request was answered: compiled in time (a fast machine) or a clear timeout.
    assert len(seen["slow"]) == SLOW_REQUESTS
    for _, status, code in seen["slow"]:
        assert (status, code) in ((200, None), (400, "grammar_compile_timeout")), (status, code)
    with server.http() as http:
        assert http.get("/health").status_code == 200
