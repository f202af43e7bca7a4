"""Stop strings over streamed text: :class:`StopStringMatcher`.

A stop string can arrive split across deltas (``"EN"`` then ``"D"``), so text that could
still become one is held back until it either completes the stop string (and is dropped
with everything after it) or cannot (and is emitted). The stream then adds up to exactly
what a check over the whole text would give.

"First occurrence" means the stop string that *completes* first (its end is earliest; at a
tie, the longer one): a stream cannot wait to see whether a longer stop string that started
earlier will complete, so the whole-text rule is the one a stream can keep.
"""

from __future__ import annotations


def first_stop(text: str, stops: tuple[str, ...]) -> int:
    """Where ``text`` is cut: the start of the stop string that completes first, or -1."""
    found = [(i + len(s), i) for s in stops if (i := text.find(s)) >= 0]
    return min(found)[1] if found else -1


class StopStringMatcher:
    """Cuts a text stream at the first occurrence of any of ``stops``."""

    __slots__ = ("_pending", "_stops", "stopped")

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
        cut = first_stop(buffer, self._stops)
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
