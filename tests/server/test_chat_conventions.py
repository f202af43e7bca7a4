"""Conventions of clients written for other servers, on ``/v1/chat/completions``:
``reasoning_effort`` (OpenAI's reasoning models), ``response_format: {"type":
"json_object", "schema": S}`` (instructor's ``JSON_SCHEMA`` mode), and a JSON answer
format beside ``tool_choice: "auto"`` (an answer is the calls or that JSON)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field
from server_harness import RunningServer

from thinkstruct.engine.core.thinking_budget import default_thinking_budget
from thinkstruct.server.effort import EFFORT_SHARES

ASK = [{"role": "user", "content": "What is 2 + 3?"}]
NUMBER = {
    "type": "object",
    "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 100}},
    "required": ["answer"],
    "additionalProperties": False,
}


class City(BaseModel):
    name: str = Field(max_length=30)
    country: str = Field(max_length=30)


def info(answer: Any) -> dict[str, Any]:
    return dict((answer.model_extra or {})["thinkstruct"])


def test_reasoning_effort_on_chat(tiny: openai.OpenAI, tiny_server: RunningServer) -> None:
    model = tiny_server.state.model_name
    engine = tiny_server.state.engine
    off = tiny.chat.completions.create(model=model, messages=ASK, max_tokens=8, reasoning_effort="none")  # type: ignore[arg-type]
    assert off.choices[0].message.model_extra.get("reasoning_content") is None  # type: ignore[union-attr]
    assert info(off)["max_reasoning_tokens"] is None
    for effort, share in EFFORT_SHARES.items():
        on = tiny.chat.completions.create(model=model, messages=ASK, max_tokens=40, reasoning_effort=effort)  # type: ignore[arg-type]
        budget = default_thinking_budget(
            40, share=share, tokenizer=engine.tokenizer, end_tag=engine.model.family.think_end
        )
        assert info(on)["max_reasoning_tokens"] == budget
    # Without max_tokens the share is of the room the context leaves, and the answer keeps
    # the server's default max_tokens after it.
    roomy = tiny.chat.completions.create(model=model, messages=ASK, reasoning_effort="low", stream=False)  # type: ignore[arg-type]
    assert roomy.usage is not None
    room = engine.model.context_length - roomy.usage.prompt_tokens
    assert info(roomy)["max_reasoning_tokens"] == default_thinking_budget(
        room, share=EFFORT_SHARES["low"], tokenizer=engine.tokenizer, end_tag=engine.model.family.think_end
    )
    with pytest.raises(openai.BadRequestError) as refused:
        tiny.chat.completions.create(
            model=model,
            messages=ASK,  # type: ignore[arg-type]
            max_tokens=4,
            reasoning_effort="none",
            extra_body={"chat_template_kwargs": {"thinking": True}},
        )
    assert refused.value.body["param"] == "reasoning_effort"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as unknown:
        tiny.chat.completions.create(model=model, messages=ASK, max_tokens=4, reasoning_effort="max")  # type: ignore[arg-type]
    assert unknown.value.body["param"] == "reasoning_effort"  # type: ignore[index]


def test_json_object_with_a_schema_is_held_to_it(tiny: openai.OpenAI, tiny_server: RunningServer) -> None:
    model = tiny_server.state.model_name
    for seed in range(3):
        answer = tiny.chat.completions.create(
            model=model,
            messages=ASK,  # type: ignore[arg-type]
            max_tokens=60,
            seed=seed,
            response_format={"type": "json_object", "schema": NUMBER},  # type: ignore[typeddict-unknown-key]
        )
        choice = answer.choices[0]
        if choice.finish_reason == "stop":
            jsonschema.validate(json.loads(choice.message.content or ""), NUMBER)
    with pytest.raises(openai.BadRequestError) as refused:
        tiny.chat.completions.create(
            model=model,
            messages=ASK,  # type: ignore[arg-type]
            max_tokens=4,
            response_format={
                "type": "json_object",
                "schema": {"type": "integer", "minimum": 5, "maximum": 1},
            },  # type: ignore[typeddict-unknown-key]
        )
    assert refused.value.body["param"] == "response_format.schema"  # type: ignore[index]


@pytest.mark.slow
def test_instructor_json_schema_mode(smol_server: RunningServer) -> None:
    import instructor

    client = instructor.from_openai(smol_server.openai(), mode=instructor.Mode.JSON_SCHEMA)
    model = smol_server.state.model_name
    for question in ("Paris is in France.", "Rome is the capital of Italy.", "Berlin is a city in Germany."):
        city = client.chat.completions.create(
            model=model,
            response_model=City,
            messages=[{"role": "user", "content": f"{question} Give the city and its country."}],
            max_tokens=200,
            temperature=0,
            max_retries=0,
        )
        assert isinstance(city, City) and city.name


def test_a_json_format_beside_auto_tools_is_a_call_or_that_json(
    tiny: openai.OpenAI, tiny_server: RunningServer
) -> None:
    model = tiny_server.state.model_name
    tool = {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
                "additionalProperties": False,
            },
        },
    }
    kinds = set()
    for seed in range(6):
        answer = tiny.chat.completions.create(
            model=model,
            messages=ASK,  # type: ignore[arg-type]
            max_tokens=60,
            seed=seed,
            tools=[tool],  # type: ignore[list-item]
            response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": NUMBER}},
        )
        choice = answer.choices[0]
        if choice.finish_reason == "tool_calls":
            kinds.add("call")
            for call in choice.message.tool_calls or []:
                jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])  # type: ignore[index,union-attr]
        elif choice.finish_reason == "stop":
            kinds.add("json")
            jsonschema.validate(json.loads(choice.message.content or ""), NUMBER)
    assert kinds  # every finished answer was one of the two
    with pytest.raises(openai.BadRequestError) as refused:
        tiny.chat.completions.create(
            model=model,
            messages=ASK,  # type: ignore[arg-type]
            max_tokens=4,
            tools=[tool],  # type: ignore[list-item]
            extra_body={"regex": "[a-z]+"},
        )
    assert refused.value.body["code"] == "conflicting_constraints"  # type: ignore[index]
