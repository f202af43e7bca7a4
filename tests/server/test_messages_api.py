"""``/v1/messages`` over HTTP with the official anthropic client.

On the embedded SmolLM2: a forced tool with thinking on answers a ``thinking`` block
then a ``tool_use`` block whose input validates; a stream's events join to the message
the non-streamed request gives; a stop sequence is reported as the one met. On the tiny
model: every malformed field is a 400 in Anthropic's error shape naming the field,
nothing is generated, and ``x-api-key`` is accepted as the key.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest
from server_harness import API_KEY, RunningServer, serving

from thinkstruct.server import ServerSettings

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [{"name": "get_weather", "description": "The weather in a city", "input_schema": WEATHER}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def client(server: RunningServer, *, api_key: str = "none") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=api_key, max_retries=0, timeout=300.0)


@pytest.fixture(scope="module")
def smol_model(smol_server: RunningServer) -> str:
    return str(smol_server.state.model_name)


@pytest.fixture(scope="module")
def tiny_model(tiny_server: RunningServer) -> str:
    return str(tiny_server.state.model_name)


@pytest.mark.slow
def test_a_forced_tool_with_thinking(smol_server: RunningServer, smol_model: str) -> None:
    message = client(smol_server).messages.create(
        model=smol_model,
        max_tokens=300,
        messages=ASK,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice={"type": "tool", "name": "get_weather"},
        thinking={"type": "enabled", "budget_tokens": 60},
        extra_body={"temperature": 0},
    )
    kinds = [block.type for block in message.content]
    assert kinds[0] == "thinking" and message.content[0].thinking.strip()  # type: ignore[union-attr]
    assert message.stop_reason == "tool_use" and set(kinds[1:]) == {"tool_use"}, message
    for block in message.content[1:]:
        assert block.name == "get_weather" and block.id.startswith("toolu_")  # type: ignore[union-attr]
        jsonschema.validate(block.input, WEATHER)  # type: ignore[union-attr]
    assert message.usage.output_tokens > 0 and message.usage.input_tokens > 0
    # The call and its result make the next turn; the conversation renders and answers.
    follow = client(smol_server).messages.create(
        model=smol_model,
        max_tokens=80,
        messages=[
            *ASK,
            {"role": "assistant", "content": [b.model_dump() for b in message.content]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": message.content[1].id, "content": "sunny"}
                ],  # type: ignore[union-attr]
            },
        ],  # type: ignore[arg-type]
        thinking={"type": "disabled"},
        extra_body={"temperature": 0},
    )
    # Greedy on a batch-invariant engine: the ending is fixed.
    assert [b.type for b in follow.content] == ["text"] and follow.stop_reason == "end_turn", follow


@pytest.mark.slow
def test_a_stream_joins_to_the_message(smol_server: RunningServer, smol_model: str) -> None:
    ask: dict[str, Any] = {
        "model": smol_model,
        "max_tokens": 120,
        "messages": [{"role": "user", "content": "Name a fruit."}],
        "extra_body": {"temperature": 0},
        "thinking": {"type": "enabled", "budget_tokens": 40},
    }
    with client(smol_server).messages.stream(**ask) as stream:
        events = list(stream)
        streamed = stream.get_final_message()
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    starts = [e.index for e in events if e.type == "content_block_start"]
    stops = [e.index for e in events if e.type == "content_block_stop"]
    assert starts == stops == list(range(len(streamed.content)))
    whole = client(smol_server).messages.create(**ask)
    assert [b.model_dump() for b in streamed.content] == [b.model_dump() for b in whole.content]
    assert (
        streamed.stop_reason == whole.stop_reason
        and streamed.usage.output_tokens == whole.usage.output_tokens
    )


@pytest.mark.slow
def test_structured_output_and_effort(smol_server: RunningServer, smol_model: str) -> None:
    """``output_config.format`` holds the text to its schema; ``output_config.effort``
    with adaptive thinking sets the thought's share of ``max_tokens``."""
    message = client(smol_server).messages.create(
        model=smol_model,
        max_tokens=200,
        messages=[{"role": "user", "content": "It rains in Oslo. Give the city and the unit you use."}],
        output_config={"format": {"type": "json_schema", "schema": WEATHER}, "effort": "low"},
        thinking={"type": "adaptive", "display": "omitted"},
        extra_body={"temperature": 0},
    )
    assert message.stop_reason == "end_turn", message
    thought, text = message.content
    assert thought.type == "thinking" and thought.thinking == ""  # display: omitted
    jsonschema.validate(json.loads(text.text), WEATHER)  # type: ignore[union-attr]


