"""One request's grammar inside vLLM: :class:`RequestGrammar` (no vLLM import).

vLLM's ``StructuredOutputGrammar`` interface (accept, validate, roll back, fill a bitmask
row, terminated, reset) over thinkstruct's per-request matcher:

- the matcher is the compiled grammar's, wrapped in
  :class:`~thinkstruct.grammar.runtime.reasoning.ReasoningGrammar` when the request thinks
  first (the thought free but for stop tokens, protocol tokens and tokens that would run
  from the end tag into the answer; its budget spent, the end tag forced);
- where the grammar has checked keywords, the answer's tokens also go through a
  :class:`~thinkstruct.grammar.runtime.closing_tokens.ClosingRule`: a token that would
  close a failing value is cleared from the mask, and one taken anyway (a draft) is
  refused, so a checked keyword never passes silently.

The vLLM class (:mod:`.backend`) subclasses this with vLLM's base class.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from thinkstruct.grammar.runtime.closing_tokens import ClosingRule
from thinkstruct.grammar.runtime.reasoning import ReasoningGrammar

if TYPE_CHECKING:
    import torch

    from thinkstruct.grammar.base import CompiledGrammar
    from thinkstruct.grammar.runtime.matcher import GrammarMatcher

log = logging.getLogger(__name__)


class RequestGrammar:
    """One request's grammar state.

    Args:
        compiled: the compiled grammar (shared).
        new_matcher: a fresh matcher at the start, as the request needs it (reasoning
            wrapper included); called again by :meth:`reset`.
        request_id: for log lines.
    """

    def __init__(
        self, compiled: CompiledGrammar, new_matcher: Callable[[], GrammarMatcher], *, request_id: str = ""
    ) -> None:
        self.compiled = compiled
        self._new_matcher = new_matcher
        self.request_id = request_id
        self.reset()

    def reset(self) -> None:
        """Back to the start."""
        self._matcher = self._new_matcher()
        checks = self.compiled.checks
        # A structural tag's checks are refused or ignored before a grammar is built.
        self._rule = None if checks is None else ClosingRule(checks, self.compiled.tokenizer)  # type: ignore[arg-type]
        #: Per token taken: whether the closing rule saw it (an answer token).
        self._answer: list[bool] = []

    # ---- the answer --------------------------------------------------------------------

    def _in_answer(self) -> bool:
        matcher = self._matcher
        return not isinstance(matcher, ReasoningGrammar) or matcher.state >= 0

    def _accept(self, token_id: int) -> bool:
        """Take one token; ``False`` (nothing changed) where the grammar or a check refuses it."""
        answer = self._in_answer()
        if not self._matcher.accept_token(token_id):
            return False
        if answer and self._rule is not None:
            failure = self._rule.accept(token_id)
            if failure is not None:
                self._matcher.rollback(1)
                log.warning(
                    "request %s: a token closes a failing value: %s", self.request_id, failure.describe()
                )
                return False
        self._answer.append(answer)
        return True

    # ---- vLLM's calls ------------------------------------------------------------------

    def accept_tokens(self, request_id: str, tokens: Sequence[int]) -> bool:
        """Take ``tokens`` in order; ``False`` at the first one refused (vLLM then ends the
        request)."""
        for token_id in tokens:
            if not self._accept(token_id):
                log.error("request %s: the grammar refuses token %d", request_id, token_id)
                return False
        return True

    def validate_tokens(self, tokens: Sequence[int]) -> list[int]:
        """The longest prefix of ``tokens`` this grammar takes; nothing changes."""
        taken = 0
        for token_id in tokens:
            if not self._accept(token_id):
                break
            taken += 1
        self.rollback(taken)
        return list(tokens[:taken])

    def rollback(self, num_tokens: int) -> None:
        """Take back the last ``num_tokens`` tokens."""
        if num_tokens <= 0:
            return
        undone = self._answer[len(self._answer) - num_tokens :]
        del self._answer[len(self._answer) - num_tokens :]
        if self._rule is not None:
            self._rule.rollback(sum(undone))
        self._matcher.rollback(num_tokens)

    def fill_bitmask(self, bitmask: torch.Tensor, index: int) -> None:
        """Write the allowed next tokens into ``bitmask[index]``."""
        self._matcher.fill_bitmask(bitmask, index)
        if self._rule is not None and self._in_answer():
            self._rule.restrict(bitmask, index)

    def is_terminated(self) -> bool:
        return self._matcher.is_terminated()


__all__ = ["RequestGrammar"]
