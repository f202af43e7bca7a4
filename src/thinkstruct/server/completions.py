"""``POST /v1/completions``: text completion, fill-in-the-middle with ``suffix``.

``prompt`` is a string, a list of strings, token ids or a list of token-id lists; each
prompt gets ``n`` choices, choice ``i * n + j`` being prompt ``i``'s ``j``-th. A
``suffix`` builds the model's fill-in-the-middle prompt (a model without a completion
template answers 400). ``echo`` puts the prompt (the prefix, with a suffix) before the
generated text. There is no chat template and no thought here: the constraint holds
from the first generated token. ``logprobs`` (0..5) returns OpenAI's legacy object per
choice (per chunk when streamed): the generated tokens only, their offsets counted in
the choice's text (the echoed prompt included).
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from thinkstruct.server.body import read_model
from thinkstruct.server.constraints import requested_constraint
from thinkstruct.server.errors import SERVER, APIError
from thinkstruct.server.generation import (
    Submitted,
    collect,
    engine_requests,
    finish_reason_name,
    max_new_tokens,
    merged,
    sampling_params,
    start_compile,
    submit_compiling,
)
from thinkstruct.server.limits import check_prompt_length, check_request_limits
from thinkstruct.server.logprobs import LegacyLogprobs
from thinkstruct.server.prompts import Prompt, completion_prompt
from thinkstruct.server.protocol import (
    ChoiceError,
    CompletionRequest,
    GenerationInfo,
    TextChoice,
    TextCompletion,
)
from thinkstruct.server.state import ServerState
from thinkstruct.server.streaming import DONE, EventStream, event
from thinkstruct.server.usage import generation_info, total_usage

if TYPE_CHECKING:
    from thinkstruct.engine import Engine, Usage

log = logging.getLogger("thinkstruct.server")


async def completions(request: Request, state: ServerState) -> Response:
    settings = state.settings
    body = await read_model(request, CompletionRequest, max_bytes=settings.max_body_bytes)
    engine = state.require_engine()
    state.check_model(body.model)
    sources = body.prompts()
    check_request_limits(body, settings, prompts=len(sources))
    requested = requested_constraint(body)
    prompts = await run_in_threadpool(_encode_all, engine, sources, body.suffix)
    budgets = []
    for prompt in prompts:
        check_prompt_length(len(prompt.ids), settings, param="prompt")
        budgets.append(
            max_new_tokens(
                body.max_tokens,
                prompt_tokens=len(prompt.ids),
                context=engine.model.context_length,
                default=settings.default_max_tokens,
                param="max_tokens",
            )
        )
    pending = start_compile(engine, requested)
    requests = [
        (prompt, r)
        for prompt, budget in zip(prompts, budgets, strict=True)
        for r in engine_requests(
            prompt,
            [sampling_params(body, max_tokens=budget, choice=j) for j in range(body.n)],
            pending=pending,
        )
    ]
    submitted, grammar, compile_s = await submit_compiling(
        engine, requests, pending, retry_after_s=settings.retry_after_s, metrics=state.metrics
    )
    echoes = [_echo_text(engine, p) if body.echo else "" for p in submitted.prompts]
    logprobs = (
        [LegacyLogprobs(engine.token_texts, offset=len(echo)) for echo in echoes]
        if body.logprobs is not None
        else None
    )
    response_id = f"cmpl-{uuid.uuid4().hex}"
    model = state.model_name or body.model
    if body.stream:
        return EventStream(
            _events(
                submitted,
                state,
                response_id=response_id,
                model=model,
                prompts=prompts,
                echoes=echoes,
                logprobs=logprobs,
                include_usage=body.include_usage,
                describe=functools.partial(generation_info, grammar, compile_s),
            ),
            on_close=submitted.cancel,
        )
    results = await collect(submitted, request, metrics=state.metrics)
    if results is None:
        return Response(status_code=499)  # the client is gone; nobody reads this
    choices = [
        TextChoice(
            index=i,
            text=echoes[i] + result.reasoning + result.content,
            finish_reason=finish_reason_name(result.finish_reason),
            error=ChoiceError(message=result.error) if result.error else None,
            logprobs=None if logprobs is None else logprobs[i].render(result.logprobs),
        )
        for i, result in enumerate(results)
    ]
    usages = [r.usage for r in results]
    answer = TextCompletion(
        id=response_id,
        model=model,
        choices=choices,
        usage=total_usage(prompts, usages),
        thinkstruct=generation_info(grammar, compile_s, usages),
    )
    return JSONResponse(answer.model_dump(mode="json"))


def _encode_all(engine: Engine, sources: list[str | list[int]], suffix: str | None) -> list[Prompt]:
    return [completion_prompt(engine.model, source, suffix=suffix) for source in sources]


def _echo_text(engine: Engine, prompt: Prompt) -> str:
    return prompt.text if prompt.text is not None else engine.model.tokenizer.decode(prompt.ids)


async def _events(
    submitted: Submitted,
    state: ServerState,
    *,
    response_id: str,
    model: str,
    prompts: list[Prompt],
    echoes: list[str],
    logprobs: list[LegacyLogprobs] | None,
    include_usage: bool,
    describe: Callable[[list[Usage | None]], GenerationInfo],
) -> AsyncIterator[bytes]:
    created = int(time.time())
    usages: list[Usage | None] = [None] * len(submitted.handles)

    def chunk(choices: list[TextChoice], usage: Any = None, info: GenerationInfo | None = None) -> bytes:
        return event(
            TextCompletion(
                id=response_id, created=created, model=model, choices=choices, usage=usage, thinkstruct=info
            )
        )

    try:
        for index, echo in enumerate(echoes):
            if echo:
                yield chunk([TextChoice(index=index, text=echo, finish_reason=None)])
        async for index, delta in merged(submitted, metrics=state.metrics):
            text = delta.reasoning + delta.content
            pieces = (
                logprobs[index].render(delta.logprobs) if logprobs is not None and delta.logprobs else None
            )
            if text or pieces or delta.finish_reason is not None:
                if delta.finish_reason is not None:
                    usages[index] = delta.usage
                error = ChoiceError(message=delta.error) if delta.error else None
                yield chunk(
                    [
                        TextChoice(
                            index=index,
                            text=text,
                            finish_reason=finish_reason_name(delta.finish_reason),
                            error=error,
                            logprobs=pieces,
                        )
                    ]
                )
        if include_usage:
            yield chunk([], usage=total_usage(prompts, usages), info=describe(usages))
    except Exception:  # a fault mid-stream: tell the client in-band, the status is sent already
        log.exception("streamed completion %s failed", response_id)
        yield event(APIError(500, "internal server error", type=SERVER, code="internal_error").body())
    yield DONE
