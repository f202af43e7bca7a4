"""One request while the engine runs it: :class:`Sequence`.

It owns everything per request that turns sampled tokens into deltas: the grammar matcher,
the incremental detokenizer, the reasoning parser, the stop-string matcher, and the
counts that end up in :class:`~thinkstruct.engine.request.Usage`. The scheduler owns only
where it sits (its slot) and what it feeds next.
"""

from __future__ import annotations

import secrets
import time
from typing import TYPE_CHECKING

from thinkstruct.engine.detokenizer import IncrementalDetokenizer, TokenTexts
from thinkstruct.engine.logit_adjustments import LogitAdjustments
from thinkstruct.engine.request import Delta, FinishReason, GenerationRequest, TokenLogprob, Usage
from thinkstruct.engine.sampler import new_generator
from thinkstruct.engine.stop_strings import StopStringMatcher

if TYPE_CHECKING:
    import torch

    from thinkstruct.engine.handle import RequestHandle
    from thinkstruct.engine.speculation import NgramDrafter
    from thinkstruct.grammar.base import GrammarMatcher


class Sequence:
    """A request being decoded.

    Attributes:
        slot: its row in the KV cache (the scheduler sets it).
        cached: tokens its slot holds.
        pending: tokens to feed at the next forward pass (the prompt, in chunks, then the
            last sampled token and any tokens the grammar forced after it).
    """

    def __init__(
        self,
        request: GenerationRequest,
        handle: RequestHandle,
        *,
        texts: TokenTexts,
        matcher: GrammarMatcher | None,
        stop_ids: frozenset[int],
        submitted_at: float,
    ) -> None:
        self.request = request
        self.handle = handle
        self.params = request.sampling
        seed = self.params.seed if self.params.seed is not None else secrets.randbits(63)
        self.generator: torch.Generator = new_generator(seed)
        self.matcher = matcher
        self.parser = request.reasoning_parser
        self.stops = StopStringMatcher(self.params.stop) if self.params.stop else None
        # Bias and the tokens penalties count, only for a request that uses them.
        self.adjustments = (
            LogitAdjustments(self.params, request.prompt_ids) if self.params.adjusts_logits else None
        )
        self._detok = IncrementalDetokenizer(texts)
        self._stop_ids = stop_ids
        self.slot = -1
        self.cached = 0
        self.pending: list[int] = list(request.prompt_ids)
        self.prompt_tokens = len(request.prompt_ids)
        self.cached_prompt_tokens = 0
        self.output_ids: list[int] = []
        #: Proposes speculative drafts from this request's context (set by the engine).
        self.drafter: NgramDrafter | None = None
        self.reasoning_tokens = 0
        self.jump_forward_tokens = 0
        # Per output token, the tokens its step's mask allowed (only when asked for);
        # allowed_now is the count of the mask the next sampled token is drawn under.
        self.allowed_counts: list[int] | None = [] if request.count_allowed_tokens else None
        self.allowed_now = 0
        self.submitted_at = submitted_at
        self.first_token_at: float | None = None
        self.finish_reason: FinishReason | None = None
        self.error: str | None = None

    @property
    def prefilling(self) -> bool:
        """Still feeding its prompt (no token generated yet)."""
        return self.first_token_at is None

    @property
    def generated(self) -> int:
        return len(self.output_ids)

    # ---- tokens in -------------------------------------------------------------------

    def add_tokens(
        self,
        token_ids: list[int],
        *,
        forced: int = 0,
        logprob: tuple[float, tuple[tuple[int, float], ...]] | None = None,
    ) -> Delta | None:
        """Record generated tokens (the last ``forced`` of them forced by the grammar), and
        the delta of text they complete (``None`` if none yet).

        ``logprob`` is the sampled (first) token's log-probability and most likely
        alternatives, for a request that asked for them; a forced token gets 0 (the
        grammar left it no alternative)."""
        if self.first_token_at is None:
            self.first_token_at = time.monotonic()
        self.jump_forward_tokens += forced
        if self.adjustments is not None:
            self.adjustments.add(token_ids)
        reasoning: list[str] = []
        content: list[str] = []
        visible: list[int] = []
        logprobs: list[TokenLogprob] = []
        for k, token_id in enumerate(token_ids):
            if token_id in self._stop_ids:
                continue
            visible.append(token_id)
            sampled = k < len(token_ids) - forced  # the first was sampled, the rest forced
            if self.allowed_counts is not None:
                self.allowed_counts.append(self.allowed_now if sampled else 1)
            thinking = self.parser is not None and self.parser.in_reasoning
            if thinking:
                self.reasoning_tokens += 1
            if self.params.logprobs is not None:
                logprobs.append(self._logprob(token_id, logprob if sampled else None, thinking))
            self._route(self._detok.add((token_id,)), reasoning, content)
        self.output_ids.extend(visible)
        return self._delta(reasoning, content, visible, logprobs)

    def _logprob(
        self, token_id: int, sampled: tuple[float, tuple[tuple[int, float], ...]] | None, thinking: bool
    ) -> TokenLogprob:
        if sampled is None:  # forced: the only token the grammar allowed
            top = ((token_id, 0.0),) if self.params.logprobs else ()
            return TokenLogprob(token_id=token_id, logprob=0.0, top=top, reasoning=thinking)
        return TokenLogprob(token_id=token_id, logprob=sampled[0], top=sampled[1], reasoning=thinking)

    def finish(self, reason: FinishReason, error: str | None = None) -> Delta:
        """The last delta: held-back text, the finish reason, the usage."""
        if self.finish_reason is None:
            self.finish_reason = reason
            self.error = error
        reasoning: list[str] = []
        content: list[str] = []
        self._route(self._detok.flush(), reasoning, content)
        if self.parser is not None:
            tail = self.parser.finish()
            reasoning.append(tail.reasoning)
            self._content(tail.content, content)
        if self.stops is not None:
            content.append(self.stops.flush())
        now = time.monotonic()
        usage = Usage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.generated,
            reasoning_tokens=self.reasoning_tokens,
            cached_tokens=self.cached_prompt_tokens,
            jump_forward_tokens=self.jump_forward_tokens,
            time_to_first_token_s=None
            if self.first_token_at is None
            else self.first_token_at - self.submitted_at,
            total_s=now - self.submitted_at,
            backend=self.request.grammar.backend if self.request.grammar is not None else None,
            allowed_tokens=None if self.allowed_counts is None else tuple(self.allowed_counts),
        )
        return Delta(
            reasoning="".join(reasoning),
            content="".join(content),
            finish_reason=self.finish_reason,
            error=self.error,
            usage=usage,
        )

    @property
    def stopped_by_string(self) -> bool:
        return self.stops is not None and self.stops.stopped

    # ---- text routing ----------------------------------------------------------------

    def _route(self, text: str, reasoning: list[str], content: list[str]) -> None:
        if not text:
            return
        if self.parser is None:
            self._content(text, content)
            return
        parsed = self.parser.feed(text)
        if parsed.reasoning:
            reasoning.append(parsed.reasoning)
        self._content(parsed.content, content)

    def _content(self, text: str, content: list[str]) -> None:
        if not text:
            return
        # Stop strings end the answer; the thought is free to mention them.
        content.append(self.stops.feed(text) if self.stops is not None else text)

    @staticmethod
    def _delta(
        reasoning: list[str], content: list[str], ids: list[int], logprobs: list[TokenLogprob]
    ) -> Delta | None:
        r, c = "".join(reasoning), "".join(content)
        if not r and not c and not ids:
            return None
        return Delta(reasoning=r, content=c, token_ids=tuple(ids), logprobs=tuple(logprobs))
