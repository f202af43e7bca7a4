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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from thinkstruct.parsers.tool_calls.types import ToolCall, ToolCallDelta

if TYPE_CHECKING:
    import concurrent.futures

    from thinkstruct.grammar.base import CompiledGrammar
    from thinkstruct.grammar.runtime.value_checks import CheckFailure
    from thinkstruct.parsers import ReasoningParser
    from thinkstruct.parsers.tool_calls.syntax import ToolCallSyntax
    from thinkstruct.parsers.tool_calls.types import ToolSchemas

#: Most stop strings one request may carry, and the longest one (characters).
MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256
#: Most alternatives :attr:`SamplingParams.logprobs` may ask for per token (OpenAI's limit).
MAX_TOP_LOGPROBS = 20
#: Largest magnitude of a :attr:`SamplingParams.logit_bias` value (OpenAI's range).
MAX_LOGIT_BIAS = 100.0


class InvalidSamplingParam(ValueError):
    """A sampling parameter out of range; ``field`` names it (``logit_bias.50000``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


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
        logprobs: return, per generated token, its log-probability and the ``logprobs``
            most likely alternatives (0 to :data:`MAX_TOP_LOGPROBS`); ``None``: none. The
            distribution is the one the grammar allowed: log-softmax of the logits after
            ``logit_bias``, the penalties and the grammar mask, at temperature 1, before
            ``min_p`` / top-k / top-p truncation (a forbidden token is never listed). A
            token the grammar forced (jump-forward) has log-probability 0.
        logit_bias: ``(token id, bias)`` pairs added to the logits, bias in [-100, 100];
            the grammar mask still wins (a forbidden token stays forbidden).
        presence_penalty: subtracted once from the logit of every token already in the
            output, in [-2, 2] (vLLM's semantics).
        frequency_penalty: subtracted from a token's logit once per time it is already in
            the output, in [-2, 2].
        repetition_penalty: > 0; the logit of a token in the prompt or the output is
            divided by it where positive and multiplied by it where negative (1: off).
        min_p: in [0, 1]; tokens whose probability (after temperature) is below ``min_p``
            times the most likely one's are not drawn (0: off; greedy rows ignore it).
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0

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
        self._check_options()

    def _check_options(self) -> None:
        if self.logprobs is not None and not (
            _integer(self.logprobs) and 0 <= self.logprobs <= MAX_TOP_LOGPROBS
        ):
            raise InvalidSamplingParam(
                "logprobs", f"logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}], got {self.logprobs!r}"
            )
        if not isinstance(self.logit_bias, tuple):
            raise InvalidSamplingParam("logit_bias", "logit_bias must be a tuple of (token id, bias) pairs")
        seen: set[int] = set()
        for pair in self.logit_bias:
            token = pair[0] if isinstance(pair, tuple) and len(pair) == 2 else None
            if not isinstance(token, int) or isinstance(token, bool) or token < 0 or token in seen:
                raise InvalidSamplingParam(
                    "logit_bias", f"logit_bias: {pair!r} is not a new (token id, bias) pair"
                )
            seen.add(token)
            if not _finite(pair[1]) or abs(pair[1]) > MAX_LOGIT_BIAS:
                raise InvalidSamplingParam(
                    f"logit_bias.{token}", f"logit_bias.{token} must be in [-100, 100], got {pair[1]!r}"
                )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _finite(value) or not -2 <= value <= 2:
                raise InvalidSamplingParam(name, f"{name} must be in [-2, 2], got {value!r}")
        if not _finite(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise InvalidSamplingParam(
                "repetition_penalty",
                f"repetition_penalty must be a number > 0, got {self.repetition_penalty!r}",
            )
        if not _finite(self.min_p) or not 0 <= self.min_p <= 1:
            raise InvalidSamplingParam("min_p", f"min_p must be in [0, 1], got {self.min_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    @property
    def adjusts_logits(self) -> bool:
        """Whether ``logit_bias`` or a penalty changes this request's logits."""
        return bool(self.logit_bias) or self.penalizes

    @property
    def penalizes(self) -> bool:
        """Whether a presence, frequency or repetition penalty is on."""
        return bool(self.presence_penalty or self.frequency_penalty) or self.repetition_penalty != 1.0


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _new_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True, slots=True)
class ToolCallReading:
    """How the answer's tool calls are read out of its text.

    Attributes:
        syntax: the model family's call syntax.
        schemas: the request's tools' ``parameters`` schemas (to read non-JSON syntaxes).
        parallel: more than one call may be made; with ``False`` only the first call is
            reported (the grammar allows one where it holds the calls).
        names: the tool each constrained call's begin text names (the structural tag's
            ``begin``), so that a checked keyword a call's arguments fail is reported
            with its tool's name.
        decides_call: the answer's grammar holds either the calls or another answer (a
            JSON one, beside ``tool_choice: "auto"``): at the answer's first token the
            model's own probability of opening a call (a token that begins the syntax's
            trigger), before the grammar's mask, decides which, as it does in free text
            (see :func:`~thinkstruct.engine.sampling.call_choice.draws_call`).
    """

    syntax: ToolCallSyntax
    schemas: ToolSchemas
    parallel: bool = True
    names: Mapping[str, str] = field(default_factory=dict)
    decides_call: bool = False


