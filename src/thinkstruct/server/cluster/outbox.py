"""Streaming many requests' deltas over few Ray items: :class:`Outbox` on a replica,
:func:`stream_request` for each request, :class:`DeltaOrder` at the ingress.

Each streamed item costs a round of Ray's CPU in both processes (about a millisecond in
all), and a decode step makes one delta for every request in the batch. So a replica
does not send each request's deltas on its own stream: the deltas of all the requests
one ingress has on the replica wait in that ingress's :class:`Outbox`, and whichever of
those requests' streams wakes first takes them all as one item (one item a step, not
one a request). The ingress sorts them to their requests by id (:class:`DeltaOrder`
puts each request's deltas in order by their sequence numbers and drops repeats).

A request's last delta goes only on its own stream, with every delta of the request
before it again: the stream's end then completes the request at the ingress whatever
happened to the other streams, and a dead replica (every stream of it fails) can never
leave a request waiting for a delta that was on another stream.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator

    from thinkstruct.engine import Delta
    from thinkstruct.engine.core.handle import RequestHandle

#: A delta on the wire: the request's id, the delta's sequence number in the request
#: (0, 1, ...), the delta.
Entry = tuple[str, int, "Delta"]


class Outbox:
    """The deltas of one ingress's requests on this replica, until one of their streams
    takes them (all on the replica's event loop)."""

    def __init__(self) -> None:
        self._entries: list[Entry] = []
        self._waiters: set[asyncio.Event] = set()
        #: Requests streaming from it (the replica drops an outbox nobody uses).
        self.users = 0

    def put(self, entry: Entry) -> None:
        self._entries.append(entry)
        for waiter in self._waiters:
            waiter.set()

    def take(self) -> list[Entry]:
        entries, self._entries = self._entries, []
        return entries

    def watch(self, waiter: asyncio.Event) -> None:
        self._waiters.add(waiter)

    def unwatch(self, waiter: asyncio.Event) -> None:
        self._waiters.discard(waiter)


async def stream_request(
    handle: RequestHandle, outbox: Outbox, *, request_id: str, interval_s: float
) -> AsyncGenerator[list[Entry], None]:
    """One request's stream: items of entries (its own and the outbox's other requests'),
    ending with an item that holds every delta of this request, its last delta last.

    After sending an item the stream waits ``interval_s`` seconds (or until its request
    ends) before it takes the outbox again; the first delta and the end are never held.
    Leaving the iteration early cancels the request.
    """
    own: list[Entry] = []
    wake = asyncio.Event()
    finished = asyncio.Event()

    async def gather() -> None:
        async for delta in handle:
            entry = (request_id, len(own), delta)
            own.append(entry)
            if delta.finish_reason is None:
                outbox.put(entry)
            else:
                finished.set()
                wake.set()

    outbox.watch(wake)
    gathering = asyncio.ensure_future(gather())
    try:
        while True:
            await wake.wait()
            wake.clear()
            if finished.is_set():
                yield [*(e for e in outbox.take() if e[0] != request_id), *own]
                return
            entries = outbox.take()
            if not entries:
                continue  # another stream took them
            yield entries
            if interval_s > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(finished.wait(), interval_s)
    finally:
        outbox.unwatch(wake)
        gathering.cancel()
        handle.cancel()


class DeltaOrder:
    """One request's deltas at the ingress, in order: :meth:`accept` takes a delta with
    its sequence number, in any order and any number of times, and returns the deltas
    that are now next in line (each exactly once)."""

    def __init__(self) -> None:
        self._next = 0
        self._early: dict[int, Delta] = {}

    @property
    def delivered(self) -> int:
        """How many deltas have been handed on."""
        return self._next

    def accept(self, seq: int, delta: Delta) -> list[Delta]:
        if seq < self._next:
            return []
        self._early[seq] = delta
        ready = []
        while self._next in self._early:
            ready.append(self._early.pop(self._next))
            self._next += 1
        return ready
