"""``POST /v1/chat/completions``.

The message carries the thought in ``reasoning_content`` and only the answer in
``content`` (with ``separate_reasoning: false`` the whole output is ``content``). A
streamed answer sends, per choice, a first chunk with the role, then ``reasoning_content``
and ``content`` deltas as the model writes them (with ``logprobs: true``, each chunk's
``logprobs.content`` holds its tokens' log-probabilities), then a chunk with the finish reason;
``stream_options.include_usage`` adds a last chunk with no choices and the usage.

A choice that fails while generating (a token its grammar rejects, a fault in its own
sampling) ends with ``finish_reason: "error"`` and an ``error.message`` beside it in a
stream, and makes a non-streamed answer a 500 ``generation_failed``; the other choices
and requests go on. Engine shutdown ends choices with ``"abort"``.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, cast

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
from thinkstruct.server.logprobs import chat_logprobs
from thinkstruct.server.prompts import Prompt, chat_prompt
from thinkstruct.server.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    ChoiceError,
    GenerationInfo,
)
from thinkstruct.server.reasoning_budget import length_part, thinking_budget
from thinkstruct.server.state import ServerState
from thinkstruct.server.streaming import DONE, EventStream, event
from thinkstruct.server.tools import call_pieces, finished_with, message_calls, tool_plan
from thinkstruct.server.usage import generation_info, total_usage

if TYPE_CHECKING:
    from thinkstruct.engine import Completion, Usage
    from thinkstruct.engine.output.detokenizer import TokenTexts
    from thinkstruct.parsers import ChatPrompt

log = logging.getLogger("thinkstruct.server")


async def chat_completions(request: Request, state: ServerState) -> Response:
    settings = state.settings
    body = await read_model(request, ChatCompletionRequest, max_bytes=settings.max_body_bytes)
    engine = state.require_engine()
    state.check_model(body.model)
    check_request_limits(body, settings)
    tools = tool_plan(body, engine.model.family)
    requested = tools.constraint(
        requested_constraint(body), body, max_whitespace=engine.compiler.config.json_format.max_whitespace
    )
    prompt = await run_in_threadpool(
        functools.partial(
            chat_prompt, engine.model, body, constrained=requested is not None, tools=tools.tools
        )
    )
    check_prompt_length(len(prompt.ids), settings, param="messages")
    max_tokens = max_new_tokens(
        body.requested_max_tokens,
        prompt_tokens=len(prompt.ids),
        context=engine.model.context_length,
        default=settings.default_max_tokens,
        param="max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens",
    )
    pending = start_compile(engine, requested)
    rendered = cast("ChatPrompt", prompt.chat)  # chat_prompt always sets it
    reasoning = rendered.reasoning_enabled
    budget = thinking_budget(
        engine,
        requested=body.max_reasoning_tokens,
        reasoning=reasoning,
        max_tokens=max_tokens,
        share=settings.reasoning_share,
    )
    samplings = [sampling_params(body, max_tokens=max_tokens, choice=c) for c in range(body.n)]
    requests = engine_requests(
        prompt,
        samplings,
        pending=pending,
        reasoning=reasoning,
        reasoning_parser=functools.partial(rendered.reasoning_parser, stream_reasoning=True)
        if body.separate_reasoning
        else None,
        max_reasoning_tokens=budget,
        tool_calls=tools.reading(),
        count_allowed_tokens=body.return_allowed_tokens,
    )
    submitted, grammar, compile_s = await submit_compiling(
        engine,
        [(prompt, r) for r in requests],
        pending,
        retry_after_s=settings.retry_after_s,
        metrics=state.metrics,
    )
    response_id = f"chatcmpl-{uuid.uuid4().hex}"
    model = state.model_name or body.model
    texts = engine.token_texts if body.logprobs else None
    if body.stream:
        return EventStream(
            _events(
                submitted,
                state,
                response_id=response_id,
                model=model,
                prompt=prompt,
                include_usage=body.include_usage,
                describe=functools.partial(generation_info, grammar, compile_s, max_reasoning_tokens=budget),
                texts=texts,
                reasoning=reasoning,
                split=body.separate_reasoning,
            ),
            on_close=submitted.cancel,
        )
    results = await collect(submitted, request, metrics=state.metrics)
    if results is None:
        return Response(status_code=499)  # the client is gone; nobody reads this
    choices = [
        _choice(i, result, reasoning=reasoning, split=body.separate_reasoning)
        for i, result in enumerate(results)
    ]
    if texts is not None:
        for made, result in zip(choices, results, strict=True):
            made.logprobs = chat_logprobs(result.logprobs, texts)
    answer = ChatCompletion(
        id=response_id,
        model=model,
        choices=choices,
        usage=total_usage([prompt], [r.usage for r in results]),
        thinkstruct=generation_info(
            grammar, compile_s, [r.usage for r in results], max_reasoning_tokens=budget
        ),
    )
    return JSONResponse(answer.model_dump(mode="json"))


def _choice(index: int, result: Completion, *, reasoning: bool, split: bool) -> ChatChoice:
    """``split``: the thought is told apart from the answer (``separate_reasoning``)."""
    calls = message_calls(result.tool_calls)
    reason = finished_with(finish_reason_name(result.finish_reason), len(calls or ()))
    return ChatChoice(
        index=index,
        message=AssistantMessage(
            content=result.content or None if calls else result.content,
            reasoning_content=result.reasoning if reasoning and split else None,
            tool_calls=calls,
        ),
        finish_reason=reason,
        error=ChoiceError(message=result.error) if result.error else None,
        length_part=length_part(reason, result.usage, reasoning=reasoning, split=split),
    )


async def _events(
    submitted: Submitted,
    state: ServerState,
    *,
    response_id: str,
    model: str,
    prompt: Prompt,
    include_usage: bool,
    describe: Callable[[list[Usage | None]], GenerationInfo],
    texts: TokenTexts | None,
    reasoning: bool,
    split: bool,
) -> AsyncIterator[bytes]:
    created = int(time.time())
    usages: list[Usage | None] = [None] * len(submitted.handles)
    ids: list[dict[int, str]] = [{} for _ in submitted.handles]

    def chunk(choices: list[ChatChunkChoice], usage: Any = None, info: GenerationInfo | None = None) -> bytes:
        return event(
            ChatCompletionChunk(
                id=response_id, created=created, model=model, choices=choices, usage=usage, thinkstruct=info
            )
        )

    try:
        for index in range(len(submitted.handles)):
            yield chunk([ChatChunkChoice(index=index, delta=ChatDelta(role="assistant", content=""))])
        async for index, delta in merged(submitted, metrics=state.metrics):
            content = delta.content
            pieces = call_pieces(delta.tool_calls, ids[index])
            logprobs = chat_logprobs(delta.logprobs, texts) if texts is not None and delta.logprobs else None
            if delta.reasoning or content or pieces or logprobs:
                text = ChatDelta(
                    reasoning_content=delta.reasoning or None,
                    content=content or None,
                    tool_calls=pieces or None,
                )
                yield chunk([ChatChunkChoice(index=index, delta=text, logprobs=logprobs)])
            if delta.finish_reason is not None:
                usages[index] = delta.usage
                error = ChoiceError(message=delta.error) if delta.error else None
                reason = finished_with(finish_reason_name(delta.finish_reason), len(ids[index]))
                cut = length_part(reason, delta.usage, reasoning=reasoning, split=split)
                yield chunk(
                    [
                        ChatChunkChoice(
                            index=index, delta=ChatDelta(), finish_reason=reason, error=error, length_part=cut
                        )
                    ]
                )
        if include_usage:
            yield chunk([], usage=total_usage([prompt], usages), info=describe(usages))
    except Exception:  # a fault mid-stream: tell the client in-band, the status is sent already
        log.exception("streamed chat completion %s failed", response_id)
        yield event(APIError(500, "internal server error", type=SERVER, code="internal_error").body())
    yield DONE
