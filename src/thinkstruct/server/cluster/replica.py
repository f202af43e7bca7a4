"""The engine deployment: :class:`EngineReplica`, one engine and grammar compiler per replica.

:meth:`EngineReplica.generate` is a streaming method: it first yields the replica's name
(so the ingress knows, before any token, who serves the request), then lists of
:class:`~thinkstruct.engine.Delta` events, each with its request's id and its place in
it: the deltas of all the requests the same ingress has here ride on whichever of their
streams comes first (see :mod:`.outbox`). Ray Serve cancelling the call (the client went
away, the ingress retried elsewhere) cancels the engine request. :meth:`check_health`
fails when the engine thread is gone or has work but stopped stepping, and Ray Serve then
replaces the replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from ray import serve

from thinkstruct.engine.assembly import build_engine
from thinkstruct.server.cluster.outbox import Entry, Outbox, stream_request
from thinkstruct.server.cluster.stats_board import StatsPoster, engine_numbers
from thinkstruct.server.cluster.wire import WireRequest

if TYPE_CHECKING:
    from thinkstruct.engine.assembly import EngineSpec


class ReplicaStalled(RuntimeError):
    """The engine has requests but has not finished a step for too long."""


class StallWatch:
    """Tells a stuck engine from an idle one: stepping stopped while requests wait.

    Args:
        stall_s: seconds without a new step, while busy, before the engine counts as stuck.
        clock: monotonic seconds (injectable for tests).
    """

    def __init__(self, *, stall_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._stall_s = stall_s
        self._clock = clock
        self._steps = -1
        self._since = clock()

    def check(self, *, steps: int, busy: bool) -> None:
        """Record the engine's step count; raise when busy and unchanged for ``stall_s``.

        Raises:
            ReplicaStalled: busy and no step for longer than ``stall_s`` seconds.
        """
        now = self._clock()
        if steps != self._steps or not busy:
            self._steps, self._since = steps, now
            return
        if now - self._since > self._stall_s:
            raise ReplicaStalled(f"the engine has requests but no step for {now - self._since:.1f} s")


def replica_name() -> str:
    """This replica's id as Ray Serve names it (the ``x-thinkstruct-replica`` header)."""
    return str(serve.get_replica_context().replica_id.unique_id)


class EngineReplica:
    """One engine replica (the class Ray Serve deploys N times).

    Args:
        spec: the engine to build, in the replica's process
            (:func:`~thinkstruct.engine.assembly.build_engine`, its compile workers warm).
        board: the :class:`~.stats_board.StatsBoard` actor its counters go to.
        stall_s: see :class:`StallWatch`.
        stream_interval_s: seconds a request's stream waits after sending a batch before
            it sends the next (the deltas that came meanwhile go together; the first
            batch and the last delta are never held). Each streamed item costs a Ray round
            of CPU, on the cores the engine needs; 0 sends whenever a delta is ready.
    """

    def __init__(
        self,
        spec: EngineSpec,
        board: Any,
        *,
        stall_s: float = 30.0,
        stream_interval_s: float = 0.0,
    ) -> None:
        self._engine = build_engine(spec, progress=False, warm_up=True)
        self._name = replica_name()
        self._watch = StallWatch(stall_s=stall_s)
        self._interval_s = stream_interval_s
        self._outboxes: dict[str, Outbox] = {}  # by ingress
        self._poster = StatsPoster(board, self._name, self.stats)

    async def generate(self, wire: WireRequest) -> AsyncIterator[str | list[Entry]]:
        """The replica's name, then entries (this request's deltas and those of the
        ingress's other requests here), ending with all of this request's deltas, its
        last delta last (:func:`~.outbox.stream_request`).

        Raises:
            InvalidConstraint: the constraint does not compile here (the ingress compiled
                it, so only a broken replica gets here).
            EngineOverloaded, EngineClosed: this replica cannot take the request (the
                ingress tries another).
        """
        yield self._name
        engine = self._engine
        grammar = None
        if wire.grammar is not None:
            spec = wire.grammar
            grammar = await engine.compiler.compile_async(
                spec.constraint, backend=spec.backend, strict=spec.strict
            )
        handle = engine.submit(wire.with_grammar(grammar), loop=asyncio.get_running_loop())
        outbox = self._outboxes.setdefault(wire.ingress, Outbox())
        outbox.users += 1
        stream = stream_request(
            handle, outbox, request_id=wire.request.request_id, interval_s=self._interval_s
        )
        try:
            async with contextlib.aclosing(stream) as items:
                async for item in items:
                    yield item
        finally:
            outbox.users -= 1
            if outbox.users == 0:
                del self._outboxes[wire.ingress]

    def stats(self) -> dict[str, Any]:
        """The replica's name, its engine's counters and its compiler's."""
        return {
            "replica": self._name,
            "engine": engine_numbers(self._engine.stats),
            "compiler": self._engine.compiler.stats.snapshot(),
            "running": self._engine.running,
        }

    def check_health(self) -> None:
        """Ray Serve's health check (every few seconds).

        Raises:
            RuntimeError: the engine stopped, or has requests and stopped stepping.
        """
        engine = self._engine
        if not engine.running:
            raise RuntimeError("the engine is not running")
        stats = engine.stats
        self._watch.check(steps=stats.steps, busy=stats.running + stats.waiting > 0)

    def __del__(self) -> None:
        poster = getattr(self, "_poster", None)
        if poster is not None:
            poster.stop()
        engine = getattr(self, "_engine", None)
        if engine is not None:
            engine.close(grace_s=0.0)
            engine.compiler.close()
