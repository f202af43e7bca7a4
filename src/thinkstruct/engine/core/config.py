"""How an engine is configured and what it takes: :class:`EngineConfig`, :class:`EngineStats`,
the refusals a caller can retry (:class:`EngineOverloaded`, :class:`KvCacheFull`,
:class:`EngineClosed`), :class:`KvBudgetExceeded`, and :func:`check_request`, what
:meth:`~thinkstruct.engine.core.engine.Engine.submit` refuses, checked without an engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from thinkstruct.engine.kv.budget import DEFAULT_KV_BYTES, DEFAULT_PREFIX_BYTES
from thinkstruct.engine.request import FinishReason, GenerationRequest, InvalidSamplingParam
from thinkstruct.engine.sampling.speculation import SpeculationConfig

_MIB = 1 << 20

#: Most keys and values, in KV budgets, that the requests running and waiting may need
#: together: a request arriving past that is refused (:class:`KvCacheFull`) rather than
#: queued, since the ones before it hold the budget and another budget's worth waits
#: for it.
KV_DEMAND_BUDGETS = 2


#: What a KV cache may be told to hold (``EngineConfig.kv_cache_dtype``, ``--kv-cache-dtype``).
KvCacheDtype = Literal["float16", "float32"]
KV_CACHE_DTYPES: tuple[KvCacheDtype, ...] = get_args(KvCacheDtype)

#: Seconds a decoding step should take by default (``EngineConfig.step_latency_target_s``):
#: SmolLM2's decoding step of 64 rows (the default ``max_batch``) took 68 ms at best on two
#: cores of an AMD EPYC (``benchmarks/batch_kernels.py``, positions 30-200, float16 KV; 76 ms
#: in float32), so 100 ms lets the batch reach the cap there and holds it lower where steps
#: are slower.
DEFAULT_STEP_LATENCY_TARGET_S = 0.1


class EngineOverloaded(RuntimeError):
    """The queue is full; try again later (HTTP 429).

    Attributes:
        retry_after_s: seconds after which a retry may be taken.
        code: the refusal's name in an API error (``queue_full``).
    """

    code = "queue_full"

    def __init__(self, queued: int, retry_after_s: float, *, message: str | None = None) -> None:
        super().__init__(
            message or f"the engine has {queued} requests waiting; try again in {retry_after_s:.0f} s"
        )
        self.retry_after_s = retry_after_s


class KvCacheFull(EngineOverloaded):
    """The requests running and waiting already need the keys and values the budget holds
    and as much again: one more would wait for memory longer than the running ones take
    to finish; try again later (HTTP 429)."""

    code = "kv_cache_full"

    def __init__(self, *, demand: int, allowed: int, retry_after_s: float) -> None:
        super().__init__(
            0,
            retry_after_s,
            message=f"the requests running and waiting need {demand / _MIB:.1f} MiB of keys and values against "
            f"{allowed / _MIB:.1f} MiB allowed to run at once (--kv-cache-bytes); try again in {retry_after_s:.0f} s",
        )


class KvBudgetExceeded(InvalidSamplingParam):
    """One request needs more keys and values than the running requests' whole budget
    holds (HTTP 400 naming ``max_tokens``, or the prompt when it alone is too long)."""

    def __init__(self, *, prompt_tokens: int, max_tokens: int, max_positions: int) -> None:
        field_name = "max_tokens" if prompt_tokens < max_positions else "prompt"
        super().__init__(
            field_name,
            f"the prompt ({prompt_tokens} tokens) and max_tokens ({max_tokens}) need more keys and values than "
            f"this server's KV budget (--kv-cache-bytes) gives one request: {max_positions} positions in all",
        )


class EngineClosed(RuntimeError):
    """The engine is shutting down or stopped (HTTP 503)."""


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """How the engine schedules.

    Attributes:
        max_batch: most requests decoded together (slots of the KV cache): the hard cap
            on the batch, which follows ``step_latency_target_s`` below it.
        step_latency_target_s: seconds a decoding step (every running row's time per
            token) should take: requests take slots while the steps stay within it (and
            the KV budget holds them), and the prompt positions of a prefill pass between
            two steps are sized against it too
            (:class:`~thinkstruct.engine.core.batch_size.TargetedSize`); ``None`` keeps
            the batch at ``max_batch`` and passes at ``prefill_chunk``.
        max_queue: most requests waiting for a slot; more are refused with
            :class:`EngineOverloaded`.
        max_prompt_tokens: longest prompt accepted (default: the model's context minus one).
        prefill_chunk: most positions computed per prefill pass (the
            tokens fed, or, on a runner without ``packs_tokens``, rows x the longest
            chunk). A joining prompt's first token waits for its whole pass, and a prompt
            arriving during a pass for the rest of it: 256 positions are about 0.5 s at
            int8 on two cores under load (512 gave a plain question's p99 time to first
            token above 2 s at 64 clients; prefill was a quarter of the engine's time
            either way). While rows decode, a pass takes fewer where
            ``step_latency_target_s`` asks.
        decode_positions: positions a decoding step may compute, at least one per row. A
            row feeds its sampled token and the tokens its grammar forces; the pass is
            padded to the longest row (for attention only on a runner that
            ``packs_tokens``), so forced tokens past ``decode_positions // rows``
            wait for the next step (that row does not sample then) instead of making
            every row of a large batch pay for them.
        idle_poll_s: how long the idle engine thread sleeps between checks.
        kv_cache_bytes: most bytes of keys and values the running requests reserve
            together (:mod:`~thinkstruct.engine.kv.budget`): each reserves what its prompt
            and ``max_tokens`` can come to (within the context) when it takes a slot, and
            waits in the queue while that does not fit; a request needing more than all
            of it is refused (:class:`KvBudgetExceeded`), and one arriving while the
            running and waiting ones need twice the budget is refused with
            :class:`KvCacheFull`.
        prefix_cache_bytes: most bytes of keys and values of finished requests kept for
            requests that start the same way (:mod:`~thinkstruct.engine.kv.prefix_cache`: a
            chat's next turn, a repeated system prompt); 0 keeps none.
        kv_cache_dtype: what the KV cache holds (``float16`` or ``float32``); ``None``:
            float16 where the compiled kernels run the model, else the model's dtype (see
            :class:`~thinkstruct.engine.runners.decoder_runner.DecoderRunner`). Only the
            decoder runner takes a choice.
        check_tries_per_value: most times a value that fails a checked keyword (one no
            grammar enforces: :mod:`~thinkstruct.engine.output.checked_answer`) is generated
            again at one position before the request ends with an error naming it.
        check_tries_per_request: most such retries in one request.
        masks_during_forward: fill grammar masks on a helper thread while the forward pass
            runs (the libraries release the GIL); ``None``: where a core is left over
            beside torch's threads (:func:`~thinkstruct.engine.core.executor.spare_core`) or
            a decoding step has at least
            :data:`~thinkstruct.engine.core.executor.MASKS_DURING_FORWARD_ROWS` constrained
            rows, else after the pass.
        speculation: n-gram drafts verified in the decoding pass
            (:mod:`~thinkstruct.engine.sampling.speculation`), on a batch-invariant runner only
            (there a seed gives the same tokens with and without); ``None`` turns it off.
    """

    max_batch: int = 64
    step_latency_target_s: float | None = DEFAULT_STEP_LATENCY_TARGET_S
    max_queue: int = 256
    max_prompt_tokens: int | None = None
    prefill_chunk: int = 256
    decode_positions: int = 64
    idle_poll_s: float = 0.05
    kv_cache_bytes: int = DEFAULT_KV_BYTES
    prefix_cache_bytes: int = DEFAULT_PREFIX_BYTES
    kv_cache_dtype: KvCacheDtype | None = None
    check_tries_per_value: int = 8
    check_tries_per_request: int = 32
    masks_during_forward: bool | None = None
    speculation: SpeculationConfig | None = field(default_factory=SpeculationConfig)

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_queue < 0 or self.prefill_chunk < 1 or self.decode_positions < 1:
            raise ValueError("max_batch, prefill_chunk and decode_positions must be >= 1 and max_queue >= 0")
        if self.step_latency_target_s is not None and not self.step_latency_target_s > 0:
            raise ValueError("step_latency_target_s must be positive, or None for a fixed batch")
        if self.prefix_cache_bytes < 0:
            raise ValueError("prefix_cache_bytes must be >= 0")
        if self.kv_cache_bytes < 1:
            raise ValueError(
                "kv_cache_bytes must be positive: it bounds the running requests' keys and values "
                "(the prefix cache's budget is prefix_cache_bytes)"
            )
        if self.kv_cache_dtype is not None and self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"kv_cache_dtype must be {', '.join(KV_CACHE_DTYPES)} or None, got {self.kv_cache_dtype!r}"
            )
        if self.check_tries_per_value < 0 or self.check_tries_per_request < 0:
            raise ValueError("check_tries_per_value and check_tries_per_request must be >= 0")


@dataclass
class EngineStats:
    """Counters for monitoring (read from any thread; written by the engine thread)."""

    running: int = 0
    waiting: int = 0
    steps: int = 0
    prefill_tokens: int = 0
    #: Prompt tokens copied from another slot or the prefix cache instead of computed.
    prefix_reused_tokens: int = 0
    #: Of those, from the prefix cache (finished requests' keys and values).
    prefix_cache_hit_tokens: int = 0
    #: Bytes and blocks the prefix cache holds, and blocks it evicted to stay within budget.
    prefix_cache_bytes: int = 0
    prefix_cache_blocks: int = 0
    prefix_cache_evicted_blocks: int = 0
    #: Bytes the prefix cache may hold (its budget).
    prefix_cache_allowed_bytes: int = 0
    #: Bytes of keys and values the running requests reserved, and may reserve together.
    kv_cache_reserved_bytes: int = 0
    kv_cache_allowed_bytes: int = 0
    #: Bytes of the KV pools ever touched: the memory they take (at most both budgets).
    kv_pool_bytes: int = 0
    #: Requests refused because the running and waiting ones needed the KV budget twice.
    kv_refused: int = 0
    #: Draft tokens fed for verification, and of those the ones kept (speculation).
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    generated_tokens: int = 0
    jump_forward_tokens: int = 0
    #: Values generated again after failing a checked keyword, and the tokens taken back.
    check_rollbacks: int = 0
    resampled_tokens: int = 0
    #: Requests that ended because a checked keyword could not be met (out of tries), by
    #: keyword.
    checks_unmet: dict[str, int] = field(default_factory=dict)
    finished: dict[str, int] = field(default_factory=lambda: {r.value: 0 for r in FinishReason})
    #: Seconds of the last decoding step, and of all of them; of those, in the forward pass
    #: and waiting for / applying grammar masks after it (the rest: sampling, grammars,
    #: detokenizing, parsing, streaming).
    last_step_s: float = 0.0
    step_seconds: float = 0.0
    forward_seconds: float = 0.0
    mask_seconds: float = 0.0
    last_batch: int = 0
    #: Rows of the largest decoding step so far.
    largest_batch: int = 0
    #: Requests the batch takes now (slots it admits into), and the prompt positions of a
    #: prefill pass while rows decode: what the step latency target gives, within the caps.
    batch_limit: int = 0
    prefill_chunk: int = 0
    #: KV cache slots holding a request (running or prefilling) and the tokens cached in
    #: them, as the last round of the engine loop left them; a finished or cancelled
    #: request's slot is free by the end of the round that drops it.
    slots_used: int = 0
    kv_tokens: int = 0


def prompt_token_limit(configured: int | None, context_length: int) -> int:
    """The longest prompt an engine takes: ``configured`` (``None``: no own limit), capped so
    that at least one token can be generated within ``context_length``."""
    return min(configured or context_length - 1, context_length - 1)


def check_request(request: GenerationRequest, *, vocab_size: int, max_prompt_tokens: int) -> None:
    """What :meth:`Engine.submit` refuses, checked without an engine (a cluster's ingress
    checks here before sending a request to a replica).

    Raises:
        ValueError: empty or too long prompt, ids outside the vocabulary, a negative
            thinking budget; the message names the problem.
        InvalidSamplingParam: a ``logit_bias`` id outside the vocabulary.
    """
    prompt = request.prompt_ids
    if not prompt:
        raise ValueError("the prompt is empty")
    if len(prompt) > max_prompt_tokens:
        raise ValueError(f"the prompt has {len(prompt)} tokens; this model takes at most {max_prompt_tokens}")
    if any(not 0 <= t < vocab_size for t in prompt):
        raise ValueError(f"prompt token ids must be in [0, {vocab_size})")
    for token, _ in request.sampling.logit_bias:
        if token >= vocab_size:
            raise InvalidSamplingParam(
                f"logit_bias.{token}", f"logit_bias.{token}: token ids must be in [0, {vocab_size})"
            )
    if request.max_reasoning_tokens is not None and request.max_reasoning_tokens < 0:
        raise ValueError("max_reasoning_tokens must be >= 0")
