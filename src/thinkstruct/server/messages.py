"""``POST /v1/messages``: Anthropic's Messages API.

A thin translation onto the one handler start (:mod:`.intake`): ``system`` is the system
message; ``messages`` with ``text``, ``tool_use``, ``tool_result`` and ``thinking``
blocks the conversation; ``tools`` (``input_schema``) and ``tool_choice`` (``auto``,
``any``, ``tool``, ``none``; ``disable_parallel_tool_use``) chat's tools, held to their
schemas the same way; ``thinking`` (``enabled`` with ``budget_tokens``: thinking on with
that budget; ``adaptive``: on, with ``output_config.effort``'s share; ``disabled``: off,
a 400 for a family that always thinks; absent: the family's default, or what
``output_config.effort`` says); ``stop_sequences`` the stop strings. The answer is ``thinking``,
``text`` and ``tool_use`` blocks with ``stop_reason`` (``end_turn``, ``max_tokens``,
``stop_sequence`` with the sequence met, ``tool_use``). A stream is Anthropic's event
sequence: ``message_start``, per block ``content_block_start`` / ``_delta`` / ``_stop``,
``message_delta`` (the stop reason and output tokens), ``message_stop``. Errors are in
Anthropic's shape (:meth:`~thinkstruct.server.errors.APIError.anthropic_body`), an error
mid-stream an ``error`` event.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from thinkstruct.parsers.tool_calls.types import ToolCallDelta
from thinkstruct.server.body import read_model
from thinkstruct.server.constraints import schema_constraint
from thinkstruct.server.effort import Effort
from thinkstruct.server.errors import APIError, bad_request, unmet_constraint
from thinkstruct.server.generation import Sampling, collect, finish_reason_name, merged
from thinkstruct.server.intake import GenerationSpec, Started, start_generation
from thinkstruct.server.messages_protocol import (
    ContentBlock,
    MessageObject,
    MessagesRequest,
    MessagesUsage,
    StopReason,
    TextBlock,
    ThinkingBlock,
    ThinkingEnabled,
    ToolUseBlock,
)
from thinkstruct.server.prompts import ChatSource
from thinkstruct.server.responses_stream import item_id
from thinkstruct.server.state import ServerState
from thinkstruct.server.streaming import EventStream, named_event
from thinkstruct.server.tools import tool_plan, whole_calls

if TYPE_CHECKING:
    from thinkstruct.engine import Engine
    from thinkstruct.engine import Usage as EngineUsage
    from thinkstruct.parsers import ReasoningFamily
    from thinkstruct.server.tools import ToolPlan

log = logging.getLogger("thinkstruct.server")

#: The internal fields errors name, by their Messages names.
_NAMES = {
    "stop": "stop_sequences",
    "reasoning_effort": "thinking",
    "max_reasoning_tokens": "thinking.budget_tokens",
}


async def create_message(request: Request, state: ServerState) -> Response:
    body = await read_model(request, MessagesRequest, max_bytes=state.settings.max_body_bytes)
    engine = state.require_engine()
    thinking = body.thinking
    budget = thinking.budget_tokens if isinstance(thinking, ThinkingEnabled) else None
    if budget is not None and budget >= body.max_tokens:
        raise bad_request(
            f"thinking.budget_tokens ({budget}) must be less than max_tokens ({body.max_tokens})",
            param="thinking.budget_tokens",
        )
    output = body.output_config
    schema = output.format.schema_ if output is not None and output.format is not None else None
    spec = GenerationSpec(
        model=body.model,
        source=ChatSource(messages=_system(body.system) + conversation(body)),
        sampling=Sampling(
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=body.top_k,
            seed=body.seed,
            stop=tuple(body.stop_sequences or ()),
        ),
        max_tokens=body.max_tokens,
        constraint=None
        if schema is None
        else schema_constraint(
            schema, param="output_config.format.schema", backend=body.backend, strict=None
        ),
        tools=_tools(body, engine.model.family),
        backend=body.backend,
        max_reasoning_tokens=budget,
        effort=_effort(body),
        names=_NAMES,
    )
    started = await start_generation(state, spec)
    blocks = BlockBuilder(message_id=item_id("msg"), shown=getattr(thinking, "display", None) != "omitted")
    stops = tuple(body.stop_sequences or ())
    if body.stream:
        return EventStream(_events(started, state, blocks, engine, stops), on_close=started.submitted.cancel)
    results = await collect(started.submitted, request, metrics=state.metrics)
    if results is None:
        return Response(status_code=499)  # the client is gone; nobody reads this
    result = results[0]
    calls = whole_calls(result.tool_calls)
    blocks.feed(reasoning=result.reasoning, content=result.content, calls=calls)
    blocks.finish()
    reason, matched = _stop_reason(
        engine, finish_reason_name(result.finish_reason), result.token_ids, stops, calls=bool(calls)
    )
    answer = MessageObject(
        id=blocks.message_id,
        model=started.model,
        content=blocks.made(),
        stop_reason=reason,
        stop_sequence=matched,
        usage=_usage(started, [result.usage]),
    )
    return JSONResponse(answer.model_dump(mode="json"))


#: ``output_config.effort`` as an effort level.
_LEVELS: dict[str, Effort] = {
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
    "max": "high",
}


def _effort(body: MessagesRequest) -> Effort | None:
    """``thinking`` and ``output_config.effort`` as an effort level: ``disabled`` is
    ``none``; ``enabled`` turns thinking on (its ``budget_tokens`` wins over any share);
    ``adaptive`` takes the effort's share, ``medium`` when none is given."""
    given = body.output_config.effort if body.output_config is not None else None
    level = None if given is None else _LEVELS[given]
    thinking = body.thinking
    if thinking is None:
        return level
    if thinking.type == "disabled":
        return "none"
    return level or "medium"


