"""Stop strings over streamed text: :class:`StopStringMatcher`.

A stop string can arrive split across deltas (``"EN"`` then ``"D"``), so text that could
still become one is held back until it either completes the stop string (and is dropped
with everything after it) or cannot (and is emitted). The stream then adds up to exactly
what a check over the whole text would give.
"""

from __future__ import annotations


class StopStringMatcher:
    """Cuts a text stream at the first occurrence of any of ``stops``."""

    __slots__ = ("_stops", "_pending", "stopped")

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = stops
        self._pending = ""
        #: True once a stop string appeared; later input is ignored.
        self.stopped = False

    def feed(self, text: str) -> str:
        """The part of the stream (so far) that is certainly before any stop string."""
        if self.stopped or not text:
            return ""
        buffer = self._pending + text
        cut = min((i for i in (buffer.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            self._pending = ""
            return buffer[:cut]
        held = self._held_suffix(buffer)
        self._pending = buffer[len(buffer) - held :] if held else ""
        return buffer[: len(buffer) - held]

    def flush(self) -> str:
        """The held-back text, at the end of the stream (no stop string completed it)."""
        rest, self._pending = self._pending, ""
        return "" if self.stopped else rest

    def _held_suffix(self, buffer: str) -> int:
        """Length of the longest suffix of ``buffer`` that starts some stop string."""
        longest = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop[:n]):
                    longest = n
                    break
        return longest
