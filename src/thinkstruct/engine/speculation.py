"""Speculative decoding without a draft model: prompt-lookup n-gram drafts.

Structured answers repeat their context: an extraction copies fields of the document, a
tool call repeats names and values from the conversation, JSON keys come back. The last
few tokens of a request, looked up in what it has seen (its prompt and its answer so
far), often continue as they did the last time. :class:`NgramDrafter` proposes that
continuation; the engine feeds it after the row's own token in the same pass, gets the
logits of every fed position, and keeps the draft's tokens as long as each is what the
row would have sampled there (one draw of the row's own generator per position, as
without a draft). For a deterministic draft that is exactly the standard acceptance rule
(accept with the target probability, else draw from the rest), so the output
distribution is unchanged, and on a batch-invariant runner a seed gives the very same
tokens with and without speculation.

On a CPU bound by the bytes of its weights, a pass over one row's 1 + k tokens costs
about what a pass over one token does: every accepted draft token is a step saved.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["NgramDrafter", "SpeculationConfig"]


@dataclass(frozen=True, kw_only=True)
class SpeculationConfig:
    """When and how much to draft.

    Attributes:
        max_draft: most tokens proposed a step. A row drafts about twice the run it has
            been keeping lately, plus one (a pass over 1 + k positions is not free: 9
            positions cost about twice one on SmolLM2's int8 weights).
        min_ngram, max_ngram: lengths of the suffix looked up, longest first.
        max_batch: speculate only while at most this many rows decode (a larger batch
            is already bound by arithmetic, not weight bytes: extra positions cost).
        min_acceptance: a row whose drafts were accepted at a lower rate than this
            (over its last attempts) stops drafting for ``backoff_steps`` steps.
        backoff_steps: see ``min_acceptance``.
    """

    max_draft: int = 8
    min_ngram: int = 1
    max_ngram: int = 4
    max_batch: int = 4
    min_acceptance: float = 0.25
    backoff_steps: int = 16

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram or self.max_draft < 1 or self.max_batch < 1:
            raise ValueError("need 1 <= min_ngram <= max_ngram, max_draft >= 1 and max_batch >= 1")
        if not 0.0 <= self.min_acceptance <= 1.0 or self.backoff_steps < 0:
            raise ValueError("min_acceptance must be in [0, 1] and backoff_steps >= 0")


class NgramDrafter:
    """One request's context (prompt, then every token it emits) indexed by n-grams.

    ``propose`` looks up the context's last ``max_ngram`` ... ``min_ngram`` tokens and
    returns what followed their latest earlier occurrence. The index holds every n-gram
    ending before the context's last token, so the suffix never finds itself; keeping it
    costs O(``max_ngram``) a token.
    """

    def __init__(self, context: Sequence[int], config: SpeculationConfig) -> None:
        self.config = config
        self._tokens: list[int] = []
        self._seen: dict[tuple[int, ...], int] = {}
        self._tried = 0
        self._accepted = 0
        self._paused = 0
        #: Tokens kept per draft lately (an exponential average), which sizes the next.
        self._kept = config.max_draft / 4
        self.extend(context)

    def extend(self, tokens: Sequence[int]) -> None:
        """Append emitted tokens to the context."""
        ctx, seen = self._tokens, self._seen
        for token in tokens:
            end = len(ctx)  # n-grams ending at the current last token now have a successor
            for n in range(self.config.min_ngram, min(self.config.max_ngram, end) + 1):
                seen[tuple(ctx[end - n : end])] = end
            ctx.append(token)

    def propose(self, limit: int) -> list[int]:
        """At most ``min(limit, max_draft)`` tokens that followed the context's suffix the
        last time it occurred (none while backing off after poor acceptance)."""
        if self._paused > 0:
            self._paused -= 1
            return []
        limit = min(limit, self.config.max_draft, 1 + math.ceil(2 * self._kept))
        ctx = self._tokens
        if limit < 1:
            return []
        for n in range(min(self.config.max_ngram, len(ctx)), self.config.min_ngram - 1, -1):
            end = self._seen.get(tuple(ctx[len(ctx) - n :]))
            if end is not None:
                return ctx[end : end + limit]
        return []

    def record(self, proposed: int, accepted: int) -> None:
        """How a draft fared; a run of poor acceptance pauses drafting for a while."""
        self._kept += 0.3 * (accepted - self._kept)
        self._tried += proposed
        self._accepted += accepted
        if self._tried >= 4 * self.config.max_draft:
            if self._accepted < self.config.min_acceptance * self._tried:
                self._paused = self.config.backoff_steps
            self._tried = self._accepted = 0
