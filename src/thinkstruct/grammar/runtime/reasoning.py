"""ReasoningGrammar: free thought first, then the constrained answer.

The decorator from SGLang's ReasonerGrammarBackend, rebuilt to work over every backend
and with end tags spelled in several tokens. One integer carries the phase:

- ``-1`` thinking: the mask allows everything except the stop tokens (a response cannot
  end inside its thought; or, as the engine asks, they stay allowed and end the thought
  in place of the end tag) and tokens that would close the thought and run on into the
  answer inside the same token; tokens are not fed to the inner grammar.
- ``0``: the token that completed the end tag was just accepted.
- ``N > 0``: ``N`` answer tokens accepted after the tag, all fed to the inner grammar.

A token moves the state *after* it is fed, so the end tag itself never reaches the inner
grammar. ``rollback(k)`` rolls the inner grammar back by the answer tokens among the
``k`` only, then walks the state back across the boundary; thinking tokens keep the
partial-tag match they had, so rolling back into the middle of a tag restores it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from thinkstruct.grammar.runtime.bitmask import allow_only
from thinkstruct.grammar.runtime.end_tag import RUNS_ON, EndTagMatcher, end_tag_matcher
from thinkstruct.grammar.runtime.matcher import GrammarMatcher

if TYPE_CHECKING:
    import torch

    from thinkstruct.tokenizer import Tokenizer

THINKING = -1


class ReasoningGrammar(GrammarMatcher):
    """Wraps any backend's :class:`GrammarMatcher` for a reasoning model.

    Args:
        inner: the answer's grammar (fed only after the end tag).
        end_tag: the shared matcher of the model's end tag.
        reasoning: start in the thought (``True``) or directly in the answer.
        max_reasoning_tokens: after this many thinking tokens the mask allows only the
            next token of the end tag until it is complete, so the answer always comes.
        banned_while_thinking: token ids masked and refused while thinking (by default the
            caller passes the model's stop tokens).
        stops_ending_thought: stop ids allowed while thinking that end the thought, not the
            response: the engine takes the end tag in place of one (:meth:`ends_thought`,
            :meth:`close_thought`), so a model that stops inside its thought still answers.
    """

    __slots__ = (
        "_banned",
        "_budget",
        "_closed_at",
        "_initial",
        "_inner",
        "_matched",
        "_state",
        "_stops",
        "_tag",
    )

    def __init__(
        self,
        inner: GrammarMatcher,
        end_tag: EndTagMatcher,
        *,
        reasoning: bool = True,
        max_reasoning_tokens: int | None = None,
        banned_while_thinking: Iterable[int] = (),
        stops_ending_thought: Iterable[int] = (),
    ) -> None:
        if max_reasoning_tokens is not None and max_reasoning_tokens < 0:
            raise ValueError("max_reasoning_tokens must be >= 0")
        self._inner = inner
        self._tag = end_tag
        self._initial = THINKING if reasoning else 0
        self._state = self._initial
        # Partial tag match after each thinking token; [0] is before the first one.
        self._matched: list[int] = [0]
        self._budget = max_reasoning_tokens
        self._banned = frozenset(banned_while_thinking)
        self._stops = frozenset(stops_ending_thought) - self._banned
        # Thinking tokens after which :meth:`close_thought` closed the thought, if it did.
        self._closed_at: int | None = None

    @classmethod
    def wrap(
        cls,
        inner: GrammarMatcher,
        tokenizer: Tokenizer,
        *,
        max_reasoning_tokens: int | None = None,
        stops_end_thought: bool = False,
        banned_ids_while_thinking: Iterable[int] = (),
        end_tag: str | None = None,
    ) -> ReasoningGrammar:
        """``inner`` behind a thought that starts at once (what
        :meth:`CompiledGrammar.matcher(reasoning=True) <thinkstruct.grammar.compiled.CompiledGrammar.matcher>`
        returns). Every stop id is masked while thinking, unless ``stops_end_thought``:
        then they stay allowed and end the thought instead (see :meth:`close_thought`);
        ``banned_ids_while_thinking`` are masked too; ``end_tag`` defaults to the
        tokenizer's think-end text."""
        stops = set(tokenizer.eos_token_ids)
        banned = set(banned_ids_while_thinking)
        if not stops_end_thought:
            banned.update(stops)
        return cls(
            inner,
            end_tag_matcher(tokenizer, end_tag),
            reasoning=True,
            max_reasoning_tokens=max_reasoning_tokens,
            banned_while_thinking=banned,
            stops_ending_thought=stops if stops_end_thought else (),
        )

    # ---- state -----------------------------------------------------------------------

    @property
    def state(self) -> int:
        """-1 while thinking, else the number of tokens accepted after the end tag."""
        return self._state

    @property
    def is_thinking(self) -> bool:
        return self._state == THINKING

    @property
    def thinking_tokens(self) -> int:
        """Tokens accepted while thinking (the one that completed the tag included)."""
        return len(self._matched) - 1

    @property
    def inner(self) -> GrammarMatcher:
        return self._inner

    def at_answer_start(self) -> bool:
        return self._state == 0 and self._inner.at_answer_start()

    def _closing(self) -> bool:
        return self._closing_after(len(self._matched) - 1)

    def _closing_after(self, thought: int) -> bool:
        """Whether only the end tag may follow ``thought`` thinking tokens."""
        if self._closed_at is not None and thought >= self._closed_at:
            return True
        return self._budget is not None and thought >= self._budget

    def ends_thought(self, token_id: int) -> bool:
        """Whether ``token_id``, sampled now, is a stop that ends the thought rather than
        the response (then the caller takes :meth:`close_thought`'s first token instead)."""
        return self._state == THINKING and token_id in self._stops

    def close_thought(self) -> list[int]:
        """End the thought here, as a spent budget would: from now on only the end tag's
        tokens are allowed (and :meth:`jump_forward` forces them). Returns the tag's
        tokens still to come, which the caller takes in place of the stop token.

        Raises:
            ValueError: not thinking.
        """
        if self._state != THINKING:
            raise ValueError("the thought is already closed")
        if self._closed_at is None:
            self._closed_at = len(self._matched) - 1
        return list(self._tag.closing_ids(self._matched[-1]))

    # ---- GrammarMatcher --------------------------------------------------------------

    def accept_token(self, token_id: int) -> bool:
        if self._state >= 0:
            if self._inner.accept_token(token_id):
                self._state += 1
                return True
            return False
        if token_id in self._banned:
            return False
        matched = self._matched[-1]
        if self._closing() and token_id != self._tag.closing_ids(matched)[0]:
            return False
        matched, status = self._tag.step(matched, token_id)
        if status == RUNS_ON:
            return False
        self._matched.append(matched)
        if status:
            self._state = 0
        return True

    def rollback(self, num_tokens: int) -> None:
        if num_tokens <= 0:
            return
        answer = min(num_tokens, max(self._state, 0))
        if answer:
            self._inner.rollback(answer)
            self._state -= answer
            num_tokens -= answer
        if not num_tokens:
            return
        if self._initial == 0:
            raise ValueError("cannot roll back past the start of the answer")
        if num_tokens > len(self._matched) - 1:
            raise ValueError(f"cannot roll back {num_tokens} more tokens than were accepted")
        # The first step back from state 0 undoes the token that completed the tag.
        self._state = THINKING
        del self._matched[len(self._matched) - num_tokens :]
        if self._closed_at is not None and len(self._matched) - 1 <= self._closed_at:
            self._closed_at = None  # the tag's first token, taken for the stop, is undone

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        if self._state >= 0:
            self._inner.fill_bitmask(bitmask, row)
            return
        matched = self._matched[-1]
        if self._closing():
            allow_only(bitmask, row, self._tag.closing_ids(matched)[:1])
        else:
            bitmask[row].copy_(self._tag.thinking_row(matched, self._banned))

    def is_terminated(self) -> bool:
        return self._state >= 0 and self._inner.is_terminated()

    def jump_forward(self) -> list[int]:
        if self._state >= 0:
            return self._inner.jump_forward()
        if self._closing():
            return list(self._tag.closing_ids(self._matched[-1]))
        return []

    def validate_tokens(self, token_ids: Sequence[int]) -> int:
        # Thinking tokens are checked against a copy of the tag state; the answer part
        # goes to the inner matcher's own validation, so nothing is accepted and undone.
        if self._state >= 0:
            return self._inner.validate_tokens(token_ids)
        matched = self._matched[-1]
        thought = len(self._matched) - 1
        for n, token_id in enumerate(token_ids):
            if token_id in self._banned:
                return n
            if self._closing_after(thought) and token_id != self._tag.closing_ids(matched)[0]:
                return n
            matched, status = self._tag.step(matched, token_id)
            if status == RUNS_ON:
                return n
            thought += 1
            if status:
                return n + 1 + self._inner.validate_tokens(token_ids[n + 1 :])
        return len(token_ids)

    def copy(self) -> ReasoningGrammar:
        return ReasoningGrammar(
            self._inner.copy(),
            self._tag,
            reasoning=self._initial == THINKING,
            max_reasoning_tokens=self._budget,
            banned_while_thinking=self._banned,
            stops_ending_thought=self._stops,
        )
