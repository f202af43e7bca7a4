"""One HTTP request -> ``n`` engine requests, their answers collected or merged as a stream.

Everything that can refuse a request happens before anything is generated: the sampling
parameters are checked, all ``n`` engine requests are submitted together while their
grammar compiles (they keep their place in the queue meanwhile; the engine admits them
once it is ready), and then the compile is awaited: an invalid or unenforceable
constraint cancels them and is a 400 naming its pointer; a full queue, or a KV budget
the requests running and waiting need twice over, is a 429 with ``Retry-After`` (the
ones already queued are cancelled).
Whoever stops listening (a client that disconnects, a stream that is closed) cancels the
engine requests, which frees their batch slots and KV cache within one step.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from thinkstruct.errors import InvalidConstraint
from thinkstruct.server.constraints import RequestedConstraint
from thinkstruct.server.errors import (
    SERVER,
    UNAVAILABLE,
    APIError,
    bad_request,
    constraint_error,
    unmet_constraint,
)
from thinkstruct.server.metrics import ServerMetrics
from thinkstruct.server.prompts import Prompt
from thinkstruct.server.protocol import ChoiceError

if TYPE_CHECKING:
    from starlette.requests import Request

    from thinkstruct.engine import (
        Completion,
        Delta,
        Engine,
        GenerationRequest,
        RequestHandle,
        SamplingParams,
    )
    from thinkstruct.engine.request import ToolCallReading
    from thinkstruct.grammar.base import CompiledGrammar
    from thinkstruct.parsers import ReasoningParser

# The seed of choice i is seed + i, so n > 1 with a seed gives n different answers that
# are each reproducible alone.
_SEED_MODULUS = 2**64


@dataclass(frozen=True, slots=True)
class PendingCompile:
    """A request's constraint compiling while its engine requests wait in the queue."""

    requested: RequestedConstraint
    future: concurrent.futures.Future[CompiledGrammar]
    started: float


def start_compile(engine: Engine, requested: RequestedConstraint | None) -> PendingCompile | None:
    """Start compiling a request's constraint (``None`` without one). The engine requests
    can be submitted with the future: they keep their place in the queue meanwhile.

    Raises:
        APIError: 400 naming the field and JSON pointer when the constraint is refused
            before compiling (it cannot be read).
    """
    if requested is None:
        return None
    started = time.perf_counter()
    try:
        future = engine.compiler.submit(
            requested.constraint, backend=requested.backend, strict=requested.strict
        )
    except InvalidConstraint as e:
        raise constraint_error(e, param=requested.param) from None
    return PendingCompile(requested=requested, future=future, started=started)


async def finish_compile(
    engine: Engine, pending: PendingCompile | None, *, metrics: ServerMetrics
) -> tuple[CompiledGrammar | None, float | None]:
    """The compiled grammar, awaited off the event loop, and the seconds since the
    compile started (``None, None`` without a constraint).

    Raises:
        APIError: 400 naming the field and JSON pointer for an invalid constraint, one no
            backend enforces exactly under strict mode, or one that timed out compiling.
    """
    if pending is None:
        return None, None
    requested = pending.requested
    try:
        compiled = await engine.compiler.wait_async(pending.future, requested.constraint)
    except InvalidConstraint as e:
        metrics.observe_compile(time.perf_counter() - pending.started, backend=None, failed=True)
        raise constraint_error(e, param=requested.param) from None
    waited = time.perf_counter() - pending.started
    metrics.observe_compile(waited, backend=compiled.backend, failed=False)
    return compiled, waited


def room_left(prompt_tokens: int, *, context: int, prompt_param: str) -> int:
    """Tokens the context leaves after the prompt.

    Raises:
        APIError: 400 naming ``prompt_param`` when the prompt fills the context.
    """
    room = context - prompt_tokens
    if room < 1:
        raise APIError(
            400,
            f"the prompt is {prompt_tokens} tokens, which leaves no room in the model's context of {context} tokens",
            param=prompt_param,
            code="context_length_exceeded",
        )
    return room


def max_new_tokens(
    requested: int | None, *, prompt_tokens: int, context: int, default: int, param: str, prompt_param: str
) -> int:
    """The ``max_tokens`` to generate: as asked, or ``default`` capped by the room left.

    Raises:
        APIError: 400 when the prompt fills the context, or prompt plus ``max_tokens``
            does not fit in it.
    """
    room = room_left(prompt_tokens, context=context, prompt_param=prompt_param)
    if requested is None:
        return min(default, room)
    if requested > room:
        raise APIError(
            400,
            f"this model's context is {context} tokens; the prompt has {prompt_tokens}, so {param} may be at most "
            f"{room}, got {requested}",
            param=param,
            code="context_length_exceeded",
        )
    return requested


