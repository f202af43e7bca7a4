"""A thinking budget for requests without a constraint: :func:`thinking_budget_matcher`.

``max_reasoning_tokens`` must hold for plain chat too, not only under a grammar. The
grammar layer's :class:`~thinkstruct.grammar.reasoning.ReasoningGrammar` already forces
the end of a thought once its budget is spent; here it wraps a matcher that allows any
answer, so the same code enforces the budget with or without a constraint.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from thinkstruct.grammar.bitmask import allow_all
from thinkstruct.grammar.matcher import GrammarMatcher, StopTokenMatcher
from thinkstruct.grammar.reasoning import ReasoningGrammar

if TYPE_CHECKING:
    import torch

    from thinkstruct.tokenizer import Tokenizer


class FreeTextMatcher(StopTokenMatcher):
    """Any text, and a stop token anywhere."""

    __slots__ = ("_fed",)

    def __init__(self, stop_ids: frozenset[int]) -> None:
        super().__init__(stop_ids)
        self._fed = 0

    def _advance(self, token_id: int) -> bool:
        self._fed += 1
        return True

    def _rollback(self, num_tokens: int) -> None:
        self._fed -= min(num_tokens, self._fed)

    def _fill(self, bitmask: torch.Tensor, row: int) -> None:
        allow_all(bitmask, row)

    def _can_stop(self) -> bool:
        return True

    def _forced(self) -> list[int]:
        return []

    def copy(self) -> FreeTextMatcher:
        return FreeTextMatcher(self._stops)


def thinking_budget_matcher(
    tokenizer: Tokenizer,
    *,
    max_reasoning_tokens: int,
    end_tag: str,
    banned_ids_while_thinking: Iterable[int] = (),
) -> GrammarMatcher:
    """A matcher that leaves the text free but ends the thought after
    ``max_reasoning_tokens`` tokens (the model may still stop inside its thought)."""
    stops = frozenset(tokenizer.eos_token_ids)
    return ReasoningGrammar.wrap(
        FreeTextMatcher(stops),
        tokenizer,
        max_reasoning_tokens=max_reasoning_tokens,
        stop_ids_while_thinking=stops,
        banned_ids_while_thinking=banned_ids_while_thinking,
        end_tag=end_tag,
    )