@pytest.mark.slow
def test_the_stop_sequence_met_is_reported(smol_server: RunningServer, smol_model: str) -> None:
    message = client(smol_server).messages.create(
        model=smol_model,
        max_tokens=120,
        messages=[{"role": "user", "content": "Write a sentence about the sea."}],
        thinking={"type": "disabled"},
        stop_sequences=["qqqq", "e"],
        extra_body={"temperature": 0},
    )
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == "e"
    assert "e" not in message.content[0].text  # type: ignore[union-attr]


# ---- malformed requests (tiny model) ----------------------------------------------------------


def _cases(model: str) -> dict[str, tuple[dict[str, Any], int, str]]:
    base: dict[str, Any] = {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    return {
        "missing max_tokens": ({"model": model, "messages": base["messages"]}, 400, "max_tokens"),
        "unknown field": ({**base, "frequency_penalty": 1}, 400, "frequency_penalty"),
        "empty messages": ({**base, "messages": []}, 400, "messages"),
        "system role in messages": (
            {**base, "messages": [{"role": "system", "content": "x"}]},
            400,
            "messages[0].role",
        ),
        "image block": (
            {**base, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            400,
            "messages[0].content[0]",
        ),
        "tool_use from the user": (
            {
                **base,
                "messages": [
                    {"role": "user", "content": [{"type": "tool_use", "id": "x", "name": "f", "input": {}}]}
                ],
            },
            400,
            "messages[0].content[0]",
        ),
        "temperature above 1": ({**base, "temperature": 1.5}, 400, "temperature"),
        "empty stop sequence": ({**base, "stop_sequences": [""]}, 400, "stop_sequences"),
        "tool without input_schema": ({**base, "tools": [{"name": "f"}]}, 400, "tools[0].input_schema"),
        "tool schema not an object": (
            {**base, "tools": [{"name": "f", "input_schema": "x"}]},
            400,
            "tools[0].input_schema",
        ),
        "tool_choice naming no tool": (
            {**base, "tools": TOOLS, "tool_choice": {"type": "tool", "name": "other"}},
            400,
            "tool_choice.name",
        ),
        "unknown tool_choice": (
            {**base, "tools": TOOLS, "tool_choice": {"type": "sometimes"}},
            400,
            "tool_choice",
        ),
        "budget not below max_tokens": (
            {**base, "thinking": {"type": "enabled", "budget_tokens": 4}},
            400,
            "thinking.budget_tokens",
        ),
        "unknown model": ({**base, "model": "no-such-model"}, 404, "model"),
    }


def test_malformed_fields_are_anthropic_errors_naming_them(
    tiny_server: RunningServer, tiny_model: str, tiny_engine: Any
) -> None:
    generated = (tiny_engine.stats.prefill_tokens, tiny_engine.stats.generated_tokens)
    failures = []
    with tiny_server.http() as http:
        for case, (body, status, param) in _cases(tiny_model).items():
            response = http.post("/v1/messages", json=body)
            error = response.json()
            ok = (
                response.status_code == status
                and error.get("type") == "error"
                and set(error["error"]) == {"type", "message"}
                and param in error["error"]["message"]
            )
            if not ok:
                failures.append(f"{case}: {response.status_code} {response.text[:300]}")
        assert (tiny_engine.stats.prefill_tokens, tiny_engine.stats.generated_tokens) == generated
    assert not failures, "\n".join(failures)
    with pytest.raises(anthropic.BadRequestError) as refused:
        client(tiny_server).messages.create(model=tiny_model, max_tokens=4, messages=[])
    assert refused.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    answer = client(tiny_server).messages.create(
        model=tiny_model,
        max_tokens=3,
        messages=ASK,  # type: ignore[arg-type]
        extra_body={"temperature": 0},
    )
    assert answer.stop_reason == "max_tokens", answer  # greedy: the ending is fixed


def test_x_api_key_is_the_key(tiny_engine: Any) -> None:
    with serving(tiny_engine, ServerSettings(api_key=API_KEY, default_max_tokens=4)) as server:
        model = server.state.model_name
        with pytest.raises(anthropic.AuthenticationError) as refused:
            client(server, api_key="wrong").messages.create(model=model, max_tokens=2, messages=ASK)  # type: ignore[arg-type]
        assert refused.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
        answer = client(server, api_key=API_KEY).messages.create(model=model, max_tokens=2, messages=ASK)  # type: ignore[arg-type]
        assert answer.usage.output_tokens >= 1
        with httpx.Client(base_url=server.url) as http:
            assert http.get("/v1/models", headers={"x-api-key": API_KEY}).status_code == 200
