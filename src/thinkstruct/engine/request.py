"""What a caller hands the engine, and what comes back.

A :class:`GenerationRequest` carries token ids, not text: rendering the chat template and
compiling the constraint happen before the request reaches the engine (the server does
both on its own threads), so the engine thread only decodes. Everything that comes back
is a :class:`Delta` on the request's stream; the last one carries the finish reason and
the :class:`Usage`.
"""

from __future__ import annotations

import enum
import math
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from thinkstruct.grammar.base import CompiledGrammar
    from thinkstruct.parsers import ReasoningParser

#: Most stop strings one request may carry, and the longest one (characters).
MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256


@dataclass(frozen=True, kw_only=True, slots=True)
class SamplingParams:
    """How one request picks its tokens.

    Attributes:
        max_tokens: most tokens generated (reasoning tokens included), >= 1.
        temperature: softmax temperature, >= 0; 0 picks the most likely token (greedy).
        top_p: nucleus sampling mass in (0, 1]; 1 disables it.
        top_k: sample among the ``top_k`` most likely tokens; 0 disables it.
        seed: seeds this request's own random generator, so its output does not depend on
            other requests in the batch; ``None`` draws a fresh seed.
        stop: strings that end the answer where they first appear (not included in it).
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if not _finite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not _finite(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0, got {self.top_k!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if not isinstance(self.stop, tuple) or not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError("stop must be a tuple of non-empty strings")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise ValueError(f"stop takes at most {MAX_STOP_STRINGS} strings, got {len(self.stop)}")
        if any(len(s) > MAX_STOP_LENGTH for s in self.stop):
            raise ValueError(f"each stop string may have at most {MAX_STOP_LENGTH} characters")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _new_id() -> str:
    return uuid.uuid4().hex


@dataclass(kw_only=True)
class GenerationRequest:
    """One generation, ready to decode.

    Attributes:
        prompt_ids: the rendered prompt's token ids.
        sampling: how tokens are picked.
        grammar: the compiled constraint on the answer (``None``: free text).
        reasoning: the request reasons first; the same decision the chat template and the
            reasoning parser were given (``ChatPrompt.reasoning_enabled``).
        reasoning_parser: splits the output into reasoning and content; ``None`` sends all
            text to ``content``.
        max_reasoning_tokens: thinking budget; once spent, the end of the thought is forced.
        count_allowed_tokens: record, per generated token, how many tokens the grammar
            allowed at that step (:attr:`Usage.allowed_tokens`; one popcount of the filled
            mask row per step, never the mask itself). For the playground's plot.
        request_id: a unique id for logs and cancellation.
    """

    prompt_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    grammar: CompiledGrammar | None = None
    reasoning: bool = False
    reasoning_parser: ReasoningParser | None = None
    max_reasoning_tokens: int | None = None
    count_allowed_tokens: bool = False
    request_id: str = field(default_factory=_new_id)


class FinishReason(str, enum.Enum):
    """Why a request stopped."""

    STOP = "stop"
    """The model or the grammar ended the answer, or a stop string appeared."""
    LENGTH = "length"
    """``max_tokens`` or the model's context was reached."""
    ABORT = "abort"
    """The caller cancelled it, or the engine shut down before it finished."""
    ERROR = "error"
    """Something failed in this request's own path; the error says what."""


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts and timings of one finished request."""

    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int = 0
    #: Prompt tokens whose keys and values were copied from another request holding the
    #: same prefix, not computed (only on a batch-invariant runner).
    cached_tokens: int = 0
    #: Tokens the grammar forced (appended without a sampling step).
    jump_forward_tokens: int = 0
    #: Seconds from submission to the first generated token.
    time_to_first_token_s: float | None = None
    #: Seconds from submission to the end.
    total_s: float | None = None
    #: The grammar backend that held the answer, if any.
    backend: str | None = None
    #: With ``count_allowed_tokens``: per output token (stop tokens excluded, so one per
    #: entry of the output ids), how many tokens the mask allowed when it was chosen; 1
    #: for a token forced by jump-forward, the vocabulary size where nothing constrained it.
    allowed_tokens: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class Delta:
    """One event on a request's stream: new text, then finally why it ended."""

    reasoning: str = ""
    content: str = ""
    token_ids: tuple[int, ...] = ()
    finish_reason: FinishReason | None = None
    error: str | None = None
    usage: Usage | None = None


@dataclass(frozen=True, slots=True)
class Completion:
    """A whole request's output (the stream's deltas joined)."""

    reasoning: str
    content: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason
    error: str | None
    usage: Usage | None


def join_deltas(deltas: list[Delta]) -> Completion:
    """The :class:`Completion` a finished stream adds up to."""
    last = deltas[-1] if deltas else Delta(finish_reason=FinishReason.ABORT)
    return Completion(
        reasoning="".join(d.reasoning for d in deltas),
        content="".join(d.content for d in deltas),
        token_ids=tuple(t for d in deltas for t in d.token_ids),
        finish_reason=last.finish_reason or FinishReason.ABORT,
        error=last.error,
        usage=last.usage,
    )
