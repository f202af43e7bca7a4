"""How an engine replica streams a request's deltas (``replica.in_batches``), on a real
engine over the tiny model: every delta once and in order, the first never held, the end
never held however long the interval, and leaving early cancels the request."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "engine"))  # tiny_model
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))  # server_harness

from server_harness import start_engine, stop_engine

from thinkstruct.engine import GenerationRequest, SamplingParams
from thinkstruct.server.cluster.replica import in_batches


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tiny_model import build_tiny_model

    from thinkstruct.engine import load_model

    model = load_model(build_tiny_model(tmp_path_factory.mktemp("models")), dtype="float32", progress=False)
    engine = start_engine(model, warm=False, max_batch=4)
    yield engine
    stop_engine(engine)


def request(tokens: int) -> GenerationRequest:
    return GenerationRequest(
        prompt_ids=[5, 6, 7, 8], sampling=SamplingParams(max_tokens=tokens, temperature=0.0)
    )


async def batches_of(engine: Any, tokens: int, interval_s: float) -> list[list[Any]]:
    handle = engine.submit(request(tokens), loop=asyncio.get_running_loop())
    return [batch async for batch in in_batches(handle, interval_s=interval_s)]


@pytest.mark.parametrize("interval_s", [0.0, 0.01])
def test_every_delta_arrives_once_in_order(engine: Any, interval_s: float) -> None:
    alone = engine.submit(request(12)).wait()
    batches = asyncio.run(asyncio.wait_for(batches_of(engine, 12, interval_s), 120))
    deltas = [d for batch in batches for d in batch]
    assert all(batches)
    assert [d.finish_reason for d in deltas[:-1]] == [None] * (len(deltas) - 1)
    assert deltas[-1].finish_reason is not None
    assert [t for d in deltas for t in d.token_ids] == list(alone.token_ids)


def test_a_long_interval_holds_neither_the_first_delta_nor_the_end(engine: Any) -> None:
    # An hour between batches: the stream still ends as soon as the request does (the
    # deadline below is what a held end would miss), in the first batch and one more.
    alone = engine.submit(request(12)).wait()
    batches = asyncio.run(asyncio.wait_for(batches_of(engine, 12, 3600.0), 120))
    assert len(batches) <= 2
    assert batches[-1][-1].finish_reason is not None
    assert [t for batch in batches for d in batch for t in d.token_ids] == list(alone.token_ids)


def test_leaving_early_cancels_the_request(engine: Any) -> None:
    async def first_batch_only() -> Any:
        handle = engine.submit(request(400), loop=asyncio.get_running_loop())
        batches = in_batches(handle, interval_s=0.0)
        await anext(batches)
        await batches.aclose()
        return handle

    handle = asyncio.run(asyncio.wait_for(first_batch_only(), 120))
    assert handle.cancelled