@dataclass(frozen=True, slots=True, kw_only=True)
class Sampling:
    """A request's sampling fields as every API translates them (``None``: the default):
    temperature in [0, 2], nucleus ``top_p``, ``top_k`` (0 or less: off), ``seed`` (choice
    ``i`` draws with ``seed + i``), stop strings, ``logprobs`` (alternatives per token;
    ``None``: none), ``logit_bias`` as (token id, bias) pairs, vLLM's penalties, ``min_p``."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    min_p: float | None = None


def sampling_params(sampling: Sampling, *, max_tokens: int, choice: int) -> SamplingParams:
    """The engine's sampling parameters for choice ``choice``.

    Raises:
        APIError: 400 naming the field the engine refuses.
    """
    from thinkstruct.engine import SamplingParams
    from thinkstruct.engine.request import InvalidSamplingParam

    seed = None if sampling.seed is None else (sampling.seed + choice) % _SEED_MODULUS
    top_k = sampling.top_k if sampling.top_k is not None and sampling.top_k > 0 else 0
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if sampling.temperature is None else sampling.temperature,
            top_p=1.0 if sampling.top_p is None else sampling.top_p,
            top_k=top_k,
            seed=seed,
            stop=sampling.stop,
            logprobs=sampling.logprobs,
            logit_bias=sampling.logit_bias,
            presence_penalty=sampling.presence_penalty or 0.0,
            frequency_penalty=sampling.frequency_penalty or 0.0,
            repetition_penalty=1.0 if sampling.repetition_penalty is None else sampling.repetition_penalty,
            min_p=sampling.min_p or 0.0,
        )
    except InvalidSamplingParam as e:
        raise bad_request(str(e), param=e.field) from None
    except ValueError as e:
        # The engine's messages start with the field's name ("top_p must be ...").
        words = str(e).replace(",", " ").split()
        field = next((w for w in words if w in Sampling.__dataclass_fields__), None)
        raise bad_request(str(e), param=field) from None


@dataclass(frozen=True, slots=True)
class Submitted:
    """The engine requests of one HTTP request, in choice order."""

    handles: list[RequestHandle]
    prompts: list[Prompt]  # per handle
    started: float

    def cancel(self) -> None:
        for handle in self.handles:
            handle.cancel()


def engine_requests(
    prompt: Prompt,
    samplings: Sequence[SamplingParams],
    *,
    pending: PendingCompile | None,
    reasoning: bool = False,
    reasoning_parser: Callable[[], ReasoningParser | None] | None = None,
    max_reasoning_tokens: int | None = None,
    tool_calls: ToolCallReading | None = None,
    count_allowed_tokens: bool = False,
) -> list[GenerationRequest]:
    """The engine requests of one prompt, one per choice's sampling parameters: the one
    place a request is built from the rendered prompt.

    Args:
        pending: the constraint compiling (its future is the grammar: the request keeps
            its place in the queue while it compiles).
        reasoning: the template opened a thought (``ChatPrompt.reasoning_enabled``); the
            thinking budget, the reasoning-token count and where stop strings apply
            derive from it.
        reasoning_parser: makes each choice's text-level parser (``None``: the thought is
            not told apart from the answer in the text).
    """
    from thinkstruct.engine import GenerationRequest

    return [
        GenerationRequest(
            prompt_ids=prompt.ids,
            sampling=sampling,
            grammar=None if pending is None else pending.future,
            reasoning=reasoning,
            reasoning_parser=None if reasoning_parser is None else reasoning_parser(),
            max_reasoning_tokens=max_reasoning_tokens,
            tool_calls=tool_calls,
            count_allowed_tokens=count_allowed_tokens,
        )
        for sampling in samplings
    ]


def submit_all(
    engine: Engine,
    requests: Sequence[tuple[Prompt, GenerationRequest]],
    *,
    retry_after_s: int,
) -> Submitted:
    """Submit every choice (each with its prompt); all or none.

    Raises:
        APIError: 429 with ``Retry-After`` when the queue is full (``queue_full``) or the
            requests running and waiting need the KV budget twice over
            (``kv_cache_full``), 503 when the engine is stopping, 400 for a request the
            engine refuses (it names the problem: one that needs more keys and values
            than the KV budget holds names ``max_tokens``).
    """
    from thinkstruct.engine import EngineClosed, EngineOverloaded

    loop = asyncio.get_running_loop()
    handles: list[RequestHandle] = []
    try:
        for _, request in requests:
            handles.append(engine.submit(request, loop=loop))
    except BaseException as e:
        for handle in handles:
            handle.cancel()
        if isinstance(e, EngineOverloaded):
            wait = max(retry_after_s, math.ceil(getattr(e, "retry_after_s", 0)))
            raise APIError(
                429,
                f"the server is busy ({e})",
                type="rate_limit_error",
                code=e.code,
                headers={"Retry-After": str(wait)},
            ) from None
        if isinstance(e, EngineClosed):
            raise APIError(
                503, "the server is shutting down", type=UNAVAILABLE, code="engine_closed"
            ) from None
        if isinstance(e, ValueError):  # a sampling field's own error names it (logit_bias.<id>)
            raise bad_request(str(e), param=getattr(e, "field", None), code="invalid_request") from None
        raise
    return Submitted(handles=handles, prompts=[p for p, _ in requests], started=time.perf_counter())


async def submit_compiling(
    engine: Engine,
    requests: Sequence[tuple[Prompt, GenerationRequest]],
    pending: PendingCompile | None,
    *,
    retry_after_s: int,
    metrics: ServerMetrics,
) -> tuple[Submitted, CompiledGrammar | None, float | None]:
    """Submit every choice while their constraint compiles, then await the compile: the
    requests hold their place in the queue meanwhile. A constraint that fails cancels them
    and is the answer (a 400 naming it), even where the queue was full.

    Returns:
        the submitted requests, the compiled grammar and the seconds it took.
    """
    try:
        submitted = submit_all(engine, requests, retry_after_s=retry_after_s)
    except APIError:
        await finish_compile(engine, pending, metrics=metrics)  # its own 400 goes first
        raise
    try:
        grammar, compile_s = await finish_compile(engine, pending, metrics=metrics)
    except BaseException:
        submitted.cancel()
        raise
    return submitted, grammar, compile_s


async def collect(
    submitted: Submitted, request: Request, *, metrics: ServerMetrics
) -> list[Completion] | None:
    """Every choice's whole answer, or ``None`` when the client went away first (its
    engine requests are then cancelled).

    Raises:
        APIError: 422 ``constraint_unmet`` when a choice's answer could not be made to
            meet a checked keyword (:func:`~thinkstruct.server.errors.unmet_constraint`);
            500 ``generation_failed`` when a choice failed otherwise while generating (its
            grammar rejected a sampled token, its own sampling raised): an answer with a
            missing or cut-off choice is not what was asked for, and the official clients
            retry a 5xx by themselves. Other requests in the batch are not affected.
    """
    gathered = asyncio.ensure_future(asyncio.gather(*(h.result() for h in submitted.handles)))
    gone = asyncio.ensure_future(_disconnected(request))
    waiting: set[asyncio.Future[Any]] = {gathered, gone}
    try:
        done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if gathered not in done:
            _abandon(submitted, gathered)
            return None
        results: list[Completion] = gathered.result()
    except BaseException:
        _abandon(submitted, gathered)
        raise
    finally:
        gone.cancel()
    for result in results:
        metrics.observe_finished(result.usage, started=submitted.started)
    for index, result in enumerate(results):
        if result.unmet is not None:
            raise unmet_constraint(index, result.unmet)
        if finish_reason_name(result.finish_reason) == "error":
            raise APIError(
                500,
                f"choice {index} failed while generating: {result.error or 'internal error'}",
                type=SERVER,
                code="generation_failed",
            )
    return results


def _abandon(submitted: Submitted, gathered: asyncio.Future[Any]) -> None:
    submitted.cancel()
    gathered.cancel()
    # Retrieve the outcome, so asyncio does not log an exception nobody asked for.
    gathered.add_done_callback(lambda f: f.cancelled() or f.exception())


async def merged(submitted: Submitted, *, metrics: ServerMetrics) -> AsyncIterator[tuple[int, Delta]]:
    """Every choice's deltas as they come, tagged with the choice index.

    Closing the iterator (the client disconnected and the response task was cancelled)
    cancels the engine requests still running.
    """
    try:
        if len(submitted.handles) == 1:
            async for delta in submitted.handles[0]:
                if delta.finish_reason is not None:
                    metrics.observe_finished(delta.usage, started=submitted.started)
                yield 0, delta
            return
        queue: asyncio.Queue[tuple[int, Delta | None]] = asyncio.Queue()

        async def pump(index: int, handle: RequestHandle) -> None:
            try:
                async for delta in handle:
                    await queue.put((index, delta))
            finally:
                await queue.put((index, None))

        tasks = [asyncio.ensure_future(pump(i, h)) for i, h in enumerate(submitted.handles)]
        try:
            running = len(tasks)
            while running:
                index, item = await queue.get()
                if item is None:
                    running -= 1
                    continue
                if item.finish_reason is not None:
                    metrics.observe_finished(item.usage, started=submitted.started)
                yield index, item
        finally:
            for task in tasks:
                task.cancel()
    finally:
        submitted.cancel()


def choice_error(index: int, result: Delta | Completion) -> ChoiceError | None:
    """What a choice that ended in an error says beside its ``finish_reason`` (in a
    stream: the 422's error object, where its answer could not meet a checked keyword),
    or ``None``."""
    if result.unmet is not None:
        error = unmet_constraint(index, result.unmet)
        return ChoiceError(message=error.message, type=error.type, code=error.code, **error.extra)
    return ChoiceError(message=result.error) if result.error else None


def finish_reason_name(finish_reason: object) -> str | None:
    """``FinishReason.STOP`` -> ``"stop"`` (the wire value)."""
    return None if finish_reason is None else str(getattr(finish_reason, "value", finish_reason))


async def _disconnected(request: Request) -> None:
    # After the body has been read, the next ASGI message is the disconnect.
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
