"""``POST /v1/responses``, ``GET`` and ``DELETE /v1/responses/{id}``: OpenAI's Responses API.

A thin translation onto the one handler start (:mod:`.intake`): ``instructions`` become
the system message, ``input`` (a string, or items: messages, ``function_call``,
``function_call_output``, ``reasoning``) the conversation, ``text.format`` the answer's
constraint (``json_schema`` with ``strict``, ``json_object`` with or without ``schema``,
``text``), ``tools`` (function tools) and ``tool_choice`` chat's, ``reasoning.effort`` the
effort, ``max_output_tokens`` ``max_tokens``. The answer's thought is a ``reasoning``
item, its text a ``message``, its calls ``function_call`` items (:mod:`.responses_stream`
builds them, streamed or not).

``previous_response_id`` continues a stored response: its conversation (input and output,
not its instructions) comes before the new input, so the next turn's prompt starts with
the tokens of the last one and reuses them from the prefix cache. Responses are stored
unless ``store: false`` (:mod:`.response_store`, bounded by ``--responses-store``).
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from thinkstruct.server.body import read_model
from thinkstruct.server.constraints import RequestedConstraint, schema_constraint
from thinkstruct.server.errors import APIError, bad_request, unmet_constraint
from thinkstruct.server.generation import Sampling, collect, finish_reason_name, merged
from thinkstruct.server.intake import GenerationSpec, Started, start_generation
from thinkstruct.server.prompts import ChatSource
from thinkstruct.server.response_store import StoredResponse
from thinkstruct.server.responses_protocol import (
    DeletedResponse,
    FormatJsonObject,
    FormatJsonSchema,
    FunctionCallItem,
    IncompleteDetails,
    InputTokensDetails,
    MessageItem,
    OutputItem,
    OutputTokensDetails,
    ReasoningItem,
    ResponseError,
    ResponseObject,
    ResponsesRequest,
    ResponseStatus,
    ResponseUsage,
)
from thinkstruct.server.responses_stream import OutputBuilder, item_id
from thinkstruct.server.state import ServerState
from thinkstruct.server.streaming import EventStream
from thinkstruct.server.tools import tool_plan, whole_calls

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

    from thinkstruct.engine import Delta
    from thinkstruct.engine import Usage as EngineUsage
    from thinkstruct.parsers import ReasoningFamily
    from thinkstruct.server.protocol import Usage

log = logging.getLogger("thinkstruct.server")

#: The internal fields errors name, by their Responses names.
_NAMES = {
    "messages": "input",
    "max_tokens": "max_output_tokens",
    "reasoning_effort": "reasoning.effort",
}


async def create_response(request: Request, state: ServerState) -> Response:
    body = await read_model(request, ResponsesRequest, max_bytes=state.settings.max_body_bytes)
    engine = state.require_engine()
    history = _history(state, body.previous_response_id)
    turn = turn_messages(body.input)
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    spec = GenerationSpec(
        model=body.model,
        source=ChatSource(messages=system + history + turn, chat_template_kwargs=body.chat_template_kwargs),
        sampling=Sampling(temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, seed=body.seed),
        max_tokens=body.max_output_tokens,
        constraint=_constraint(body),
        tools=_tools(body, engine.model.family),
        backend=body.backend,
        max_reasoning_tokens=body.max_reasoning_tokens,
        effort=body.effort,
        names=_NAMES,
    )
    started = await start_generation(state, spec)
    response_id = item_id("resp")
    builder = OutputBuilder(summary=body.summary)
    shell = _shell(body, response_id, started.model)
    conversation = history + turn
    if body.stream:
        return EventStream(
            _events(started, state, builder, shell, conversation=conversation),
            on_close=started.submitted.cancel,
        )
    results = await collect(started.submitted, request, metrics=state.metrics)
    if results is None:
        return Response(status_code=499)  # the client is gone; nobody reads this
    result = results[0]
    calls = whole_calls(result.tool_calls)
    builder.feed(reasoning=result.reasoning, content=result.content, calls=calls)
    cut = finish_reason_name(result.finish_reason) == "length"
    builder.finish(status="incomplete" if cut else "completed")
    answer = _final(shell, builder.output, started, [result.usage], cut=cut)
    _store(state, answer, conversation)
    return JSONResponse(answer.model_dump(mode="json"))


async def get_response(response_id: str, state: ServerState) -> Response:
    stored = state.responses.get(response_id)
    if stored is None:
        raise _not_found(response_id, param="response_id")
    return JSONResponse(stored.response)


async def delete_response(response_id: str, state: ServerState) -> Response:
    if not state.responses.delete(response_id):
        raise _not_found(response_id, param="response_id")
    return JSONResponse(DeletedResponse(id=response_id).model_dump(mode="json"))


def _not_found(response_id: str, *, param: str) -> APIError:
    return APIError(
        404,
        f"no response {response_id!r} is stored here (it was never stored, was deleted, or has expired)",
        type="invalid_request_error",
        param=param,
        code="response_not_found",
    )


def _history(state: ServerState, previous: str | None) -> list[dict[str, Any]]:
    if previous is None:
        return []
    stored = state.responses.get(previous)
    if stored is None:
        raise _not_found(previous, param="previous_response_id")
    return [dict(m) for m in stored.conversation]


# ---- input -----------------------------------------------------------------------------

_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "refusal", "summary_text", "reasoning_text"})
_ROLES = frozenset({"user", "system", "developer", "assistant"})


def turn_messages(value: str | list[Any]) -> list[dict[str, Any]]:
    """``input`` as chat-template messages: consecutive assistant items (a thought, text,
    calls) make one assistant message; ``function_call_output`` a ``tool`` message.

    Raises:
        APIError: 400 naming ``input[i]...`` for an item that is not one of these.
    """
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    messages: list[dict[str, Any]] = []
    assistant: dict[str, Any] | None = None
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad_request(f"{where} must be an object", param=where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise bad_request(
                    f"{where}.role must be one of {', '.join(sorted(_ROLES))}, got {role!r}",
                    param=f"{where}.role",
                )
            text = _text(item.get("content"), f"{where}.content")
            if role == "assistant":
                assistant = assistant or {"role": "assistant", "content": ""}
                assistant["content"] += text
                continue
            assistant = _flush(messages, assistant)
            messages.append({"role": role, "content": text})
        elif kind == "function_call":
            assistant = assistant or {"role": "assistant", "content": ""}
            call = {
                "id": _string(item, "call_id", where),
                "type": "function",
                "function": {
                    "name": _string(item, "name", where),
                    "arguments": _string(item, "arguments", where),
                },
            }
            assistant.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            assistant = _flush(messages, assistant)
            output = item.get("output")
            text = output if isinstance(output, str) else _text(output, f"{where}.output")
            messages.append(
                {"role": "tool", "tool_call_id": _string(item, "call_id", where), "content": text}
            )
        elif kind == "reasoning":
            assistant = _flush(messages, assistant) if assistant and assistant["content"] else assistant
            assistant = assistant or {"role": "assistant", "content": ""}
            parts = item.get("content") or item.get("summary") or []
            assistant["reasoning_content"] = _text(parts, f"{where}.content")
        else:
            raise bad_request(
                f"{where}.type {kind!r} is not supported: give messages, function_call, function_call_output "
                "or reasoning items",
                param=f"{where}.type",
            )
    _flush(messages, assistant)
    return messages


def _flush(messages: list[dict[str, Any]], assistant: dict[str, Any] | None) -> dict[str, Any] | None:
    """Append the assistant message being gathered (if any); the next one starts empty."""
    if assistant is not None:
        messages.append(assistant)
    return None


def _string(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise bad_request(f"{where}.{key} must be a string", param=f"{where}.{key}")
    return value


def _text(content: Any, where: str) -> str:
    """A string, or the text of a list of text parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where} must be a string or a list of text parts", param=where)
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            raise bad_request(
                f"{where}[{j}] is of type {kind!r}; only text parts (input_text, output_text) are supported",
                param=f"{where}[{j}]",
            )
        out.append(part["text"])
    return "".join(out)


