"""A submitted request's stream: :class:`RequestHandle`.

The engine thread pushes :class:`~thinkstruct.engine.request.Delta` events; the caller
reads them on its own thread (``for delta in handle``) or event loop
(``async for delta in handle``). The engine never waits for a reader: a client that stops
reading costs only the memory of its own undelivered text (bounded by ``max_tokens``).
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Iterator

from thinkstruct.engine.request import Completion, Delta, join_deltas


class RequestHandle:
    """The caller's side of one request: its events, and a way to cancel it.

    Args:
        request_id: the request's id.
        loop: deliver events to this event loop (for ``async for``); ``None`` delivers
            them to a thread-safe queue (for ``for``).
    """

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.request_id = request_id
        self._loop = loop
        self._async_queue: asyncio.Queue[Delta] | None = asyncio.Queue() if loop is not None else None
        self._queue: queue.SimpleQueue[Delta] = queue.SimpleQueue()
        self._cancelled = threading.Event()
        self._finished = threading.Event()

    # ---- caller side -----------------------------------------------------------------

    def cancel(self) -> None:
        """Stop generating (the client went away); the engine frees the request's slot
        and KV cache at its next step and ends the stream with ``abort``."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    @property
    def finished(self) -> bool:
        """True once the engine has sent the last event."""
        return self._finished.is_set()

    def __iter__(self) -> Iterator[Delta]:
        if self._async_queue is not None:
            raise TypeError("this handle delivers to an event loop: use `async for`")
        while True:
            delta = self._queue.get()
            yield delta
            if delta.finish_reason is not None:
                return

    async def __aiter__(self) -> AsyncIterator[Delta]:
        if self._async_queue is None:
            raise TypeError("this handle was submitted without a loop: use `for`")
        while True:
            delta = await self._async_queue.get()
            yield delta
            if delta.finish_reason is not None:
                return

    async def result(self) -> Completion:
        """The whole output, once finished (async callers)."""
        return join_deltas([d async for d in self])

    def wait(self) -> Completion:
        """The whole output, once finished (blocking callers)."""
        return join_deltas(list(self))

    # ---- engine side -----------------------------------------------------------------

    def emit(self, delta: Delta) -> None:
        """Deliver one event (engine thread). After the last one, nothing more is sent."""
        if self._finished.is_set():
            return
        if delta.finish_reason is not None:
            self._finished.set()
        if self._async_queue is None:
            self._queue.put(delta)
            return
        try:
            self._loop.call_soon_threadsafe(self._async_queue.put_nowait, delta)  # type: ignore[union-attr]
        except RuntimeError:
            pass  # the caller's loop is closed: nobody is listening any more
