"""What one request's options change in its logits before sampling: ``logit_bias`` and the
presence, frequency and repetition penalties (:class:`LogitAdjustments`, :func:`adjust_logits`).

The semantics are vLLM's: the bias is added first; then the repetition penalty divides a
positive logit (multiplies a negative one) of every token seen in the prompt or the
output; then the frequency penalty is subtracted once per time a token is in the output
and the presence penalty once for any token in it. Each step touches only the listed
tokens of the rows that ask (scatter and gather over a few hundred entries), never the
whole vocabulary, and rows without these options are not touched at all.

The engine applies them after the grammar mask, which gives the same logits as before it:
a forbidden token's ``-inf`` stays ``-inf`` under every one of these operations (a bias of
+100 cannot make it allowed).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from thinkstruct.engine.request import SamplingParams


class LogitAdjustments:
    """One request's bias and the tokens its penalties count (updated as tokens come).

    Args:
        params: the request's sampling parameters.
        prompt_ids: its prompt (the repetition penalty counts prompt tokens as seen).
    """

    __slots__ = (
        "_prompt",
        "_repeated",
        "_repeated_ids",
        "bias_ids",
        "bias_values",
        "output_counts",
        "params",
    )

    def __init__(self, params: SamplingParams, prompt_ids: Sequence[int]) -> None:
        self.params = params
        self.bias_ids = torch.tensor([token for token, _ in params.logit_bias], dtype=torch.int64)
        self.bias_values = torch.tensor([bias for _, bias in params.logit_bias], dtype=torch.float32)
        #: How many times each token is in the output so far.
        self.output_counts: dict[int, int] = {}
        # Tokens of the prompt and the output, in first-seen order (only with a repetition
        # penalty), and their tensor, rebuilt when a new one arrives.
        repeats = params.repetition_penalty != 1.0
        self._repeated: dict[int, None] = dict.fromkeys(prompt_ids) if repeats else {}
        self._prompt = frozenset(self._repeated)
        self._repeated_ids: torch.Tensor | None = None

    def add(self, token_ids: Iterable[int]) -> None:
        """Count generated tokens (sampled or forced)."""
        counts = self.output_counts
        repeats = self.params.repetition_penalty != 1.0
        for token in token_ids:
            counts[token] = counts.get(token, 0) + 1
            if repeats and token not in self._repeated:
                self._repeated[token] = None
                self._repeated_ids = None

    def remove(self, token_ids: Iterable[int]) -> None:
        """Uncount generated tokens that were taken back (a value that failed its check)."""
        counts = self.output_counts
        for token in token_ids:
            left = counts.get(token, 0) - 1
            if left > 0:
                counts[token] = left
                continue
            counts.pop(token, None)
            if token in self._repeated and token not in self._prompt:
                del self._repeated[token]
                self._repeated_ids = None

    def repeated_ids(self) -> torch.Tensor:
        """The tokens in the prompt or the output (int64)."""
        if self._repeated_ids is None:
            self._repeated_ids = torch.tensor(list(self._repeated), dtype=torch.int64)
        return self._repeated_ids


def adjust_logits(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    adjustments: Sequence[LogitAdjustments | None],
) -> None:
    """Apply each row's bias and penalties to float32 ``logits [rows, vocab]`` in place.

    ``params[r]`` and ``adjustments[r]`` belong to row ``r``; a row whose parameters do
    not :attr:`~SamplingParams.adjusts_logits` is left alone (its adjustments may be
    ``None``).
    """
    rows = [r for r, p in enumerate(params) if p.adjusts_logits]
    if not rows:
        return
    states = [_state(adjustments[r], r) for r in rows]
    biased = [(r, s) for r, s in zip(rows, states, strict=True) if s.bias_ids.numel()]
    if biased:
        index = _row_index([(r, s.bias_ids) for r, s in biased])
        logits.index_put_(index, torch.cat([s.bias_values for _, s in biased]), accumulate=True)
    repeating = [(r, s) for r, s in zip(rows, states, strict=True) if s.params.repetition_penalty != 1.0]
    if repeating:
        pairs = [(r, s.repeated_ids()) for r, s in repeating]
        index = _row_index(pairs)
        penalty = _per_entry([s.params.repetition_penalty for _, s in repeating], pairs)
        values = logits[index]
        logits[index] = torch.where(values > 0, values / penalty, values * penalty)
    counting = [
        (r, s)
        for r, s in zip(rows, states, strict=True)
        if (s.params.presence_penalty or s.params.frequency_penalty) and s.output_counts
    ]
    if counting:
        pairs = [(r, torch.tensor(list(s.output_counts), dtype=torch.int64)) for r, s in counting]
        counts = torch.cat(
            [torch.tensor(list(s.output_counts.values()), dtype=torch.float32) for _, s in counting]
        )
        frequency = _per_entry([s.params.frequency_penalty for _, s in counting], pairs)
        presence = _per_entry([s.params.presence_penalty for _, s in counting], pairs)
        logits.index_put_(_row_index(pairs), -(frequency * counts + presence), accumulate=True)


def _state(adjustments: LogitAdjustments | None, row: int) -> LogitAdjustments:
    if adjustments is None:
        raise ValueError(f"row {row} adjusts its logits but has no LogitAdjustments")
    return adjustments


def _row_index(pairs: list[tuple[int, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, columns)`` index tensors of every row's listed token ids."""
    rows = torch.cat([torch.full((ids.numel(),), r, dtype=torch.int64) for r, ids in pairs])
    return rows, torch.cat([ids for _, ids in pairs])


def _per_entry(values: list[float], pairs: list[tuple[int, torch.Tensor]]) -> torch.Tensor:
    """Each row's value repeated for each of its listed token ids (float32)."""
    sizes = torch.tensor([ids.numel() for _, ids in pairs], dtype=torch.int64)
    return torch.repeat_interleave(torch.tensor(values, dtype=torch.float32), sizes)