# ---- input -----------------------------------------------------------------------------


def _system(system: str | list[Any] | None) -> list[dict[str, Any]]:
    if system is None:
        return []
    text = system if isinstance(system, str) else _texts(system, "system")
    return [{"role": "system", "content": text}] if text else []


def conversation(body: MessagesRequest) -> list[dict[str, Any]]:
    """``messages`` as chat-template messages: an assistant turn's ``thinking``, ``text``
    and ``tool_use`` blocks make one message (its reasoning, content, tool calls); a user
    turn's ``tool_result`` blocks each a ``tool`` message, its text a user message.

    Raises:
        APIError: 400 naming ``messages[i].content[j]`` for a block that is not one of these.
    """
    out: list[dict[str, Any]] = []
    for i, message in enumerate(body.messages):
        where = f"messages[{i}].content"
        if isinstance(message.content, str):
            out.append({"role": message.role, "content": message.content})
            continue
        turn: dict[str, Any] = {"role": message.role, "content": ""}
        for j, block in enumerate(message.content):
            at = f"{where}[{j}]"
            if not isinstance(block, dict):
                raise bad_request(f"{at} must be a content block (an object with a type)", param=at)
            kind = block.get("type")
            if kind == "text":
                turn["content"] += _string(block, "text", at)
            elif kind == "tool_result" and message.role == "user":
                content = block.get("content", "")
                text = content if isinstance(content, str) else _texts(content, f"{at}.content")
                out.append(
                    {"role": "tool", "tool_call_id": _string(block, "tool_use_id", at), "content": text}
                )
            elif kind == "tool_use" and message.role == "assistant":
                arguments = block.get("input")
                if not isinstance(arguments, dict):
                    raise bad_request(f"{at}.input must be an object", param=f"{at}.input")
                call = {
                    "id": _string(block, "id", at),
                    "type": "function",
                    "function": {"name": _string(block, "name", at), "arguments": json.dumps(arguments)},
                }
                turn.setdefault("tool_calls", []).append(call)
            elif kind == "thinking" and message.role == "assistant":
                turn["reasoning_content"] = _string(block, "thinking", at)
            elif kind == "redacted_thinking" and message.role == "assistant":
                continue
            else:
                raise bad_request(
                    f"{at} is a {kind!r} block, which a {message.role} message here cannot hold: give text, "
                    + ("tool_result" if message.role == "user" else "thinking and tool_use")
                    + " blocks",
                    param=at,
                )
        if turn["content"] or turn.get("tool_calls") or turn.get("reasoning_content"):
            out.append(turn)
    return out


def _texts(blocks: Any, where: str) -> str:
    if not isinstance(blocks, list):
        raise bad_request(f"{where} must be a string or a list of text blocks", param=where)
    out = []
    for j, block in enumerate(blocks):
        if (
            not isinstance(block, dict)
            or block.get("type") != "text"
            or not isinstance(block.get("text"), str)
        ):
            raise bad_request(f"{where}[{j}] must be a text block", param=f"{where}[{j}]")
        out.append(block["text"])
    return "".join(out)


def _string(block: dict[str, Any], key: str, where: str) -> str:
    value = block.get(key)
    if not isinstance(value, str):
        raise bad_request(f"{where}.{key} must be a string", param=f"{where}.{key}")
    return value


_CHAT_TOOL = re.compile(r"(tools\[\d+\])\.function(\.parameters)?|tool_choice\.function")


