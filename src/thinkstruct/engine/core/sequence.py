"""One request while the engine runs it: :class:`Sequence`, and where it is in its life
(:class:`RequestState`).

It holds what the three parts of the engine keep per request: the scheduler's state,
slot and pending tokens; the executor's grammar matcher, random generator, logit
adjustments and draft proposer; and the output processor that turns its tokens into
deltas (:class:`~thinkstruct.engine.output.processor.OutputProcessor`).
"""

from __future__ import annotations

import concurrent.futures
import enum
import secrets
from typing import TYPE_CHECKING

from thinkstruct.engine.request import FinishReason, GenerationRequest
from thinkstruct.engine.sampling.logit_adjustments import LogitAdjustments
from thinkstruct.engine.sampling.sampler import new_generator

if TYPE_CHECKING:
    import torch

    from thinkstruct.engine.core.handle import RequestHandle
    from thinkstruct.engine.output.checked_answer import CheckedAnswer
    from thinkstruct.engine.output.processor import OutputProcessor
    from thinkstruct.engine.sampling.speculation import NgramDrafter
    from thinkstruct.grammar.base import CompiledGrammar, GrammarMatcher
    from thinkstruct.grammar.runtime.opening_tokens import OpeningTokens
    from thinkstruct.grammar.runtime.value_checks import CheckFailure


class RequestState(enum.Enum):
    """Where a request is in its life (one value at a time)."""

    WAITING = "waiting"
    """Queued for a KV slot."""
    WAITING_FOR_GRAMMAR = "waiting_for_grammar"
    """Queued; its grammar is still compiling (others may pass it)."""
    PREFILLING = "prefilling"
    """Holds a slot; its prompt is being fed."""
    DECODING = "decoding"
    """Holds a slot; generating."""
    FINISHED = "finished"
    """Ended (its finish reason says why); its slot is free after the next layout."""


class Sequence:
    """A request being decoded.

    Attributes:
        state: where it is (the scheduler sets it).
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
        output: OutputProcessor,
        submitted_at: float,
    ) -> None:
        self.request = request
        self.handle = handle
        self.output = output
        self.params = request.sampling
        seed = self.params.seed if self.params.seed is not None else secrets.randbits(63)
        self.generator: torch.Generator = new_generator(seed)
        #: Set when the request is admitted (its grammar may still be compiling before).
        self.matcher: GrammarMatcher | None = None
        #: The tokens that open a call, where the answer's first token chooses between a
        #: call and another answer (set at admission).
        self.call_opening: OpeningTokens | None = None
        # Bias and the tokens penalties count, only for a request that uses them.
        self.adjustments = (
            LogitAdjustments(self.params, request.prompt_ids) if self.params.adjusts_logits else None
        )
        self.state = RequestState.WAITING
        self.slot = -1
        self.cached = 0
        self.pending: list[int] = list(request.prompt_ids)
        self.prompt_tokens = len(request.prompt_ids)
        self.cached_prompt_tokens = 0
        #: Bytes of keys and values it reserves while it holds a slot (the engine sets it
        #: at submit from its prompt and ``max_tokens``: what it can come to hold).
        self.kv_need = 0
        #: Every generated token fed or to be fed (stop tokens excepted), in order: the
        #: output's tokens plus those a checked value still holds back.
        self.generated_ids: list[int] = []
        #: The keywords its grammar cannot enforce, checked as values close (set at
        #: admission for a grammar with checks).
        self.checked: CheckedAnswer | None = None
        #: Tokens forbidden at a position (after a value starting there failed its check),
        #: and how many times a failed value was drawn again from there.
        self.bans: dict[int, set[int]] = {}
        self.tries: dict[int, int] = {}
        self.check_failure: CheckFailure | None = None
        #: The checked keyword the answer could not meet (it ended out of tries).
        self.unmet: CheckFailure | None = None
        self.rollbacks = 0
        self.resampled_tokens = 0
        #: Proposes speculative drafts from this request's context (set by the engine).
        self.drafter: NgramDrafter | None = None
        self.submitted_at = submitted_at
        self.finish_reason: FinishReason | None = None
        self.error: str | None = None

    @property
    def grammar_ready(self) -> bool:
        """Its grammar (if any) has compiled, or failed to."""
        grammar = self.request.grammar
        return not isinstance(grammar, concurrent.futures.Future) or grammar.done()

    @property
    def grammar(self) -> CompiledGrammar | None:
        """The compiled grammar (raises the compile's error for a failed one)."""
        grammar = self.request.grammar
        return grammar.result() if isinstance(grammar, concurrent.futures.Future) else grammar

    @property
    def backend(self) -> str | None:
        """The backend that holds its answer (``None``: no grammar, or one still compiling
        or failed to compile)."""
        grammar = self.request.grammar
        if isinstance(grammar, concurrent.futures.Future):
            if not grammar.done() or grammar.exception() is not None:
                return None
            grammar = grammar.result()
        return None if grammar is None else grammar.backend

    @property
    def counts_allowed(self) -> bool:
        return self.request.count_allowed_tokens

    @property
    def output_ids(self) -> list[int]:
        return self.output.output_ids

    @property
    def generated(self) -> int:
        """Tokens generated so far (those held back for a check included)."""
        return len(self.generated_ids)

    @property
    def position(self) -> int:
        """The position of the next token to sample."""
        return self.prompt_tokens + len(self.generated_ids)

    @property
    def context(self) -> list[int]:
        """The prompt and every generated token, in order."""
        return [*self.request.prompt_ids, *self.generated_ids]

    @property
    def stopped_by_string(self) -> bool:
        return self.output.stopped_by_string

    def end(
        self, reason: FinishReason, error: str | None = None, *, unmet: CheckFailure | None = None
    ) -> None:
        """Mark it finished (the first reason stands; ``unmet``: see :attr:`unmet`)."""
        if self.finish_reason is None:
            self.finish_reason = reason
            self.error = error
            self.unmet = unmet
        self.state = RequestState.FINISHED
