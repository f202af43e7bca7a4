"""How replicas stream deltas (``outbox``), on a real engine over the tiny model: each
request of one ingress gets every delta once and in order from streams they share (one
step's deltas of several requests ride on one item), its own stream ends with all of them, the end is
never held however long the interval, and leaving early cancels the request. At the
ingress, ``DeltaOrder`` puts any arrival order with repeats back in order."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "engine"))  # tiny_model
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))  # server_harness

from server_harness import start_engine, stop_engine

from polling import wait_until_async
from thinkstruct.engine import Delta, GenerationRequest, SamplingParams
from thinkstruct.engine.core.handle import RequestHandle
from thinkstruct.server.cluster.outbox import DeltaOrder, Entry, Outbox, stream_request


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tiny_model import build_tiny_model

    from thinkstruct.engine import load_model

    model = load_model(build_tiny_model(tmp_path_factory.mktemp("models")), dtype="float32", progress=False)
    engine = start_engine(model, warm=False, max_batch=4)
    yield engine
    stop_engine(engine)


def request(tokens: int, first: int) -> GenerationRequest:
    return GenerationRequest(
        prompt_ids=[first, 6, 7, 8], sampling=SamplingParams(max_tokens=tokens, temperature=0.0)
    )


async def shared_streams(
    engine: Any, requests: list[GenerationRequest], interval_s: float
) -> list[list[list[Entry]]]:
    """Each request's stream (all on one outbox), read concurrently to their ends."""
    outbox = Outbox()
    loop = asyncio.get_running_loop()

    async def read(r: GenerationRequest) -> list[list[Entry]]:
        handle = engine.submit(r, loop=loop)
        return [
            item
            async for item in stream_request(handle, outbox, request_id=r.request_id, interval_s=interval_s)
        ]

    return list(await asyncio.gather(*(read(r) for r in requests)))


@pytest.mark.parametrize("interval_s", [0.0, 0.01])
def test_shared_streams_give_each_request_every_delta_once_in_order(engine: Any, interval_s: float) -> None:
    requests = [request(12, first) for first in (5, 9, 13, 17)]
    alone = {
        r.request_id: list(engine.submit(request(12, r.prompt_ids[0])).wait().token_ids) for r in requests
    }
    streams = asyncio.run(asyncio.wait_for(shared_streams(engine, requests, interval_s), 120))
    orders = {r.request_id: DeltaOrder() for r in requests}
    got: dict[str, list[Delta]] = {r.request_id: [] for r in requests}
    for stream in streams:
        for item in stream:
            assert item
            for request_id, seq, delta in item:
                got[request_id].extend(orders[request_id].accept(seq, delta))
    for r, stream in zip(requests, streams, strict=True):
        deltas = got[r.request_id]
        assert [d.finish_reason is not None for d in deltas] == [False] * (len(deltas) - 1) + [True]
        assert [t for d in deltas for t in d.token_ids] == alone[r.request_id]
        # Its own stream ends with all of its deltas, in order, the last one last.
        own = [(seq, d) for request_id, seq, d in stream[-1] if request_id == r.request_id]
        assert [seq for seq, _ in own] == list(range(len(deltas)))


class CountingOutbox(Outbox):
    """An outbox that counts the times a stream took it."""

    def __init__(self) -> None:
        super().__init__()
        self.takes = 0

    def take(self) -> list[Entry]:
        self.takes += 1
        return super().take()


def test_one_steps_deltas_of_several_requests_ride_on_one_item() -> None:
    # The engine emits a step's deltas (one a request) in one go onto the loop: the first
    # stream to wake takes all of them, the others find the outbox empty and wait on.
    # (How many items a real engine's run takes depends on when the streams wake.)
    async def one_step() -> tuple[list[Entry], int]:
        loop = asyncio.get_running_loop()
        handles = [RequestHandle(f"r{i}", loop=loop) for i in range(4)]
        outbox = CountingOutbox()
        streams = [stream_request(h, outbox, request_id=h.request_id, interval_s=0.0) for h in handles]
        firsts = [asyncio.ensure_future(anext(s)) for s in streams]
        await asyncio.sleep(0)  # every stream waits for its first item
        for h in handles:
            h.emit(Delta(content=h.request_id))
        done, waiting = await asyncio.wait(firsts, return_when=asyncio.FIRST_COMPLETED)
        # Every stream woke and took the outbox once: the others found nothing.
        await wait_until_async(lambda: outbox.takes == len(streams), "every stream taking its turn")
        still_waiting = sum(not f.done() for f in waiting)
        for f in firsts:
            f.cancel()
        await asyncio.gather(*firsts, return_exceptions=True)
        for s in streams:
            await s.aclose()
        return done.pop().result(), still_waiting

    item, still_waiting = asyncio.run(asyncio.wait_for(one_step(), 30))
    assert sorted(request_id for request_id, _, _ in item) == ["r0", "r1", "r2", "r3"]
    assert still_waiting == 3


def test_a_long_interval_holds_neither_the_first_delta_nor_the_end(engine: Any) -> None:
    # An hour between items: the stream still ends as soon as its request does (the
    # deadline below is what a held end would miss), in the first item and one more.
    r = request(12, 5)
    alone = list(engine.submit(request(12, 5)).wait().token_ids)
    (stream,) = asyncio.run(asyncio.wait_for(shared_streams(engine, [r], 3600.0), 120))
    assert len(stream) <= 2
    assert stream[-1][-1][2].finish_reason is not None
    assert [t for _, _, d in stream[-1] for t in d.token_ids] == alone  # the last item: all of it


def test_leaving_early_cancels_the_request(engine: Any) -> None:
    async def first_item_only() -> Any:
        r = request(400, 5)
        handle = engine.submit(r, loop=asyncio.get_running_loop())
        items = stream_request(handle, Outbox(), request_id=r.request_id, interval_s=0.0)
        await anext(items)
        await items.aclose()
        return handle

    handle = asyncio.run(asyncio.wait_for(first_item_only(), 120))
    assert handle.cancelled


@given(
    st.integers(1, 12).flatmap(
        lambda n: st.tuples(st.just(n), st.permutations(range(n)), st.lists(st.integers(0, n - 1)))
    )
)
def test_delta_order_hands_on_each_delta_once_in_order(case: tuple[int, list[int], list[int]]) -> None:
    n, order, repeats = case
    deltas = [Delta(content=str(i)) for i in range(n)]
    arrivals = list(order)
    for k, seq in enumerate(repeats):  # repeats anywhere, before or after the first copy
        arrivals.insert((k * 7) % (len(arrivals) + 1), seq)
    book = DeltaOrder()
    out = [d for seq in arrivals for d in book.accept(seq, deltas[seq])]
    assert out == deltas
    assert book.delivered == n
