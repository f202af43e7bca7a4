"""The batch follows the load over HTTP: a real server on the tiny model with the default
``max_batch`` and a step latency target generous enough for a loaded machine; 16
concurrent streams all finish, and ``/metrics`` shows that the batch took more than the
8 rows it starts with (decoding steps of more than 8 rows ran)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_harness import RunningServer, serving, start_engine, stop_engine

from thinkstruct.engine.core.config import EngineConfig
from thinkstruct.engine.core.scheduler import START_ROWS
from thinkstruct.server import ServerSettings

STREAMS = 16
TOKENS = 120


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[RunningServer]:
    from thinkstruct.engine import load_model

    model = load_model(tiny_model_dir, quantize="int8-weights", progress=False)
    # Its regex compiles in process (llguidance): no compile worker to start ahead.
    engine = start_engine(model, warm=False, step_latency_target_s=1.0)
    try:
        with serving(engine, ServerSettings()) as running:
            yield running
    finally:
        stop_engine(engine)


def _gauge(http: httpx.Client, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", http.get("/metrics").text, re.M)
    assert match is not None, name
    return float(match.group(1))


def test_sixteen_streams_finish_in_a_batch_larger_than_it_starts(server: RunningServer) -> None:
    assert EngineConfig().max_batch >= STREAMS > START_ROWS
    client = server.async_openai()

    async def stream(i: int) -> tuple[str | None, int]:
        chunks = await client.chat.completions.create(
            model="tiny-deepseek-v4",
            messages=[{"role": "user", "content": f"count to {i}"}],
            max_tokens=TOKENS,
            temperature=1.0,
            seed=i,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"regex": "[a-z]{4000}"},  # no end before max_tokens
        )
        finish, tokens = None, 0
        async for chunk in chunks:
            if chunk.choices and chunk.choices[0].finish_reason is not None:
                finish = chunk.choices[0].finish_reason
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        return finish, tokens

    async def everyone() -> list[tuple[str | None, int]]:
        return await asyncio.gather(*(stream(i) for i in range(STREAMS)))

    results = asyncio.run(everyone())
    assert results == [("length", TOKENS)] * STREAMS
    with server.http() as http:
        assert _gauge(http, "thinkstruct_batch_size_max") > START_ROWS
        assert START_ROWS < _gauge(http, "thinkstruct_batch_limit") <= EngineConfig().max_batch
