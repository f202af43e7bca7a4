"""Per-token log-probabilities for the rows that ask: :class:`LogprobTable`.

The distribution is the one the grammar allowed: log-softmax of the logits after
``logit_bias``, the penalties and the grammar mask, at temperature 1 and before ``min_p``,
top-k and top-p truncation, so a forbidden token has ``-inf`` and is never listed, the
allowed tokens' probabilities sum to 1, and the figures do not move with the temperature
(classification by log-probability reads the model's preference among what was allowed).
Only the rows that ask pay for it: one log-softmax and one ``topk`` over those rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from thinkstruct.engine.request import SamplingParams

#: A sampled token's log-probability and its most likely alternatives (token, log-probability).
SampledLogprob = tuple[float, tuple[tuple[int, float], ...]]


class LogprobTable:
    """The log-softmax of the rows of ``logits [rows, vocab]`` whose parameters ask for
    ``logprobs``, computed before sampling and read after it with :meth:`entry`."""

    def __init__(self, logits: torch.Tensor, params: Sequence[SamplingParams]) -> None:
        wanted = [r for r, p in enumerate(params) if p.logprobs is not None]
        self._position = {r: j for j, r in enumerate(wanted)}
        self._top: list[tuple[tuple[int, float], ...]] = [()] * len(wanted)
        if not wanted:
            self._logprobs = torch.empty(0)
            return
        rows = logits if len(wanted) == logits.shape[0] else logits[wanted]
        self._logprobs = torch.log_softmax(rows.float(), dim=-1)
        k = min(max(params[r].logprobs or 0 for r in wanted), logits.shape[1])
        if k:
            values, ids = torch.topk(self._logprobs, k, dim=-1)
            for j, (row_values, row_ids) in enumerate(zip(values.tolist(), ids.tolist(), strict=True)):
                n = params[wanted[j]].logprobs or 0
                self._top[j] = tuple(
                    (i, v) for i, v in zip(row_ids[:n], row_values[:n], strict=True) if v != -math.inf
                )

    def entry(self, row: int, token: int) -> SampledLogprob | None:
        """``token``'s log-probability in row ``row`` and the row's most likely tokens
        (``None`` for a row that did not ask)."""
        j = self._position.get(row)
        if j is None:
            return None
        return float(self._logprobs[j, token]), self._top[j]