def _tools(body: MessagesRequest, family: ReasoningFamily) -> ToolPlan:
    """The tools in chat's shape, read by the one tool reader; its errors name the
    Messages fields (``tools[0].input_schema``)."""
    tools = None
    if body.tools is not None:
        tools = []
        for i, tool in enumerate(body.tools):
            where = f"tools[{i}]"
            if not isinstance(tool, dict) or tool.get("type", "custom") != "custom":
                kind = tool.get("type") if isinstance(tool, dict) else None
                raise bad_request(
                    f"{where}.type {kind!r} is not served here: give custom tools (name, input_schema)",
                    param=f"{where}.type",
                )
            if "input_schema" not in tool:
                raise bad_request(f"{where}.input_schema is required", param=f"{where}.input_schema")
            function = {"name": tool.get("name"), "parameters": tool["input_schema"]}
            if "description" in tool:
                function["description"] = tool["description"]
            tools.append({"type": "function", "function": function})
    choice, parallel = _choice(body.tool_choice)
    try:
        return tool_plan(tools, choice, parallel, family)
    except APIError as e:

        def rename(text: str) -> str:
            return _CHAT_TOOL.sub(
                lambda m: (m.group(1) + ".input_schema") if m.group(2) else (m.group(1) or "tool_choice"),
                text,
            )

        e.param = rename(e.param) if e.param else None
        e.message = rename(e.message)
        raise


def _choice(value: Any) -> tuple[Any, bool | None]:
    """Anthropic's ``tool_choice`` as chat's, and whether calls may be parallel."""
    if value is None:
        return None, None
    if not isinstance(value, dict) or value.get("type") not in ("auto", "any", "tool", "none"):
        raise bad_request(
            'tool_choice must be {"type": "auto"}, {"type": "any"}, {"type": "tool", "name": ...} or {"type": "none"}',
            param="tool_choice",
        )
    kind = value["type"]
    disable = value.get("disable_parallel_tool_use")
    if disable is not None and not isinstance(disable, bool):
        raise bad_request("tool_choice.disable_parallel_tool_use must be true or false", param="tool_choice")
    parallel = None if disable is None else not disable
    if kind == "tool":
        name = value.get("name")
        if not isinstance(name, str):
            raise bad_request("tool_choice.name must be a string", param="tool_choice.name")
        return {"type": "function", "function": {"name": name}}, parallel
    return {"auto": "auto", "any": "required", "none": "none"}[kind], parallel


# ---- output ------------------------------------------------------------------------------

BlockKind = Literal["thinking", "text", "tool_use"]


@dataclass(slots=True)
class _Block:
    kind: BlockKind
    text: str = ""
    id: str = ""
    name: str = ""


@dataclass(slots=True)
class BlockBuilder:
    """The answer's content blocks from a choice's deltas, and the stream's block events:
    a block opens when the kind of output changes (thought, text, each call) and the one
    before closes. Whitespace alone between the thought and a call is not a text block."""

    message_id: str
    shown: bool = True  # the thought's text is shown (``display: "omitted"``: empty blocks)
    blocks: list[_Block] = field(default_factory=list)
    _open: bool = False
    _held: str = ""
    _calls: dict[int, _Block] = field(default_factory=dict)

    def feed(self, *, reasoning: str, content: str, calls: Sequence[ToolCallDelta]) -> list[bytes]:
        out: list[bytes] = []
        if reasoning:
            out += self._add("thinking", reasoning if self.shown else "")
        if content:
            if self._current("text"):
                out += self._add("text", content)
            elif content.strip():
                out += self._add("text", self._held + content)
                self._held = ""
            else:
                self._held += content
        for piece in calls:
            block = self._calls.get(piece.index)
            if block is None:
                self._held = ""
                block = self._calls[piece.index] = _Block(
                    "tool_use", id=f"toolu_{uuid.uuid4().hex[:24]}", name=piece.name or ""
                )
                out += self._start(block)
            if piece.arguments:
                block.text += piece.arguments
                out.append(
                    self._event(
                        "content_block_delta",
                        delta={"type": "input_json_delta", "partial_json": piece.arguments},
                    )
                )
        return out

    @property
    def has_calls(self) -> bool:
        return bool(self._calls)

    def finish(self) -> list[bytes]:
        """Close the last block; an answer without calls always has a text block."""
        out: list[bytes] = []
        if not self._calls and not any(b.kind == "text" for b in self.blocks):
            out += self._start(_Block("text", text=self._held))
        return out + self._stop()

    def made(self) -> list[ContentBlock]:
        """The blocks on the wire (a call's input parsed from its arguments' JSON)."""
        made: list[ContentBlock] = []
        for block in self.blocks:
            if block.kind == "thinking":
                made.append(ThinkingBlock(thinking=block.text))
            elif block.kind == "text":
                made.append(TextBlock(text=block.text))
            else:
                made.append(ToolUseBlock(id=block.id, name=block.name, input=_arguments(block)))
        return made

    def _current(self, kind: BlockKind) -> bool:
        return self._open and self.blocks[-1].kind == kind

    def _add(self, kind: Literal["thinking", "text"], text: str) -> list[bytes]:
        out: list[bytes] = [] if self._current(kind) else self._start(_Block(kind))
        self.blocks[-1].text += text
        if not text:
            return out
        delta = (
            {"type": "thinking_delta", "thinking": text}
            if kind == "thinking"
            else {"type": "text_delta", "text": text}
        )
        out.append(self._event("content_block_delta", delta=delta))
        return out

    def _start(self, block: _Block) -> list[bytes]:
        out = self._stop()
        self.blocks.append(block)
        self._open = True
        start: dict[str, Any]
        if block.kind == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
        elif block.kind == "text":
            start = {"type": "text", "text": ""}
        else:
            start = {"type": "tool_use", "id": block.id, "name": block.name, "input": {}}
        out.append(self._event("content_block_start", content_block=start))
        if block.kind == "text" and block.text:
            out.append(self._event("content_block_delta", delta={"type": "text_delta", "text": block.text}))
        return out

    def _stop(self) -> list[bytes]:
        if not self._open:
            return []
        self._open = False
        out = []
        if self.blocks[-1].kind == "thinking":
            out.append(self._event("content_block_delta", delta={"type": "signature_delta", "signature": ""}))
        out.append(self._event("content_block_stop"))
        return out

    def _event(self, kind: str, **payload: Any) -> bytes:
        return named_event(kind, {"type": kind, "index": len(self.blocks) - 1, **payload})