# ---- format and tools --------------------------------------------------------------------


def _constraint(body: ResponsesRequest) -> RequestedConstraint | None:
    fmt = body.text.format if body.text is not None else None
    if isinstance(fmt, FormatJsonSchema):
        return schema_constraint(
            fmt.schema_, param="text.format.schema", backend=body.backend, strict=fmt.strict
        )
    if isinstance(fmt, FormatJsonObject):
        param = "text.format" if fmt.schema_ is None else "text.format.schema"
        return schema_constraint(fmt.schema_, param=param, backend=body.backend, strict=None)
    return None


_CHAT_TOOL = re.compile(r"(tools\[\d+\]|tool_choice)\.function")


def _tools(body: ResponsesRequest, family: ReasoningFamily) -> Any:
    """The function tools in chat's shape, read by the one tool reader; its errors name
    the Responses fields (``tools[0].name``, not ``tools[0].function.name``)."""
    tools = None
    if body.tools is not None:
        tools = []
        for i, tool in enumerate(body.tools):
            if not isinstance(tool, dict) or tool.get("type") != "function":
                kind = tool.get("type") if isinstance(tool, dict) else None
                raise bad_request(
                    f'tools[{i}].type must be "function" (the only tools served here), got {kind!r}',
                    param=f"tools[{i}].type",
                )
            function = {k: v for k, v in tool.items() if k != "type"}
            tools.append({"type": "function", "function": function})
    choice = body.tool_choice
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        choice = {"type": "function", "function": {"name": choice["name"]}}
    try:
        return tool_plan(tools, choice, body.parallel_tool_calls, family)
    except APIError as e:
        e.param = _CHAT_TOOL.sub(r"\1", e.param or "") or None
        e.message = _CHAT_TOOL.sub(r"\1", e.message)
        raise


