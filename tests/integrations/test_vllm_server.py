"""thinkstruct inside vLLM, for real: vLLM's own OpenAI server (CPU build, .venv-vllm) on the
embedded SmolLM2, the plugin loaded by vLLM itself (entry point), requests over HTTP with
the official ``openai`` client. One vLLM start for the module."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest
from vllm_server import VllmServer, vllm_server

#: The compile deadline the server runs with (THINKSTRUCT_VLLM_COMPILE_TIMEOUT_S). The
#: fixture compiles once with each backend before the tests (see ``warm``), so a deadline
#: covers a compile, not a compile service's cold start on a busy machine; the hostile
#: grammar's compile burns a core until it.
DEADLINE_S = 10

#: The first test's setup starts vLLM (up to START_DEADLINE_S); the others reuse it.
pytestmark = pytest.mark.timeout(600)

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def server() -> Iterator[VllmServer]:
    with vllm_server(env={"THINKSTRUCT_VLLM_COMPILE_TIMEOUT_S": str(DEADLINE_S)}) as running:
        warm(running)
        yield running


def warm(server: VllmServer) -> None:
    """A request with a JSON Schema and one with a grammar over 64 KiB (compiled, like the
    hostile one, in a worker), each compiled in both of vLLM's processes: their compile
    services and each backend's worker setup start here, not within a test's deadline. A
    start slower than the deadline on a busy machine is load, so a timed-out warm-up is
    sent again (it is not remembered)."""
    wide = "root ::= " + " | ".join(f'"w{i}x"' for i in range(9_000))  # about 0.1 s to compile
    constraints = (
        {"response_format": response_format(PERSON)},
        {"extra_body": {"structured_outputs": {"grammar": wide}}},
    )
    for constraint in constraints:
        for attempt in range(4):
            try:
                server.openai().chat.completions.create(
                    model=server.model,
                    messages=[{"role": "user", "content": "a word"}],
                    max_tokens=2,
                    **constraint,  # type: ignore[arg-type]
                )
                break
            except openai.BadRequestError as error:
                if "longer than" not in error.message or attempt == 3:
                    raise


def response_format(schema: dict[str, Any]) -> Any:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


def reasoning_of(message: Any) -> str | None:
    return getattr(message, "reasoning_content", None) or getattr(message, "reasoning", None)


#: Schemas strict mode refuses, with the pointer the refusal names: uniqueItems over
#: integers (an item "0" cannot be continued, so closing-token enforcement could leave no
#: token), and a pattern that is no regular expression.
REFUSED = {
    "/properties/ids/uniqueItems": {
        "type": "object",
        "properties": {"ids": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}},
    },
    "/properties/code/pattern": {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "([a-z]"}},
    },
}


@pytest.mark.parametrize("pointer", REFUSED)
def test_strict_refusal_names_the_pointer_before_generating(server: VllmServer, pointer: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        server.openai().chat.completions.create(
            model=server.model,
            messages=[{"role": "user", "content": "an answer"}],
            response_format=response_format(REFUSED[pointer]),
        )
    assert pointer in refused.value.message


def test_a_thought_in_reasoning_content_then_a_valid_answer(server: VllmServer) -> None:
    reply = server.openai().chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": "Invent a person. Answer in JSON with name and age."}],
        response_format=response_format(PERSON),
        max_tokens=160,
        temperature=0,
    )
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "stop"
    assert reasoning_of(message)
    assert "</think>" not in (message.content or "")
    jsonschema.validate(json.loads(message.content or ""), PERSON)


def closed_items(answer: str) -> list[str]:
    """The items of ``{"tags":[...`` that have closed, in an answer that may be cut off."""
    decoder = json.JSONDecoder()
    position = answer.index("[") + 1
    items = []
    while position < len(answer) and answer[position] == '"':
        try:
            item, position = decoder.raw_decode(answer, position)
        except ValueError:
            break  # an item still open where the answer was cut
        items.append(item)
        position += answer[position : position + 1] == ","
    return items


def test_a_checked_keyword_holds_without_undo(server: VllmServer) -> None:
    """uniqueItems is enforced at each item's closing quote: asked to repeat an item, the
    model (greedy) can never close the repeat."""
    tags = {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True, "minItems": 4}
        },
        "required": ["tags"],
        "additionalProperties": False,
    }
    reply = server.openai().chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": "Give the tag 'a' four times."}],
        response_format=response_format(tags),
        max_tokens=120,
        temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    answer = reply.choices[0].message.content or ""
    items = closed_items(answer)
    assert len(items) >= 2, answer
    assert len(set(items)) == len(items), answer
    if reply.choices[0].finish_reason == "stop":
        jsonschema.validate(json.loads(answer), tags)


def test_a_forced_tool_call(server: VllmServer) -> None:
    weather = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"],
        "additionalProperties": False,
    }
    reply = server.openai().chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": "What is the weather in Paris this week?"}],
        tools=[{"type": "function", "function": {"name": "get_weather", "parameters": weather}}],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=160,
        temperature=0,
    )
    calls = reply.choices[0].message.tool_calls or []
    assert [call.function.name for call in calls] == ["get_weather"]  # type: ignore[union-attr]
    jsonschema.validate(json.loads(calls[0].function.arguments), weather)  # type: ignore[union-attr]


def test_a_hostile_grammar_is_answered_by_its_deadline_while_another_request_streams(
    server: VllmServer,
) -> None:
    """A grammar whose compile runs for minutes: a 400 naming the deadline, while a
    request already streaming keeps streaming and completes."""
    # 200,000 alternatives: llguidance takes minutes, in a worker the deadline kills.
    hostile = "root ::= " + " | ".join(f'"w{i}x"' for i in range(200_000))
    events: list[str] = []
    lock = threading.Lock()
    first_chunk = threading.Event()

    def note(event: str) -> None:
        with lock:
            events.append(event)

    def stream() -> None:
        chunks = server.openai().chat.completions.create(
            model=server.model,
            messages=[{"role": "user", "content": "Count from one to one hundred in words."}],
            max_tokens=400,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True, "chat_template_kwargs": {"enable_thinking": False}},
        )
        for chunk in chunks:
            if chunk.choices and chunk.choices[0].delta.content:
                note("chunk")
                first_chunk.set()
            if chunk.choices and chunk.choices[0].finish_reason:
                note(f"finished:{chunk.choices[0].finish_reason}")

    streaming = threading.Thread(target=stream)
    streaming.start()
    assert first_chunk.wait(timeout=600), "the streaming request never started"
    note("hostile sent")
    with pytest.raises(openai.BadRequestError) as refused:
        server.openai().chat.completions.create(
            model=server.model,
            messages=[{"role": "user", "content": "a word"}],
            max_tokens=8,
            extra_body={"structured_outputs": {"grammar": hostile}},
        )
    note("hostile answered")
    streaming.join(timeout=900)
    assert not streaming.is_alive()
    assert f"longer than {DEADLINE_S} s" in refused.value.message
    assert events.count("finished:length") == 1
    # The compile ran for its whole deadline; the stream, 399 tokens from its end when the
    # grammar was sent, went on meanwhile (whether it finished before the refusal or after).
    sent, answered = events.index("hostile sent"), events.index("hostile answered")
    assert "chunk" in events[sent:answered]
