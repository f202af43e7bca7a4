"""Sizes that follow the load: :class:`TargetedSize`, a size kept where a pass of that size
takes about a target time, fed the passes' measured durations as plain data.

The scheduler keeps two: the rows a decoding step holds (slots admitted) and the prompt
positions a prefill pass computes while rows decode. A decoding step's time is the
per-token latency of every row in it, and a prefill pass between two steps adds to it, so
both are held to the same target (``EngineConfig.step_latency_target_s``).

Rule, per observed pass of ``size`` taking ``seconds``: ``fitting = size * target /
seconds`` is what a pass of the target's length would hold if its time grew in proportion
to its size; as part of a pass's time (the weights read, the threads woken) does not grow
with it, that is at most what fits, so the size moves towards it without overshooting:

- a pass over the target moves the size down, half-way to ``fitting``, by at least one
  (where ``fitting`` is below it: a pass larger than the size, rows admitted before it
  shrank, leaves it);
- a full pass (``size`` at least the current value) under the target moves it up,
  half-way to ``fitting``, by at least one, where ``fitting`` holds one more;
- a pass short of the current value and under the target says nothing about a larger
  one: the size stays.

The size never leaves ``[low, high]``; ``high`` is the hard cap (``--max-batch``,
``--prefill-chunk``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: How far a size moves towards what a pass of the target's length would hold, per pass.
GAIN = 0.5


@dataclass(kw_only=True)
class TargetedSize:
    """A size held to a target time per pass.

    Attributes:
        target_s: seconds a pass should take; ``None`` keeps the size at ``high``.
        low: the smallest size (at least 1).
        high: the largest size (the hard cap).
        value: the size now.
    """

    target_s: float | None
    low: int
    high: int
    value: int

    def __post_init__(self) -> None:
        if not 1 <= self.low <= self.high:
            raise ValueError(f"need 1 <= low <= high, got low={self.low}, high={self.high}")
        if self.target_s is not None and not self.target_s > 0:
            raise ValueError(f"target_s must be positive or None, got {self.target_s}")
        self.value = self.high if self.target_s is None else min(max(self.value, self.low), self.high)

    def observe(self, *, size: int, seconds: float) -> None:
        """A pass of ``size`` (rows, or positions) took ``seconds``."""
        target = self.target_s
        if target is None or size < 1 or not seconds > 0:
            return
        fitting = size * target / seconds
        value = self.value
        if seconds > target:
            if fitting >= value:  # more rows than the size hold a slot already
                return
            moved = min(value - 1, math.floor(value - GAIN * (value - fitting)))
        elif size >= value and fitting >= value + 1:
            moved = max(value + 1, math.floor(value + GAIN * (fitting - value)))
        else:
            return
        self.value = min(max(moved, self.low), self.high)
