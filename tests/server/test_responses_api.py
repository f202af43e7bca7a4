"""``/v1/responses`` over HTTP with the official openai client and the OpenAI Agents SDK.

On the embedded SmolLM2 (a real model, the embedded one ``thinkstruct serve`` runs):
``responses.create`` answers a ``reasoning`` item and a ``message``; ``responses.parse``
returns the Pydantic model; a stream's typed events join to the final response, which is
the stored one; a required call validates, and the next turn through
``previous_response_id`` reuses the first turn's prompt from the prefix cache;
``reasoning.effort`` turns the thought off or sets its budget; an Agents SDK agent with a
function tool and an ``output_type`` runs to a validated final output. On the tiny model:
every malformed field is a 400 naming it in the Responses API's own names, nothing is
generated, and the next request is answered. The store's bounds run on a manual clock.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel
from server_harness import ManualClock, RunningServer, serving

from thinkstruct.engine.core.thinking_budget import default_thinking_budget
from thinkstruct.server import ServerSettings
from thinkstruct.server.effort import EFFORT_SHARES
from thinkstruct.server.response_store import ResponseStore, StoreLimits

TEMP_TOOL = {
    "type": "function",
    "name": "get_temperature",
    "description": "The temperature in a city, in degrees Celsius",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


class Weather(BaseModel):
    city: str
    temperature: int


@pytest.fixture(scope="module")
def smol_model(smol_server: RunningServer) -> str:
    return str(smol_server.state.model_name)


@pytest.fixture(scope="module")
def tiny_model(tiny_server: RunningServer) -> str:
    return str(tiny_server.state.model_name)


def extension(response: Any) -> dict[str, Any]:
    return dict((response.model_extra or {})["thinkstruct"])


# ---- the embedded model --------------------------------------------------------------------


@pytest.mark.slow
def test_create_answers_a_thought_and_a_message_kept_for_get_and_delete(
    smol: openai.OpenAI, smol_model: str
) -> None:
    response = smol.responses.create(
        model=smol_model, input="Say hello in one word.", max_output_tokens=120, temperature=0
    )
    assert response.status == "completed", response
    assert [item.type for item in response.output] == ["reasoning", "message"]
    thought = response.output[0]
    assert thought.content and thought.content[0].text.strip()
    assert response.output_text.strip()
    usage = response.usage
    assert usage is not None
    assert usage.output_tokens_details.reasoning_tokens >= 1
    assert usage.output_tokens > usage.output_tokens_details.reasoning_tokens
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    again = smol.responses.retrieve(response.id)
    assert again.model_dump() == response.model_dump()
    smol.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        smol.responses.retrieve(response.id)


@pytest.mark.slow
def test_parse_returns_the_pydantic_model(smol: openai.OpenAI, smol_model: str) -> None:
    parsed = smol.responses.parse(
        model=smol_model,
        input="It is 21 degrees in Rome. Give the city and the temperature.",
        text_format=Weather,
        max_output_tokens=200,
        temperature=0,
    )
    assert parsed.status == "completed"
    assert isinstance(parsed.output_parsed, Weather)
    assert parsed.output_parsed == Weather.model_validate_json(parsed.output_text)


@pytest.mark.slow
def test_stream_events_join_to_the_stored_response(smol: openai.OpenAI, smol_model: str) -> None:
    events = []
    with smol.responses.stream(
        model=smol_model,
        input="Name a colour.",
        max_output_tokens=120,
        temperature=0.7,
        extra_body={"seed": 3},
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added = [e.output_index for e in events if e.type == "response.output_item.added"]
    done = [e.output_index for e in events if e.type == "response.output_item.done"]
    assert added == done == list(range(len(final.output)))
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert thought == final.output[0].content[0].text and thought
    assert text == final.output_text
    stored = smol.responses.retrieve(final.id)
    assert stored.output_text == final.output_text and stored.status == "completed"
    whole = smol.responses.create(
        model=smol_model,
        input="Name a colour.",
        max_output_tokens=120,
        temperature=0.7,
        extra_body={"seed": 3},
    )
    assert whole.output_text == final.output_text  # the same seeded answer, streamed or not


@pytest.mark.slow
def test_a_required_call_then_its_output_through_previous_response_id(
    smol: openai.OpenAI, smol_model: str
) -> None:
    first = smol.responses.create(
        model=smol_model,
        input="What is the temperature in Paris?",
        tools=[TEMP_TOOL],
        tool_choice="required",
        max_output_tokens=200,
        temperature=0,
    )
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls and first.status == "completed", first
    for call in calls:
        assert call.name == "get_temperature" and call.call_id.startswith("call_")
        jsonschema.validate(json.loads(call.arguments), TEMP_TOOL["parameters"])
    second = smol.responses.create(
        model=smol_model,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": c.call_id, "output": "18"} for c in calls],
        tools=[TEMP_TOOL],
        max_output_tokens=150,
        temperature=0,
    )
    # Greedy on a batch-invariant engine: the ending is fixed.
    assert second.status == "completed" and second.previous_response_id == first.id, second
    assert second.usage is not None and first.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens
    # The second prompt starts with the first one: its keys and values are reused (in
    # 32-token blocks, up to where the first prompt's last full block ends at least).
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens // 32 * 32


@pytest.mark.slow
def test_reasoning_effort_turns_the_thought_off_or_sets_its_budget(
    smol: openai.OpenAI, smol_model: str, smol_server: RunningServer
) -> None:
    off = smol.responses.create(
        model=smol_model,
        input="What is 2 + 3?",
        reasoning={"effort": "none"},
        max_output_tokens=60,
        temperature=0,
    )
    assert [item.type for item in off.output] == ["message"]
    assert off.usage is not None and off.usage.output_tokens_details.reasoning_tokens == 0
    engine = smol_server.state.engine
    for effort, share in EFFORT_SHARES.items():
        answer = smol.responses.create(
            model=smol_model,
            input="What is 2 + 3?",
            reasoning={"effort": effort},
            max_output_tokens=80,
            temperature=0,
        )
        expected = default_thinking_budget(
            80, share=share, tokenizer=engine.tokenizer, end_tag=engine.model.family.think_end
        )
        assert extension(answer)["max_reasoning_tokens"] == expected
        assert answer.output[0].type == "reasoning"
    wins = smol.responses.create(
        model=smol_model,
        input="What is 2 + 3?",
        reasoning={"effort": "high"},
        max_output_tokens=80,
        temperature=0,
        extra_body={"max_reasoning_tokens": 5},
    )
    assert extension(wins)["max_reasoning_tokens"] == 5


def run_weather_agent(
    server: RunningServer, *, instructions: str, settings: dict[str, Any], max_turns: int = 10
) -> tuple[Any, list[str]]:
    """An Agents SDK agent with a function tool (``get_temperature``, always 18) and the
    ``Weather`` output type, run against ``server`` with ``ModelSettings(**settings)``: its
    final output and the cities the tool was called for."""
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    asked: list[str] = []

    @function_tool
    def get_temperature(city: str) -> int:
        """The temperature in a city, in degrees Celsius."""
        asked.append(city)
        return 18

    agent = Agent(
        name="weather",
        instructions=instructions,
        tools=[get_temperature],
        output_type=Weather,
        model=OpenAIResponsesModel(model=str(server.state.model_name), openai_client=server.async_openai()),
        model_settings=ModelSettings(**settings),
    )
    result = asyncio.run(Runner.run(agent, "What is the temperature in Paris?", max_turns=max_turns))
    return result.final_output, asked


@pytest.mark.slow
def test_an_agents_sdk_agent_with_a_tool_and_an_output_type_runs(smol_server: RunningServer) -> None:
    output, asked = run_weather_agent(
        smol_server,
        # SmolLM2 under tools and an output type tends to call again after a result; the
        # instructions say when to stop, as they would for any small model.
        instructions="Call get_temperature once. When its result is in, reply with a JSON object with the city "
        "and its temperature.",
        settings={"temperature": 0.0, "max_tokens": 300},
        max_turns=6,
    )
    assert isinstance(output, Weather)
    # Every call the model made ran the tool, whose arguments the grammar held.
    assert all(isinstance(city, str) for city in asked)


#: Seeds of the agent at default settings, and the final output (city, temperature) each
#: one ends with on the test engine (the embedded model, int8 weights, float16 keys and
#: values).
AGENT_SEEDS: dict[int, tuple[str, int]] = {
    0: ("Greece", 26),
    3: ("Pas-de-Coupe", 2019),
    6: ("ECHO,", 296),
    7: ("Paris", 213),
    9: ("Paris ", 25),
}


@pytest.fixture(scope="module")
def default_server(smol_engine: Any) -> Iterator[RunningServer]:
    """The embedded model behind the server's default settings (``default_max_tokens``
    512, temperature 1, the default thinking share), as ``thinkstruct serve`` runs it."""
    with serving(smol_engine, ServerSettings()) as server:
        yield server


@pytest.mark.slow
def test_an_agents_sdk_agent_at_default_settings_finishes(default_server: RunningServer) -> None:
    """No temperature, no max_tokens, a plain instruction: the model chooses between a call
    and the JSON answer by its own odds, and every seeded run ends with a valid output; a
    seed run twice ends the same."""
    plain = "You answer questions about the weather."
    outcomes: dict[int, tuple[str, int]] = {}
    for seed in AGENT_SEEDS:
        output, asked = run_weather_agent(
            default_server, instructions=plain, settings={"extra_body": {"seed": seed}}
        )
        assert isinstance(output, Weather), (seed, output)
        assert all(isinstance(city, str) for city in asked)
        outcomes[seed] = (output.city, output.temperature)
    assert outcomes == AGENT_SEEDS
    first = min(AGENT_SEEDS)
    again, _ = run_weather_agent(default_server, instructions=plain, settings={"extra_body": {"seed": first}})
    assert (again.city, again.temperature) == AGENT_SEEDS[first]


# ---- malformed requests (tiny model) ----------------------------------------------------------


def _cases(model: str) -> dict[str, tuple[dict[str, Any], int, str]]:
    base: dict[str, Any] = {"model": model, "input": "hi", "max_output_tokens": 4}
    return {
        "unknown field": ({**base, "max_tokens": 4}, 400, "max_tokens"),
        "missing input": ({"model": model}, 400, "input"),
        "empty input list": ({**base, "input": []}, 400, "input"),
        "input item of unknown type": (
            {**base, "input": [{"type": "web_search_call"}]},
            400,
            "input[0].type",
        ),
        "input item not an object": ({**base, "input": ["hi"]}, 400, "input[0]"),
        "message with a bad role": (
            {**base, "input": [{"role": "wizard", "content": "x"}]},
            400,
            "input[0].role",
        ),
        "image part": (
            {**base, "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            400,
            "input[0].content[0]",
        ),
        "call output without call_id": (
            {**base, "input": [{"type": "function_call_output", "output": "x"}]},
            400,
            "input[0].call_id",
        ),
        "max_output_tokens negative": ({**base, "max_output_tokens": -1}, 400, "max_output_tokens"),
        "max_output_tokens past the context": (
            {**base, "max_output_tokens": 10**6},
            400,
            "max_output_tokens",
        ),
        "temperature as text": ({**base, "temperature": "hot"}, 400, "temperature"),
        "unknown effort": ({**base, "reasoning": {"effort": "extreme"}}, 400, "reasoning.effort"),
        "unknown format type": ({**base, "text": {"format": {"type": "xml"}}}, 400, "text.format"),
        "schema that is not one": (
            {**base, "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}}},
            400,
            "text.format.schema",
        ),
        "a hosted tool": ({**base, "tools": [{"type": "web_search"}]}, 400, "tools[0].type"),
        "a tool with a bad name": (
            {**base, "tools": [{**TEMP_TOOL, "name": "no spaces allowed"}]},
            400,
            "tools[0].name",
        ),
        "tool_choice naming no tool": (
            {**base, "tools": [TEMP_TOOL], "tool_choice": {"type": "function", "name": "other"}},
            400,
            "tool_choice.name",
        ),
        "background": ({**base, "background": True}, 400, "background"),
        "unknown previous response": (
            {**base, "previous_response_id": "resp_missing"},
            404,
            "previous_response_id",
        ),
        "unknown model": ({**base, "model": "no-such-model"}, 404, "model"),
    }


def test_malformed_fields_are_4xx_naming_them_and_nothing_is_generated(
    tiny_server: RunningServer, tiny_model: str, tiny_engine: Any
) -> None:
    generated = (tiny_engine.stats.prefill_tokens, tiny_engine.stats.generated_tokens)
    failures = []
    with tiny_server.http() as http:
        for case, (body, status, param) in _cases(tiny_model).items():
            response = http.post("/v1/responses", json=body)
            error = (
                response.json().get("error")
                if response.headers["content-type"] == "application/json"
                else None
            )
            if response.status_code != status or not error or error.get("param") != param:
                failures.append(f"{case}: {response.status_code} {response.text[:300]}")
        # Nothing was computed (a request whose schema fails while it compiles waits in the
        # queue meanwhile, and leaves it without a step).
        assert (tiny_engine.stats.prefill_tokens, tiny_engine.stats.generated_tokens) == generated
        ok = http.post("/v1/responses", json={"model": tiny_model, "input": "hi", "max_output_tokens": 3})
        assert ok.status_code == 200 and ok.json()["status"] in ("completed", "incomplete")
    assert not failures, "\n".join(failures)


def test_an_always_thinking_family_refuses_effort_none(tiny_server: RunningServer, tiny_model: str) -> None:
    from thinkstruct.parsers.reasoning_families import reasoning_families
    from thinkstruct.server.effort import effort_plan
    from thinkstruct.server.errors import APIError

    family = tiny_server.state.engine.model.family
    assert family.switch is not None  # the tiny model can turn it off: none is a plain request
    answer = tiny_server.openai().responses.create(
        model=tiny_model, input="hi", reasoning={"effort": "none"}, max_output_tokens=3
    )
    assert all(item.type != "reasoning" for item in answer.output)
    always = [f for f in reasoning_families().values() if f.always_thinks]
    assert always
    for entry in always:
        with pytest.raises(APIError) as refused:
            effort_plan("none", entry, None, param="reasoning.effort")
        assert refused.value.status == 400 and "always thinks" in refused.value.message
        assert refused.value.param == "reasoning.effort"
        assert effort_plan("minimal", entry, None, param="reasoning.effort").closed


def test_tools_in_the_responses_shape_reach_the_call_grammar(
    tiny_server: RunningServer, tiny_model: str
) -> None:
    answer = tiny_server.openai().responses.create(
        model=tiny_model,
        input="weather?",
        tools=[TEMP_TOOL],  # type: ignore[list-item]
        tool_choice={"type": "function", "name": "get_temperature"},
        max_output_tokens=60,
        extra_body={"seed": 1},
    )
    calls = [item for item in answer.output if item.type == "function_call"]
    if answer.status == "completed":
        assert calls and all(c.name == "get_temperature" for c in calls)
        for call in calls:
            jsonschema.validate(json.loads(call.arguments), TEMP_TOOL["parameters"])


# ---- the store ----------------------------------------------------------------------------------


def test_stored_responses_expire_on_the_store_clock(tiny_engine: Any) -> None:
    clock = ManualClock()
    store = ResponseStore(StoreLimits(max_entries=2, ttl_s=60.0), clock=clock)
    with RunningServer(_app(tiny_engine, store)) as server:
        client = server.openai()
        model = server.state.model_name
        ids = [
            client.responses.create(model=model, input=f"hi {i}", max_output_tokens=2).id for i in range(3)
        ]
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(ids[0])  # the oldest of three, past two entries
        assert client.responses.retrieve(ids[2]).id == ids[2]
        unstored = client.responses.create(model=model, input="x", max_output_tokens=2, store=False)
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(unstored.id)
        clock.advance(61.0)
        with pytest.raises(openai.NotFoundError) as gone:
            client.responses.create(
                model=model, input="again", previous_response_id=ids[2], max_output_tokens=2
            )
        assert gone.value.body["param"] == "previous_response_id"  # type: ignore[index]


def _app(engine: Any, store: ResponseStore) -> Any:
    from thinkstruct.server import create_app

    return create_app(engine, ServerSettings(default_max_tokens=8), responses=store)


def test_the_store_flag_sizes_the_store() -> None:
    assert StoreLimits.parse("entries=5,mib=2,ttl=30") == StoreLimits(
        max_entries=5, max_bytes=2 << 20, ttl_s=30.0
    )
    assert StoreLimits.parse("ttl=10") == StoreLimits(ttl_s=10.0)
    for bad in ("entries=x", "size=3", "ttl=0", "entries=-1"):
        with pytest.raises(ValueError):
            StoreLimits.parse(bad)


def test_an_api_key_guards_the_new_paths(tiny_engine: Any) -> None:
    with serving(tiny_engine, ServerSettings(api_key="k-123")) as server:
        with httpx.Client(base_url=server.url) as http:
            for path in ("/v1/responses", "/tokenize", "/detokenize"):
                assert http.post(path, json={}).status_code == 401
            assert http.post("/v1/responses", json={}, headers={"x-api-key": "k-123"}).status_code == 400
