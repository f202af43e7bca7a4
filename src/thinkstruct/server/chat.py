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

import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from thinkstruct.server.body import read_model
from thinkstruct.server.constraints import requested_constraint
from thinkstruct.server.errors import SERVER, APIError
from thinkstruct.server.generation import choice_error, collect, finish_reason_name, merged
from thinkstruct.server.intake import GenerationSpec, Started, sampling_of, start_generation
from thinkstruct.server.logprobs import chat_logprobs
from thinkstruct.server.prompts import ChatSource
from thinkstruct.server.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    GenerationInfo,
)
from thinkstruct.server.reasoning_budget import length_part
from thinkstruct.server.state import ServerState
from thinkstruct.server.streaming import DONE, EventStream, event
from thinkstruct.server.tools import call_pieces, finished_with, message_calls, tool_plan

if TYPE_CHECKING:
    from thinkstruct.engine import Completion, Usage
    from thinkstruct.engine.output.detokenizer import TokenTexts
    from thinkstruct.parsers import ReasoningFamily

log = logging.getLogger("thinkstruct.server")


async def chat_completions(request: Request, state: ServerState) -> Response:
    body = await read_model(request, ChatCompletionRequest, max_bytes=state.settings.max_body_bytes)
    engine = state.require_engine()
    started = await start_generation(state, chat_spec(body, engine.model.family))
    submitted = started.submitted
    reasoning = started.reasoning
    response_id = f"chatcmpl-{uuid.uuid4().hex}"
    texts = engine.token_texts if body.logprobs else None
    if body.stream:
        return EventStream(
            _events(started, state, response_id=response_id, include_usage=body.include_usage, texts=texts),
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
    usages = [r.usage for r in results]
    answer = ChatCompletion(
        id=response_id,
        model=started.model,
        choices=choices,
        usage=started.usage(usages),
        thinkstruct=started.info(usages),
    )
    return JSONResponse(answer.model_dump(mode="json"))


def chat_spec(body: ChatCompletionRequest, family: ReasoningFamily) -> GenerationSpec:
    """A chat request as the shared internal request."""
    return GenerationSpec(
        model=body.model,
        source=ChatSource(
            messages=[m.template_view() for m in body.messages],
            chat_template_kwargs=body.chat_template_kwargs,
            add_generation_prompt=body.add_generation_prompt,
            continue_final_message=body.continue_final_message,
        ),
        sampling=sampling_of(body),
        n=body.n,
        max_tokens=body.requested_max_tokens,
        constraint=requested_constraint(body),
        tools=tool_plan(body.tools, body.tool_choice, body.parallel_tool_calls, family),
        backend=body.backend,
        max_reasoning_tokens=body.max_reasoning_tokens,
        effort=body.reasoning_effort,
        separate_reasoning=body.separate_reasoning,
        count_allowed_tokens=body.return_allowed_tokens,
        names={"max_tokens": "max_completion_tokens"} if body.max_completion_tokens is not None else {},
    )


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
        error=choice_error(index, result),
        length_part=length_part(reason, result.usage, reasoning=reasoning, split=split),
    )


async def _events(
    started: Started,
    state: ServerState,
    *,
    response_id: str,
    include_usage: bool,
    texts: TokenTexts | None,
) -> AsyncIterator[bytes]:
    submitted = started.submitted
    created = int(time.time())
    usages: list[Usage | None] = [None] * len(submitted.handles)
    ids: list[dict[int, str]] = [{} for _ in submitted.handles]

    def chunk(choices: list[ChatChunkChoice], usage: Any = None, info: GenerationInfo | None = None) -> bytes:
        return event(
            ChatCompletionChunk(
                id=response_id,
                created=created,
                model=started.model,
                choices=choices,
                usage=usage,
                thinkstruct=info,
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
                error = choice_error(index, delta)
                reason = finished_with(finish_reason_name(delta.finish_reason), len(ids[index]))
                cut = length_part(reason, delta.usage, reasoning=started.reasoning, split=started.split)
                yield chunk(
                    [
                        ChatChunkChoice(
                            index=index, delta=ChatDelta(), finish_reason=reason, error=error, length_part=cut
                        )
                    ]
                )
        if include_usage:
            yield chunk([], usage=started.usage(usages), info=started.info(usages))
    except Exception:  # a fault mid-stream: tell the client in-band, the status is sent already
        log.exception("streamed chat completion %s failed", response_id)
        yield event(APIError(500, "internal server error", type=SERVER, code="internal_error").body())
    yield DONE
