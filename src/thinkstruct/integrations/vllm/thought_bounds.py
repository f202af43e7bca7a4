"""Where a family's thought ends, read off token ids: :class:`ThoughtBounds`.

vLLM asks a reasoning parser about token ids (has the thought ended in these ids, in this
step's ids, at which id), while a family's tags are text, and for models without thinking
tokens (SmolLM2's ``<think>…</think>``) they span several tokens. The answers here come
from decoding the ids (special tokens kept) and finding the family's tags in the text, so
they hold for tags of one token and of many alike. No vLLM import: the vLLM parser class
(:mod:`.reasoning`) wraps this.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from thinkstruct.parsers import ReasoningFamily

#: Decodes token ids to text, special tokens kept.
Decode = Callable[[Sequence[int]], str]


class ThoughtBounds:
    """Answers about a family's thought on token ids.

    Args:
        family: the reasoning family.
        decode: ids → text with special tokens kept.
        enabled: whether this request reasons (the family's switch, read from the
            request's ``chat_template_kwargs``).
    """

    def __init__(self, family: ReasoningFamily, decode: Decode, *, enabled: bool) -> None:
        self.family = family
        self._decode = decode
        self.enabled = enabled
        self._start = family.think_start
        self._end = family.think_end
        # A tag spans at most one token per character; the window decoded around a step's
        # new ids covers the tag even when all of it came in earlier steps but its last
        # character.
        self._tag_window = len(family.think_end) + 2

    def has_ended(self, ids: Sequence[int]) -> bool:
        """Whether a thought is closed, or none is open, after ``ids`` (a prompt, or a
        prompt and output): the last tag in the text decides; with no tag, the output
        starts in a thought only when this request reasons and the model opens the
        thought itself (a family whose template opens it puts the tag in the prompt)."""
        text = self._decode(ids)
        start = text.rfind(self._start)
        end = text.rfind(self._end)
        if start < 0 and end < 0:
            return not (self.enabled and not self.family.forced)
        return end > start

    def ends_within(self, ids: Sequence[int], new: int) -> bool:
        """Whether the end tag is completed by the last ``new`` ids of ``ids``."""
        if new <= 0 or not ids:
            return False
        window = list(ids[-(new + self._tag_window) :])
        before = self._decode(window[: len(window) - new])
        after = self._decode(window)
        found = after.rfind(self._end)
        return found >= 0 and found + len(self._end) > len(before.rstrip("\ufffd"))

    def end_index(self, ids: Sequence[int]) -> int | None:
        """How many of ``ids`` (an output) come up to and including the token that
        completes the end tag, or ``None`` when the tag is not there."""
        if self._end not in self._decode(ids):
            return None
        low, high = 1, len(ids)  # the shortest prefix holding the tag lies in [low, high]
        while low < high:
            middle = (low + high) // 2
            if self._end in self._decode(ids[:middle]):
                high = middle
            else:
                low = middle + 1
        return low


__all__ = ["Decode", "ThoughtBounds"]