# ---- output ------------------------------------------------------------------------------


def _shell(body: ResponsesRequest, response_id: str, model: str) -> ResponseObject:
    """The response as it starts: the request's settings echoed, no output yet."""
    fmt = body.text.format if body.text is not None else None
    return ResponseObject(
        id=response_id,
        status="in_progress",
        model=model,
        instructions=body.instructions,
        max_output_tokens=body.max_output_tokens,
        metadata=body.metadata or {},
        parallel_tool_calls=body.parallel_tool_calls is not False,
        previous_response_id=body.previous_response_id,
        reasoning={"effort": body.effort, "summary": body.reasoning.summary if body.reasoning else None},
        store=body.store,
        temperature=body.temperature,
        top_p=body.top_p,
        text={"format": fmt.model_dump(by_alias=True) if fmt is not None else {"type": "text"}},
        tool_choice=body.tool_choice if body.tool_choice is not None else "auto",
        tools=body.tools or [],
        truncation=body.truncation or "disabled",
        user=body.user,
    )


def _failure(delta: Delta, reason: str | None) -> ResponseError | None:
    """A streamed response's error, where its answer ended in one (``constraint_unmet``:
    it could not meet a checked keyword), or was aborted."""
    if delta.unmet is not None:
        return ResponseError(code="constraint_unmet", message=unmet_constraint(0, delta.unmet).message)
    failed = delta.error or ("the request was aborted" if reason == "abort" else None)
    return ResponseError(code="generation_failed", message=failed) if failed else None


def _final(
    shell: ResponseObject,
    output: list[OutputItem],
    started: Started,
    usages: Sequence[EngineUsage | None],
    *,
    cut: bool,
    error: ResponseError | None = None,
) -> ResponseObject:
    status: ResponseStatus = "failed" if error else ("incomplete" if cut else "completed")
    return shell.model_copy(
        update={
            "status": status,
            "output": output,
            "usage": response_usage(started.usage(usages)),
            "incomplete_details": IncompleteDetails(reason="max_output_tokens")
            if cut and not error
            else None,
            "error": error,
            "thinkstruct": started.info(usages),
        }
    )


def response_usage(usage: Usage) -> ResponseUsage:
    """Chat's ``usage`` in the Responses names."""
    return ResponseUsage(
        input_tokens=usage.prompt_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=usage.prompt_tokens_details.cached_tokens),
        output_tokens=usage.completion_tokens,
        output_tokens_details=OutputTokensDetails(
            reasoning_tokens=usage.completion_tokens_details.reasoning_tokens
        ),
        total_tokens=usage.total_tokens,
    )


def _assistant(output: Sequence[OutputItem]) -> dict[str, Any]:
    """A response's output as the assistant message the next turn's template reads."""
    message: dict[str, Any] = {"role": "assistant", "content": ""}
    for item in output:
        if isinstance(item, ReasoningItem):
            message["reasoning_content"] = "".join(c.text for c in item.content)
        elif isinstance(item, MessageItem):
            message["content"] += "".join(c.text for c in item.content)
        elif isinstance(item, FunctionCallItem):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            message.setdefault("tool_calls", []).append(call)
    return message


def _store(state: ServerState, answer: ResponseObject, conversation: list[dict[str, Any]]) -> None:
    """Keep ``answer`` (when its request allowed it) and the conversation it ends."""
    if answer.store:
        stored = StoredResponse(
            response=answer.model_dump(mode="json"), conversation=[*conversation, _assistant(answer.output)]
        )
        state.responses.put(answer.id, stored)


async def _events(
    started: Started,
    state: ServerState,
    builder: OutputBuilder,
    shell: ResponseObject,
    *,
    conversation: list[dict[str, Any]],
) -> AsyncIterator[bytes]:
    yield builder.lifecycle("response.created", shell)
    yield builder.lifecycle("response.in_progress", shell)
    usage: EngineUsage | None = None
    try:
        async for _, delta in merged(started.submitted, metrics=state.metrics):
            for chunk in builder.feed(
                reasoning=delta.reasoning, content=delta.content, calls=delta.tool_calls
            ):
                yield chunk
            if delta.finish_reason is None:
                continue
            usage = delta.usage
            reason = finish_reason_name(delta.finish_reason)
            failed = _failure(delta, reason)
            cut = reason == "length"
            for chunk in builder.finish(status="incomplete" if cut or failed else "completed"):
                yield chunk
            answer = _final(shell, builder.output, started, [usage], cut=cut, error=failed)
            _store(state, answer, conversation)
            kind = "response.failed" if failed else ("response.incomplete" if cut else "response.completed")
            yield builder.lifecycle(kind, answer)
    except Exception:  # a fault mid-stream: tell the client in-band, the status is sent already
        log.exception("streamed response %s failed", shell.id)
        yield builder.event("error", code="internal_error", message="internal server error", param=None)