@dataclass(kw_only=True)
class GenerationRequest:
    """One generation, ready to decode.

    Attributes:
        prompt_ids: the rendered prompt's token ids.
        sampling: how tokens are picked.
        grammar: the compiled constraint on the answer (``None``: free text), or a future
            of it still compiling: the request keeps its place in the queue meanwhile
            (state ``waiting_for_grammar``) and is admitted once it resolves; a failed
            compile ends it with ``error`` (the caller, awaiting the same future, reports
            the failure and cancels the request).
        reasoning: the request reasons first; the same decision the chat template and the
            reasoning parser were given (``ChatPrompt.reasoning_enabled``).
        reasoning_parser: splits the output into reasoning and content; ``None`` sends all
            text to ``content``.
        max_reasoning_tokens: thinking budget; once spent, the end of the thought is forced.
        tool_calls: read the answer's tool calls out of its text (``None``: none are read).
        count_allowed_tokens: record, per generated token, how many tokens the grammar
            allowed at that step (:attr:`Usage.allowed_tokens`; one popcount of the filled
            mask row per step, never the mask itself). For the playground's plot.
        request_id: a unique id for logs and cancellation.
    """

    prompt_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    grammar: CompiledGrammar | concurrent.futures.Future[CompiledGrammar] | None = None
    reasoning: bool = False
    reasoning_parser: ReasoningParser | None = None
    max_reasoning_tokens: int | None = None
    tool_calls: ToolCallReading | None = None
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
    #: Values that failed a checked keyword and were generated again, and the tokens
    #: taken back for them (never sent to the caller).
    check_rollbacks: int = 0
    resampled_tokens: int = 0
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
class TokenLogprob:
    """One generated token's log-probability (natural log) under the distribution the
    grammar allowed (see :attr:`SamplingParams.logprobs`).

    Attributes:
        token_id: the token.
        logprob: its log-probability.
        top: the most likely tokens and their log-probabilities, most likely first (as many
            as asked for, fewer where the grammar allowed fewer).
        reasoning: the token belongs to the thought (the reasoning parser was inside it).
    """

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    reasoning: bool = False


@dataclass(frozen=True, slots=True)
class Delta:
    """One event on a request's stream: new text, then finally why it ended.

    ``logprobs`` (only when the request asked) has one entry per id of ``token_ids``;
    ``tool_calls`` are the pieces of the answer's calls this delta settled (the text they
    were read from is not in ``content``)."""

    reasoning: str = ""
    content: str = ""
    tool_calls: tuple[ToolCallDelta, ...] = ()
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()
    finish_reason: FinishReason | None = None
    error: str | None = None
    usage: Usage | None = None
    #: With ``finish_reason`` error: the checked keyword the answer could not meet (its
    #: tries ran out), naming the keyword and the JSON pointers; ``None`` for other errors.
    unmet: CheckFailure | None = None


@dataclass(frozen=True, slots=True)
class Completion:
    """A whole request's output (the stream's deltas joined)."""

    reasoning: str
    content: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason
    error: str | None
    usage: Usage | None
    logprobs: tuple[TokenLogprob, ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()
    #: See :attr:`Delta.unmet`.
    unmet: CheckFailure | None = None


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
        logprobs=tuple(lp for d in deltas for lp in d.logprobs),
        tool_calls=join_calls(c for d in deltas for c in d.tool_calls),
        unmet=last.unmet,
    )


def join_calls(pieces: Iterable[ToolCallDelta]) -> tuple[ToolCall, ...]:
    """Streamed call pieces joined per index into whole calls, in index order."""
    names: dict[int, str] = {}
    arguments: dict[int, list[str]] = {}
    for piece in pieces:
        if piece.name is not None:
            names.setdefault(piece.index, piece.name)
        arguments.setdefault(piece.index, []).append(piece.arguments)
    return tuple(
        ToolCall(index=i, name=names.get(i, ""), arguments="".join(arguments[i])) for i in sorted(arguments)
    )
