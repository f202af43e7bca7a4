"""The output processor: one request's generated tokens turned into the deltas its
caller reads (:class:`OutputProcessor`).

Per request it owns the incremental detokenizer, where the thought ends (at the token
level, :class:`ThoughtTracker`), the optional text-level reasoning parser (which splits
the text into ``reasoning`` and ``content``), the stop strings (applied to the answer
only, never inside the thought), the tool-call parser (the answer's calls as
:class:`~thinkstruct.parsers.tool_calls.types.ToolCallDelta` pieces), log-probabilities
and the counts that end up in :class:`~thinkstruct.engine.request.Usage`.

Nothing here touches the model, the KV cache or the grammar: the executor decides the
tokens, this turns them into text.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from thinkstruct.engine.output.detokenizer import IncrementalDetokenizer, TokenTexts
from thinkstruct.engine.output.stop_strings import StopStringMatcher
from thinkstruct.engine.request import Delta, FinishReason, TokenLogprob, Usage
from thinkstruct.engine.sampling.logprobs import SampledLogprob
from thinkstruct.grammar.runtime.end_tag import COMPLETES, RUNS_ON, EndTagMatcher
from thinkstruct.parsers.tool_calls.parser import ToolCallParser

if TYPE_CHECKING:
    from thinkstruct.engine.request import GenerationRequest
    from thinkstruct.grammar.runtime.value_checks import CheckFailure
    from thinkstruct.parsers.tool_calls.types import ToolCallDelta, ToolStreamResult


class ThoughtTracker:
    """Whether the next token is still inside the thought, from the tokens themselves.

    A request that reasons starts inside its thought; the token that completes the
    family's end tag (in one token or several) is the thought's last. This is what counts
    ``reasoning_tokens`` and keeps stop strings out of the thought, whether or not a
    text-level reasoning parser is present (``separate_reasoning: false`` has none).
    """

    __slots__ = ("_matched", "_tag", "thinking")

    def __init__(self, tag: EndTagMatcher | None, *, thinking: bool) -> None:
        self._tag = tag
        self._matched = 0
        self.thinking = thinking and tag is not None

    def step(self, token_id: int) -> bool:
        """Take one token; whether it belongs to the thought."""
        if not self.thinking or self._tag is None:
            return False
        self._matched, status = self._tag.step(self._matched, token_id)
        if status in (COMPLETES, RUNS_ON):
            self.thinking = False
        return True


class OutputProcessor:
    """Text, reasoning, tool calls and counts of one request's output.

    Args:
        request: the request (its parser, stop strings, tool calls, logprobs option).
        texts: the bytes each token id stands for.
        end_tag: the model family's end-of-thought tag matcher (``None``: the model has
            none; nothing is counted as thought then).
        stop_ids: tokens that end the output; they produce no text.
    """

    def __init__(
        self,
        request: GenerationRequest,
        *,
        texts: TokenTexts,
        end_tag: EndTagMatcher | None,
        stop_ids: frozenset[int],
    ) -> None:
        params = request.sampling
        self._logprobs = params.logprobs
        self._detok = IncrementalDetokenizer(texts)
        self._thought = ThoughtTracker(end_tag, thinking=request.reasoning)
        self._parser = request.reasoning_parser
        self._stops = StopStringMatcher(params.stop) if params.stop else None
        reading = request.tool_calls
        self._calls = ToolCallParser(reading.syntax, tools=reading.schemas) if reading is not None else None
        self._one_call = reading is not None and not reading.parallel
        self._stop_ids = stop_ids
        self.output_ids: list[int] = []
        self.reasoning_tokens = 0
        self.jump_forward_tokens = 0
        #: Per output token, the tokens its step's mask allowed (only when asked for).
        self.allowed_counts: list[int] | None = [] if request.count_allowed_tokens else None
        self.first_token_at: float | None = None

    @property
    def stopped_by_string(self) -> bool:
        return self._stops is not None and self._stops.stopped

    def add(
        self,
        token_ids: list[int],
        *,
        forced: int = 0,
        logprob: SampledLogprob | None = None,
        allowed: int = 0,
    ) -> Delta | None:
        """Record generated tokens (the last ``forced`` of them forced by the grammar) and
        return the delta of text they complete (``None`` if none yet).

        ``logprob`` belongs to the first (sampled) token; a forced token gets 0 (the
        grammar left it no alternative). ``allowed``: how many tokens the sampled one's
        mask allowed (recorded with ``count_allowed_tokens``)."""
        if self.first_token_at is None:
            self.first_token_at = time.monotonic()
        self.jump_forward_tokens += forced
        reasoning: list[str] = []
        content: list[str] = []
        calls: list[ToolCallDelta] = []
        visible: list[int] = []
        logprobs: list[TokenLogprob] = []
        for k, token_id in enumerate(token_ids):
            if token_id in self._stop_ids:
                continue
            visible.append(token_id)
            sampled = k < len(token_ids) - forced  # the first was sampled, the rest forced
            if self.allowed_counts is not None:
                self.allowed_counts.append(allowed if sampled else 1)
            thinking = self._thought.step(token_id)
            if thinking:
                self.reasoning_tokens += 1
            if self._logprobs is not None:
                logprobs.append(self._logprob(token_id, logprob if sampled else None, thinking))
            self._route(self._detok.add((token_id,)), thinking, reasoning, content, calls)
        self.output_ids.extend(visible)
        r, c = "".join(reasoning), "".join(content)
        if not r and not c and not visible and not calls:
            return None
        return Delta(
            reasoning=r,
            content=c,
            token_ids=tuple(visible),
            logprobs=tuple(logprobs),
            tool_calls=tuple(calls),
        )

    def finish(
        self,
        reason: FinishReason,
        error: str | None,
        *,
        submitted_at: float,
        prompt_tokens: int,
        cached_tokens: int,
        backend: str | None,
        check_rollbacks: int = 0,
        resampled_tokens: int = 0,
        unmet: CheckFailure | None = None,
    ) -> Delta:
        """The last delta: held-back text and calls, the finish reason, the usage (and
        ``unmet``: the checked keyword an answer out of tries could not meet)."""
        reasoning: list[str] = []
        content: list[str] = []
        calls: list[ToolCallDelta] = []
        self._route(self._detok.flush(), self._thought.thinking, reasoning, content, calls)
        if self._parser is not None:
            tail = self._parser.finish()
            reasoning.append(tail.reasoning)
            self._answer(tail.content, content, calls)
        if self._stops is not None:
            self._answer_text(self._stops.flush(), content, calls)
        if self._calls is not None:
            self._settled(self._calls.finish(), content, calls)
        usage = Usage(
            prompt_tokens=prompt_tokens,
            completion_tokens=len(self.output_ids),
            reasoning_tokens=self.reasoning_tokens,
            cached_tokens=cached_tokens,
            jump_forward_tokens=self.jump_forward_tokens,
            check_rollbacks=check_rollbacks,
            resampled_tokens=resampled_tokens,
            time_to_first_token_s=None if self.first_token_at is None else self.first_token_at - submitted_at,
            total_s=time.monotonic() - submitted_at,
            backend=backend,
            allowed_tokens=None if self.allowed_counts is None else tuple(self.allowed_counts),
        )
        return Delta(
            reasoning="".join(reasoning),
            content="".join(content),
            tool_calls=tuple(calls),
            finish_reason=reason,
            error=error,
            usage=usage,
            unmet=unmet,
        )

    # ---- text routing ----------------------------------------------------------------

    def _logprob(self, token_id: int, sampled: SampledLogprob | None, thinking: bool) -> TokenLogprob:
        if sampled is None:  # forced: the only token the grammar allowed
            top = ((token_id, 0.0),) if self._logprobs else ()
            return TokenLogprob(token_id=token_id, logprob=0.0, top=top, reasoning=thinking)
        return TokenLogprob(token_id=token_id, logprob=sampled[0], top=sampled[1], reasoning=thinking)

    def _route(
        self, text: str, thinking: bool, reasoning: list[str], content: list[str], calls: list[ToolCallDelta]
    ) -> None:
        if not text:
            return
        if self._parser is not None:
            parsed = self._parser.feed(text)
            if parsed.reasoning:
                reasoning.append(parsed.reasoning)
            self._answer(parsed.content, content, calls)
        elif thinking:
            content.append(text)  # the thought, told apart from nothing: no stops, no calls
        else:
            self._answer(text, content, calls)

    def _answer(self, text: str, content: list[str], calls: list[ToolCallDelta]) -> None:
        """Answer text: through the stop strings, then the tool-call parser."""
        if text:
            self._answer_text(self._stops.feed(text) if self._stops is not None else text, content, calls)

    def _answer_text(self, text: str, content: list[str], calls: list[ToolCallDelta]) -> None:
        if not text:
            return
        if self._calls is None:
            content.append(text)
            return
        self._settled(self._calls.feed(text), content, calls)

    def _settled(self, result: ToolStreamResult, content: list[str], calls: list[ToolCallDelta]) -> None:
        if result.content:
            content.append(result.content)
        calls.extend(c for c in result.calls if not (self._one_call and c.index > 0))
