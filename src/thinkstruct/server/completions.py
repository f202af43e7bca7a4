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
from thinkstruct.server.logprobs import LegacyLogprobs
from thinkstruct.server.prompts import Prompt, TextSource
from thinkstruct.server.protocol import (
    CompletionRequest,
    GenerationInfo,
    TextChoice,
    TextCompletion,
)
from thinkstruct.server.state import ServerState
from thinkstruct.server.streaming import DONE, EventStream, event

if TYPE_CHECKING:
    from thinkstruct.engine import Engine, Usage

log = logging.getLogger("thinkstruct.server")


async def completions(request: Request, state: ServerState) -> Response:
    body = await read_model(request, CompletionRequest, max_bytes=state.settings.max_body_bytes)
    engine = state.require_engine()
    spec = GenerationSpec(
        model=body.model,
        source=TextSource(prompts=body.prompts(), suffix=body.suffix),
        sampling=sampling_of(body),
        n=body.n,
        max_tokens=body.max_tokens,
        constraint=requested_constraint(body),
        backend=body.backend,
    )
    started = await start_generation(state, spec)
    submitted = started.submitted
    echoes = [_echo_text(engine, p) if body.echo else "" for p in submitted.prompts]
    logprobs = (
        [LegacyLogprobs(engine.token_texts, offset=len(echo)) for echo in echoes]
        if body.logprobs is not None
        else None
    )
    response_id = f"cmpl-{uuid.uuid4().hex}"
    if body.stream:
        return EventStream(
            _events(
                started,
                state,
                response_id=response_id,
                echoes=echoes,
                logprobs=logprobs,
                include_usage=body.include_usage,
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
            error=choice_error(i, result),
            logprobs=None if logprobs is None else logprobs[i].render(result.logprobs),
        )
        for i, result in enumerate(results)
    ]
    usages = [r.usage for r in results]
    answer = TextCompletion(
        id=response_id,
        model=started.model,
        choices=choices,
        usage=started.usage(usages),
        thinkstruct=started.info(usages),
    )
    return JSONResponse(answer.model_dump(mode="json"))


def _echo_text(engine: Engine, prompt: Prompt) -> str:
    return prompt.text if prompt.text is not None else engine.model.tokenizer.decode(prompt.ids)


async def _events(
    started: Started,
    state: ServerState,
    *,
    response_id: str,
    echoes: list[str],
    logprobs: list[LegacyLogprobs] | None,
    include_usage: bool,
) -> AsyncIterator[bytes]:
    submitted = started.submitted
    model = started.model
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
                error = choice_error(index, delta)
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
            yield chunk([], usage=started.usage(usages), info=started.info(usages))
    except Exception:  # a fault mid-stream: tell the client in-band, the status is sent already
        log.exception("streamed completion %s failed", response_id)
        yield event(APIError(500, "internal server error", type=SERVER, code="internal_error").body())
    yield DONE
