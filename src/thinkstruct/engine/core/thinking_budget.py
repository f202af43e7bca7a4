"""Thinking budgets: the default one (:func:`default_thinking_budget`) and the matcher that
holds one without a constraint (:func:`thinking_budget_matcher`).

``max_reasoning_tokens`` must hold for plain chat too, not only under a grammar. The
grammar layer's :class:`~thinkstruct.grammar.runtime.reasoning.ReasoningGrammar` already forces
the end of a thought once its budget is spent; here it wraps a matcher that allows any
answer, so the same code enforces the budget with or without a constraint.

A request that thinks without a budget of its own gets :data:`DEFAULT_REASONING_SHARE` of
its ``max_tokens`` for the whole thought, so the answer always has the rest: a model that
never ends its thought by itself would otherwise spend every token thinking.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from thinkstruct.grammar.runtime.bitmask import allow_all, clear_allowed
from thinkstruct.grammar.runtime.end_tag import end_tag_matcher
from thinkstruct.grammar.runtime.matcher import GrammarMatcher, StopTokenMatcher
from thinkstruct.grammar.runtime.reasoning import ReasoningGrammar

if TYPE_CHECKING:
    import torch

    from thinkstruct.tokenizer import Tokenizer


#: The share of ``max_tokens`` a thought gets when the request sets no budget: the server's
#: ``--reasoning-share`` default and ``thinkstruct generate``'s.
DEFAULT_REASONING_SHARE = 0.5


def check_reasoning_share(share: float) -> float:
    """``share`` when it is a fraction strictly between 0 and 1.

    Raises:
        ValueError: naming the value otherwise.
    """
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share < 1:
        raise ValueError(f"reasoning_share must be a fraction strictly between 0 and 1, got {share!r}")
    return float(share)


def default_thinking_budget(max_tokens: int, *, share: float, tokenizer: Tokenizer, end_tag: str) -> int:
    """The ``max_reasoning_tokens`` that keeps a whole thought within
    ``floor(share * max_tokens)`` tokens, its forced end tag included.

    The budget counts the thinking tokens before the end of the thought is forced; the
    forced tag's tokens come after it (several for a tag spelled in text, like SmolLM2's
    ``</think>``) and count as reasoning tokens too. So the budget is the share less the
    whole tag, at least 1, and the answer keeps ``max_tokens`` less the thought, or more
    when the thought ends by itself sooner.

    Args:
        max_tokens: the request's ``max_tokens`` (thought and answer together), >= 1.
        share: the thought's fraction of it, in (0, 1).
        tokenizer, end_tag: the model's, to count the tag's tokens.
    """
    check_reasoning_share(share)
    tag_tokens = len(end_tag_matcher(tokenizer, end_tag).closing_ids(0))
    return max(1, math.floor(share * max_tokens) - tag_tokens)


def blank_token_ids(tokenizer: Tokenizer) -> frozenset[int]:
    """Ids whose text is empty or only whitespace (special and padding ids among them),
    built once per tokenizer."""

    def build() -> frozenset[int]:
        return frozenset(i for i, text in enumerate(tokenizer.decoded_vocab()) if not text.strip())

    return tokenizer.cached("blank_token_ids", build)


class FreeTextMatcher(StopTokenMatcher):
    """Any text, and a stop token anywhere, or, with ``blank_ids``, only once the text has
    a token not among them (an answer that is not empty or only whitespace)."""

    __slots__ = ("_blank", "_fed", "_first_text")

    def __init__(self, stop_ids: frozenset[int], *, blank_ids: frozenset[int] | None = None) -> None:
        super().__init__(stop_ids)
        self._blank = blank_ids
        self._fed = 0
        #: How many tokens came before the first one with text (None: none yet).
        self._first_text: int | None = None if blank_ids is not None else 0

    def _advance(self, token_id: int) -> bool:
        blank = self._blank
        if self._first_text is None and blank is not None and token_id not in blank:
            self._first_text = self._fed
        self._fed += 1
        return True

    def _rollback(self, num_tokens: int) -> None:
        self._fed -= min(num_tokens, self._fed)
        if self._blank is not None and self._first_text is not None and self._first_text >= self._fed:
            self._first_text = None

    def _fill(self, bitmask: torch.Tensor, row: int) -> None:
        allow_all(bitmask, row)
        if self._first_text is None:
            clear_allowed(bitmask, row, self._stops)

    def _can_stop(self) -> bool:
        return self._first_text is not None

    def _forced(self) -> list[int]:
        return []

    def copy(self) -> FreeTextMatcher:
        return FreeTextMatcher(self._stops, blank_ids=self._blank)


def thinking_budget_matcher(
    tokenizer: Tokenizer,
    *,
    max_reasoning_tokens: int,
    end_tag: str,
    banned_ids_while_thinking: Iterable[int] = (),
) -> GrammarMatcher:
    """A matcher that leaves the text free but ends the thought after
    ``max_reasoning_tokens`` tokens, and makes sure an answer comes: a stop token inside
    the thought ends the thought, not the response (the engine forces the end tag in its
    place), and the response stops only after the answer has a token that is not
    whitespace."""
    return ReasoningGrammar.wrap(
        FreeTextMatcher(frozenset(tokenizer.eos_token_ids), blank_ids=blank_token_ids(tokenizer)),
        tokenizer,
        max_reasoning_tokens=max_reasoning_tokens,
        stops_end_thought=True,
        banned_ids_while_thinking=banned_ids_while_thinking,
        end_tag=end_tag,
    )
