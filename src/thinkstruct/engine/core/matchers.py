"""Each request's token matcher and answer checks: :class:`RequestMatchers`.

A request's matcher is its grammar's (thought included), the thinking budget's for free
text that reasons under a budget (:mod:`~thinkstruct.engine.core.thinking_budget`), or
none; a stop token sampled in the thought ends the thought, not the response. A grammar
with checked keywords also gets a :class:`~thinkstruct.engine.output.checked_answer.CheckedAnswer`.
Both are built when the request takes a slot, on the engine thread.
"""

from __future__ import annotations

import concurrent.futures
from typing import TYPE_CHECKING

from thinkstruct.engine.core.thinking_budget import thinking_budget_matcher
from thinkstruct.engine.output.checked_answer import CheckedAnswer
from thinkstruct.grammar.runtime.end_tag import end_tag_matcher
from thinkstruct.grammar.runtime.opening_tokens import OpeningTokens, opening_tokens

if TYPE_CHECKING:
    from thinkstruct.engine.output.detokenizer import TokenTexts
    from thinkstruct.engine.request import GenerationRequest
    from thinkstruct.grammar.base import CompiledGrammar, GrammarMatcher
    from thinkstruct.parsers import ReasoningFamily
    from thinkstruct.tokenizer import Tokenizer


class RequestMatchers:
    """Matchers and checks for the requests of one model.

    Args:
        tokenizer: the model's tokenizer (a grammar must be compiled for it).
        family: the model's reasoning family (its end tag, the texts banned in a thought).
        texts: the bytes each token id stands for.
        stop_ids: tokens that end an output.
    """

    def __init__(
        self, tokenizer: Tokenizer, family: ReasoningFamily, *, texts: TokenTexts, stop_ids: frozenset[int]
    ) -> None:
        self.tokenizer = tokenizer
        self._texts = texts
        self._stop_ids = stop_ids
        self._end_tag = family.think_end
        #: The family's end-of-thought tag, matched in token bytes.
        self.end_tag = end_tag_matcher(tokenizer, family.think_end)
        self._banned_while_thinking = tokenizer.single_ids(family.banned_while_thinking)

    def check_grammar(self, grammar: CompiledGrammar) -> None:
        """Raises:
        ValueError: ``grammar`` was compiled for another tokenizer."""
        if grammar.tokenizer is not self.tokenizer:
            raise ValueError("the grammar was compiled for another tokenizer")

    def matcher(self, request: GenerationRequest) -> GrammarMatcher | None:
        """The request's token matcher (its grammar must be ready: compiled, not still a
        future); ``None`` for free text without a thinking budget.

        Raises:
            Exception: the grammar's compile failed (its error), or it is for another
                tokenizer.
        """
        grammar = request.grammar
        if isinstance(grammar, concurrent.futures.Future):
            grammar = grammar.result()
        if grammar is None:
            if request.reasoning and request.max_reasoning_tokens is not None:
                return thinking_budget_matcher(
                    self.tokenizer,
                    max_reasoning_tokens=request.max_reasoning_tokens,
                    end_tag=self._end_tag,
                    banned_ids_while_thinking=self._banned_while_thinking,
                )
            return None
        self.check_grammar(grammar)
        return grammar.matcher(
            reasoning=request.reasoning,
            max_reasoning_tokens=request.max_reasoning_tokens,
            stops_end_thought=True,
            banned_ids_while_thinking=self._banned_while_thinking,
            end_tag=self._end_tag,
        )

    def call_opening(self, request: GenerationRequest) -> OpeningTokens | None:
        """The tokens that open a call where the model chooses between a call and another
        answer at the answer's first token (``ToolCallReading.decides_call``); ``None``
        elsewhere."""
        calls = request.tool_calls
        if calls is None or not calls.decides_call or request.grammar is None:
            return None
        form = calls.syntax.form
        return None if form is None else opening_tokens(self.tokenizer, form.trigger)

    def checked(self, request: GenerationRequest, grammar: CompiledGrammar | None) -> CheckedAnswer | None:
        """The checks of the keywords ``grammar`` (the request's, ready) cannot enforce, fed
        the answer as it is generated; ``None`` where it has none."""
        if grammar is None or grammar.checks is None:
            return None
        calls = request.tool_calls
        return CheckedAnswer(
            grammar.checks,
            texts=self._texts,
            end_tag=self.end_tag,
            thinking=request.reasoning,
            stop_ids=self._stop_ids,
            names=None if calls is None else calls.names,
        )
