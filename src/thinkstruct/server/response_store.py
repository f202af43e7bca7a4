"""The responses a server keeps for ``previous_response_id`` and ``GET /v1/responses/{id}``.

A :class:`ResponseStore` holds each stored response (its answer object and the
conversation up to and including it) in memory, bounded three ways: at most
``max_entries`` responses, at most ``max_bytes`` of their JSON, none older than
``ttl_s`` seconds on its clock (injectable: tests move it by hand). The oldest go first
when a bound is met; a response larger than the byte bound alone is not kept.
``serve --responses-store entries=N,mib=M,ttl=S`` sizes it (:meth:`StoreLimits.parse`);
``entries=0`` keeps nothing.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreLimits:
    """The store's bounds: entries, bytes (of the JSON kept) and seconds."""

    max_entries: int = 1000
    max_bytes: int = 64 << 20
    ttl_s: float = 3600.0

    def __post_init__(self) -> None:
        if self.max_entries < 0 or self.max_bytes < 0 or not self.ttl_s > 0:
            raise ValueError(
                "responses store: entries and bytes must not be negative and ttl must be positive, "
                f"got entries={self.max_entries}, bytes={self.max_bytes}, ttl={self.ttl_s}"
            )

    @classmethod
    def parse(cls, text: str) -> StoreLimits:
        """``"entries=1000,mib=64,ttl=3600"`` (any subset; the rest keep their defaults).

        Raises:
            ValueError: naming the part that is not ``key=number`` with a known key.
        """
        values: dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, _, number = part.partition("=")
            try:
                if key == "entries":
                    values["max_entries"] = int(number)
                elif key == "mib":
                    values["max_bytes"] = int(float(number) * (1 << 20))
                elif key == "ttl":
                    values["ttl_s"] = float(number)
                else:
                    raise ValueError
            except ValueError:
                raise ValueError(
                    f"responses store: {part!r} is not entries=N, mib=M or ttl=SECONDS"
                ) from None
        return cls(**values)


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """One kept response.

    Attributes:
        response: the answer object as ``GET`` returns it (JSON).
        conversation: the messages up to and including this response's output, as chat
            templates read them: the next turn's prompt starts with them.
    """

    response: dict[str, Any]
    conversation: list[dict[str, Any]]


class ResponseStore:
    """A bounded, thread-safe map of response id to :class:`StoredResponse`.

    Args:
        limits: the bounds.
        clock: monotonic seconds (``time.monotonic`` unless a test gives its own).
    """

    def __init__(
        self, limits: StoreLimits | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limits = limits or StoreLimits()
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, tuple[StoredResponse, int, float]] = OrderedDict()
        self._bytes = 0

    def put(self, response_id: str, stored: StoredResponse) -> bool:
        """Keep ``stored`` (``False`` when it alone is larger than the byte bound, or the
        store keeps nothing)."""
        size = len(json.dumps([stored.response, stored.conversation], ensure_ascii=False).encode("utf-8"))
        limits = self.limits
        if limits.max_entries == 0 or size > limits.max_bytes:
            return False
        with self._lock:
            self._drop(response_id)
            self._entries[response_id] = (stored, size, self._clock())
            self._bytes += size
            while len(self._entries) > limits.max_entries or self._bytes > limits.max_bytes:
                self._drop(next(iter(self._entries)))
        return True

    def get(self, response_id: str) -> StoredResponse | None:
        """The response, or ``None`` when it was never kept, was deleted or has expired."""
        with self._lock:
            self._expire()
            entry = self._entries.get(response_id)
            return None if entry is None else entry[0]

    def delete(self, response_id: str) -> bool:
        """Forget a response; ``False`` when it was not there."""
        with self._lock:
            self._expire()
            return self._drop(response_id)

    def __len__(self) -> int:
        with self._lock:
            self._expire()
            return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes of JSON kept."""
        return self._bytes

    def _expire(self) -> None:
        oldest_kept = self._clock() - self.limits.ttl_s
        while self._entries:
            first = next(iter(self._entries))
            if self._entries[first][2] > oldest_kept:
                return
            self._drop(first)

    def _drop(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return False
        self._bytes -= entry[1]
        return True