def _arguments(block: _Block) -> dict[str, Any]:
    try:
        value = json.loads(block.text or "{}")
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise APIError(
            500,
            f"the call to {block.name} has arguments that are not a JSON object",
            type="server_error",
            code="generation_failed",
        )
    return value


def _stop_reason(
    engine: Engine, finish: str | None, token_ids: Sequence[int], stops: Sequence[str], *, calls: bool
) -> tuple[StopReason | None, str | None]:
    """Anthropic's ``stop_reason`` and, for ``stop_sequence``, the sequence the answer
    met first (found in the generated text after the thought)."""
    if finish == "length":
        return "max_tokens", None
    if calls:
        return "tool_use", None
    if stops:
        text = engine.model.tokenizer.decode(list(token_ids)).rsplit(engine.model.family.think_end, 1)[-1]
        found = [(text.find(s), s) for s in stops if s in text]
        if found:
            return "stop_sequence", min(found)[1]
    return "end_turn", None


def _usage(started: Started, usages: Sequence[EngineUsage | None]) -> MessagesUsage:
    usage = started.usage(usages)
    cached = usage.prompt_tokens_details.cached_tokens
    return MessagesUsage(
        input_tokens=usage.prompt_tokens - cached,
        output_tokens=usage.completion_tokens,
        cache_read_input_tokens=cached,
    )


async def _events(
    started: Started, state: ServerState, blocks: BlockBuilder, engine: Engine, stops: Sequence[str]
) -> AsyncIterator[bytes]:
    start = MessageObject(
        id=blocks.message_id, model=started.model, content=[], stop_reason=None, usage=_usage(started, [])
    )
    yield named_event("message_start", {"type": "message_start", "message": start.model_dump(mode="json")})
    token_ids: list[int] = []
    try:
        async for _, delta in merged(started.submitted, metrics=state.metrics):
            token_ids += delta.token_ids
            for chunk in blocks.feed(
                reasoning=delta.reasoning, content=delta.content, calls=delta.tool_calls
            ):
                yield chunk
            if delta.finish_reason is None:
                continue
            for chunk in blocks.finish():
                yield chunk
            finish = finish_reason_name(delta.finish_reason)
            if delta.unmet is not None:
                yield named_event("error", unmet_constraint(0, delta.unmet).anthropic_body())
                return
            if delta.error or finish == "abort":
                error = APIError(500, delta.error or "the request was aborted", type="server_error")
                yield named_event("error", error.anthropic_body())
                return
            reason, matched = _stop_reason(engine, finish, token_ids, stops, calls=blocks.has_calls)
            usage = _usage(started, [delta.usage])
            yield named_event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": matched},
                    "usage": {"output_tokens": usage.output_tokens},
                },
            )
            yield named_event("message_stop", {"type": "message_stop"})
    except Exception:  # a fault mid-stream: tell the client in-band, the status is sent already
        log.exception("streamed message %s failed", blocks.message_id)
        yield named_event(
            "error", APIError(500, "internal server error", type="server_error").anthropic_body()
        )
