"""``POST /tokenize`` and ``POST /detokenize`` in vLLM's request and answer shapes.

``/tokenize`` takes either ``prompt`` (text, encoded as ``/v1/completions`` encodes it;
``add_special_tokens`` defaults to true) or ``messages`` (rendered through the chat
template as ``/v1/chat/completions`` renders them, ``add_generation_prompt`` true by
default; the template writes its special tokens itself) and answers ``count``,
``max_model_len``, ``tokens`` and, with ``return_token_strs``, each token's string.
``/detokenize`` turns ``tokens`` back into ``prompt``: for a text prompt,
``detokenize(tokenize(prompt).tokens).prompt == prompt`` whenever the tokenizer adds no
special token of its own. ``model`` is optional, as in vLLM; when given it must be the
served model.
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from thinkstruct.server.body import read_model
from thinkstruct.server.errors import bad_request
from thinkstruct.server.prompts import ChatSource, chat_prompt, encode
from thinkstruct.server.protocol import ChatMessage, FieldError
from thinkstruct.server.state import ServerState
from thinkstruct.server.tools import tool_plan


class TokenizeRequest(BaseModel):
    """vLLM's ``TokenizeCompletionRequest`` or ``TokenizeChatRequest``: one of ``prompt``
    and ``messages``."""

    model_config = ConfigDict(extra="forbid", strict=True)
    model: str | None = Field(None, max_length=1024)
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Any] | None = None
    return_token_strs: bool | None = False

    @model_validator(mode="after")
    def _one_source(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise FieldError("prompt", "give one of prompt and messages")
        if self.messages is not None and not self.messages:
            raise FieldError("messages", "messages must not be empty")
        return self


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    model: str | None = Field(None, max_length=1024)
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str


async def tokenize(request: Request, state: ServerState) -> Response:
    body = await read_model(request, TokenizeRequest, max_bytes=state.settings.max_body_bytes)
    engine = state.require_engine()
    if body.model is not None:
        state.check_model(body.model)
    model = engine.model
    if body.messages is not None:
        tools = tool_plan(body.tools, None, None, model.family).tools
        source = ChatSource(
            messages=[m.template_view() for m in body.messages],
            chat_template_kwargs=body.chat_template_kwargs,
            add_generation_prompt=body.add_generation_prompt,
            continue_final_message=body.continue_final_message,
        )
        prompt = await run_in_threadpool(
            functools.partial(chat_prompt, model, source, constrained=False, tools=tools)
        )
        ids = prompt.ids
    else:
        special = True if body.add_special_tokens is None else body.add_special_tokens
        ids = await run_in_threadpool(
            functools.partial(encode, model.tokenizer, body.prompt or "", add_special_tokens=special)
        )
    strs = [str(t) for t in model.tokenizer.hf.convert_ids_to_tokens(ids)] if body.return_token_strs else None
    answer = TokenizeResponse(count=len(ids), max_model_len=model.context_length, tokens=ids, token_strs=strs)
    return JSONResponse(answer.model_dump(mode="json"))


async def detokenize(request: Request, state: ServerState) -> Response:
    body = await read_model(request, DetokenizeRequest, max_bytes=state.settings.max_body_bytes)
    engine = state.require_engine()
    if body.model is not None:
        state.check_model(body.model)
    vocab = engine.model.tokenizer.vocab_size
    for i, token in enumerate(body.tokens):
        if not 0 <= token < vocab:
            raise bad_request(
                f"tokens[{i}] = {token} is not a token id of this model (0..{vocab - 1})",
                param=f"tokens[{i}]",
            )
    text = await run_in_threadpool(engine.model.tokenizer.decode, body.tokens)
    return JSONResponse(DetokenizeResponse(prompt=text).model_dump(mode="json"))
