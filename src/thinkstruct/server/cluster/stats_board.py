"""Per-replica counters for ``/metrics``: :class:`StatsBoard`, and the collector that reads it.

Each engine replica posts its engine's and compiler's counters to the board about once
a second (:class:`StatsPoster`); the ingress reads the board as often
(:class:`BoardReader`) and ``/metrics`` exports every replica's numbers with a
``replica`` label (``thinkstruct_replica_*``) beside the service's totals (the usual
``thinkstruct_engine_*``, summed over the replicas). A replica leaves the board when it
stops (scaled down, shut down: it posts its final counters as it leaves) or
``max_age_s`` after its last post (killed); the board keeps the counters of the replicas
that left, and the service's counters count them (a counter that went down as the
service shrank would read to Prometheus as a reset, and the next rate as a burst), its
gauges (queue lengths) not.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import ray
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from ray import cloudpickle

from thinkstruct.engine.core.config import EngineStats
from thinkstruct.server.metrics import ENGINE_COUNTERS

log = logging.getLogger("thinkstruct.cluster")

#: Seconds between a replica's posts and between the ingress's reads.
PERIOD_S = 1.0


class StatsBoard:
    """The latest counters of each replica (a Ray actor: ``ray.remote(StatsBoard)``),
    and the last engine counters of those that left.

    Args:
        max_age_s: a replica's entry leaves this many seconds after its last post.
        clock: monotonic seconds.
    """

    def __init__(self, *, max_age_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._entries: dict[str, tuple[float, dict[str, Any]]] = {}
        self._retired: dict[str, dict[str, Any]] = {}
        self._max_age_s = max_age_s
        self._clock = clock

    def post(self, replica: str, stats: dict[str, Any]) -> None:
        self._entries[replica] = (self._clock(), stats)
        self._retired.pop(replica, None)  # back after a late post: counted live again

    def drop(self, replica: str, stats: dict[str, Any] | None = None) -> None:
        """``replica`` leaves; ``stats``: its final counters (else its last post's)."""
        entry = self._entries.pop(replica, None)
        final = stats if stats is not None else entry[1] if entry is not None else None
        if final is not None:
            self._retire(replica, final)

    def _retire(self, replica: str, stats: dict[str, Any]) -> None:
        self._retired[replica] = {k: v for k, v in stats["engine"].items() if k in ENGINE_COUNTERS}

    def read(self) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
        """Every live replica's latest counters, by replica name, and the engine counters
        of each replica that left (plain data: a :class:`Board`'s fields)."""
        now = self._clock()
        for name, (posted, stats) in list(self._entries.items()):
            if now - posted > self._max_age_s:
                del self._entries[name]
                self._retire(name, stats)
        live = {name: stats for name, (_, stats) in sorted(self._entries.items())}
        return live, dict(self._retired)


def start_board() -> Any:
    """A :class:`StatsBoard` actor. Its class goes to Ray by value, so the actor's
    process imports Ray alone, not thinkstruct (with its class by name it imported the
    server and torch: measured, 7.7 CPU-s and ~500 MB to hold a few dicts)."""
    module = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(module)
    try:
        return ray.remote(num_cpus=0)(StatsBoard).remote()
    finally:
        cloudpickle.unregister_pickle_by_value(module)


@dataclasses.dataclass(frozen=True)
class Board:
    """A read of the board: ``replicas``, each live replica's latest numbers by name;
    ``retired``, the last engine counters of each replica that left, by name."""

    replicas: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    retired: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    def total(self) -> EngineStats:
        """The live replicas' engine numbers summed (gauges too: queue lengths add up),
        the counters with those of the replicas that left."""
        total = EngineStats()
        engines = [entry["engine"] for entry in self.replicas.values()] + list(self.retired.values())
        for numbers in engines:
            for name, value in numbers.items():
                if isinstance(value, bool):
                    continue
                if isinstance(value, (int, float)):
                    setattr(total, name, getattr(total, name) + value)
                elif isinstance(value, dict):
                    merged = getattr(total, name)
                    for key, count in value.items():
                        merged[key] = merged.get(key, 0) + count
        return total


class _Repeating:
    """Calls ``tick`` every ``period_s`` seconds in a daemon thread until :meth:`stop`."""

    def __init__(self, tick: Callable[[], None], *, period_s: float, name: str) -> None:
        self._tick = tick
        self._period_s = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._period_s):
            try:
                self._tick()
            except Exception:  # the board is gone while stopping; metrics must not kill a replica
                log.debug("stats board unreachable", exc_info=True)

    def stop(self) -> None:
        self._stop.set()


class StatsPoster(_Repeating):
    """A replica's side: posts ``stats()`` under ``replica`` to the board; :meth:`stop`
    leaves it with the final ``stats()``."""

    def __init__(self, board: Any, replica: str, stats: Callable[[], dict[str, Any]]) -> None:
        super().__init__(
            lambda: ray.get(board.post.remote(replica, stats()), timeout=5),
            period_s=PERIOD_S,
            name="stats-post",
        )
        self._board = board
        self._replica = replica
        self._stats = stats

    def stop(self) -> None:
        super().stop()
        self._thread.join(timeout=6)  # a post under way lands before the drop
        try:
            ray.get(self._board.drop.remote(self._replica, self._stats()), timeout=2)
        except Exception:  # Ray may be shutting down
            log.debug("could not leave the stats board", exc_info=True)


class BoardReader(_Repeating):
    """The ingress's side: the board's latest read (:attr:`board`)."""

    def __init__(self, board: Any) -> None:
        self.board = Board()
        super().__init__(self._read, period_s=PERIOD_S, name="stats-read")
        self._board = board

    def _read(self) -> None:
        self.board = Board(*ray.get(self._board.read.remote(), timeout=5))

    @property
    def replicas(self) -> dict[str, dict[str, Any]]:
        return self.board.replicas

    def total(self) -> EngineStats:
        """The service's engine numbers (see :meth:`Board.total`)."""
        return self.board.total()


class ReplicaCollector(Collector):
    """``thinkstruct_replica_*{replica=...}``: each replica's engine and compiler numbers,
    and ``thinkstruct_replicas``: how many post."""

    def __init__(self, reader: BoardReader) -> None:
        self._reader = reader

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        replicas = self._reader.replicas
        count = GaugeMetricFamily("thinkstruct_replicas", "Engine replicas reporting")
        count.add_metric([], float(len(replicas)))
        yield count
        families: dict[str, GaugeMetricFamily] = {}
        for replica, entry in replicas.items():
            numbers = {f"engine_{k}": v for k, v in entry["engine"].items()}
            numbers.update({f"grammar_{k}": v for k, v in entry["compiler"].items()})
            for name, value in numbers.items():
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                family = families.get(name)
                if family is None:
                    family = families[name] = GaugeMetricFamily(
                        f"thinkstruct_replica_{name}", f"Per replica: {name}", labels=["replica"]
                    )
                family.add_metric([replica], float(value))
        yield from families.values()


def engine_numbers(stats: EngineStats) -> dict[str, Any]:
    """An engine's counters as plain data for the board."""
    return dataclasses.asdict(stats)
