"""An answer always comes: with thinking on and no ``max_reasoning_tokens``, the thought
gets the server's share of ``max_tokens`` and the answer the rest.

Over HTTP with the official client on the embedded SmolLM2 (which thinks by default and
rarely ends its thought by itself): a ``json_schema``, a ``choice``, a ``regex`` and a
forced tool call, none with a budget, each end with a complete, valid answer, and free
text too (a stop inside the thought ends the thought; the answer is never empty); an answer
that outgrows its share ends ``length`` with ``length_part: "answer"``, a ``max_tokens``
too small for any thought with ``length_part: "reasoning"`` (streamed too); an explicit
budget still wins. The default budget itself is checked as a property over any
``max_tokens`` and share, on the model's real tokenizer (its ``</think>`` is several tokens).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from server_harness import RunningServer

from thinkstruct.cli import main
from thinkstruct.engine.core.thinking_budget import default_thinking_budget
from thinkstruct.grammar.runtime.end_tag import end_tag_matcher
from thinkstruct.server import ServerSettings

pytestmark = pytest.mark.slow

ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}},
    "required": ["answer"],
    "additionalProperties": False,
}
STORY = {
    "type": "object",
    "properties": {"story": {"type": "string", "minLength": 400}},
    "required": ["story"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
DATE = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
CITIES = ["Paris", "London", "Berlin"]


def _format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module")
def model(smol_server: RunningServer) -> str:
    return str(smol_server.state.model_name)


@pytest.fixture(scope="module")
def tag_tokens(smol_server: RunningServer) -> int:
    """Tokens of the embedded model's forced ``</think>``."""
    engine = smol_server.state.require_engine()
    return len(end_tag_matcher(engine.tokenizer, engine.model.family.think_end).closing_ids(0))


def _ask_all(server: RunningServer, requests: list[dict[str, Any]]) -> list[Any]:
    async def run() -> list[Any]:
        async with server.async_openai() as client:
            return await asyncio.gather(*(client.chat.completions.create(**r) for r in requests))

    return asyncio.run(run())


def _budget(answer: Any) -> int:
    budget = (answer.model_extra or {})["thinkstruct"]["max_reasoning_tokens"]
    assert isinstance(budget, int)
    return budget


def test_every_constrained_kind_answers_without_a_budget(
    smol_server: RunningServer, model: str, tag_tokens: int
) -> None:
    share = smol_server.state.settings.reasoning_share
    requests: list[dict[str, Any]] = [
        {
            "messages": _user("What is 12 + 30? Answer as JSON."),
            "max_tokens": 200,
            "response_format": _format(ANSWER),
        },
        {
            "messages": _user("What is the capital of France?"),
            "max_tokens": 10,
            "extra_body": {"choice": CITIES},
        },
        {
            "messages": _user("When did Apollo 11 land? Give the date."),
            "max_tokens": 30,
            "extra_body": {"regex": DATE},
        },
        {
            "messages": _user("What will the weather be in Paris for the next 3 days?"),
            "max_tokens": 120,
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "parallel_tool_calls": False,
        },
        # No max_tokens: the share is of the server's default.
        {"messages": _user("Which is the capital of Germany?"), "extra_body": {"choice": CITIES}},
    ]
    answers = _ask_all(smol_server, [{"model": model, "temperature": 0, "seed": 7, **r} for r in requests])
    schema, choice, regex, tool, default = answers
    for answer, request in zip(answers, requests, strict=True):
        max_tokens = request.get("max_tokens", smol_server.state.settings.default_max_tokens)
        thought = answer.usage.completion_tokens_details.reasoning_tokens
        assert answer.choices[0].message.model_extra.get("reasoning_content")  # it did think
        # The whole thought, its forced end tag included, stays within the share.
        assert _budget(answer) >= 1 and _budget(answer) + tag_tokens <= max(
            math.floor(share * max_tokens), 1 + tag_tokens
        )
        assert thought <= _budget(answer) + tag_tokens
        assert answer.choices[0].model_extra.get("length_part") is None
    for answer in (schema, choice, regex, default):
        assert answer.choices[0].finish_reason == "stop", answer.choices[0]
    jsonschema.validate(json.loads(schema.choices[0].message.content), ANSWER)
    assert choice.choices[0].message.content in CITIES
    assert default.choices[0].message.content in CITIES
    assert re.fullmatch(DATE, regex.choices[0].message.content)
    assert tool.choices[0].finish_reason == "tool_calls", tool.choices[0]
    (call,) = tool.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)


def test_free_text_answers_when_the_model_stops_inside_its_thought(
    smol_server: RunningServer, model: str
) -> None:
    """SmolLM2 often stops right after a short thought ("The answer is: Spain" and its stop
    token): that stop ends the thought instead, and the response stops only once the
    answer has text (before, 14 of these 18 answers were empty)."""
    questions = ["What is 2+2?", "Name a color.", "Who wrote Hamlet?", "What is the capital of Spain?"]
    requests = [
        {"model": model, "messages": _user(q), "max_tokens": 120, "temperature": 0.7, "seed": seed}
        for q in questions
        for seed in range(3)
    ]
    answers = _ask_all(smol_server, requests)
    for answer in answers:
        choice = answer.choices[0]
        assert choice.message.model_extra.get("reasoning_content") is not None  # it thought
        assert choice.message.content and choice.message.content.strip(), choice
    # Seeded, on int8 weights on the compiled kernels (each row's numbers the same in any
    # batch): each answer's ending is fixed. All but two stop: "Name a color." with seed 0
    # and "What is the capital of Spain?" with seed 2 answer with text, then run to
    # max_tokens (with float32 keys and values every one stopped: the draws land elsewhere).
    assert smol_server.state.engine.runner.batch_invariant
    finishes = [a.choices[0].finish_reason for a in answers]
    ran_out = {3, 11}
    assert finishes == ["length" if i in ran_out else "stop" for i in range(len(requests))], finishes
    streamed = "".join(
        chunk.choices[0].delta.content or ""
        for chunk in smol_server.openai().chat.completions.create(**requests[-1], stream=True)
        if chunk.choices
    )
    assert streamed == answers[-1].choices[0].message.content


def test_length_says_which_part_ran_out(smol_server: RunningServer, model: str, tag_tokens: int) -> None:
    requests: list[dict[str, Any]] = [
        # The answer alone outgrows its share: 400 characters in 20-odd tokens.
        {
            "messages": _user("Tell me a story, as JSON."),
            "max_tokens": 40,
            "response_format": _format(STORY),
        },
        # An explicit budget wins over the share.
        {
            "messages": _user("What is 2 + 2? Answer as JSON."),
            "max_tokens": 200,
            "response_format": _format(ANSWER),
            "extra_body": {"max_reasoning_tokens": 5},
        },
    ]
    long_answer, explicit = _ask_all(
        smol_server, [{"model": model, "temperature": 0, "seed": 7, **r} for r in requests]
    )
    choice = long_answer.choices[0]
    assert choice.finish_reason == "length"
    assert choice.model_extra["length_part"] == "answer"
    assert re.match(r'\{\s*"story":\s*"', choice.message.content)  # cut, not empty
    assert long_answer.usage.completion_tokens_details.reasoning_tokens < long_answer.usage.completion_tokens
    assert _budget(explicit) == 5
    assert explicit.usage.completion_tokens_details.reasoning_tokens <= 5 + tag_tokens
    assert explicit.choices[0].finish_reason == "stop"

    # max_tokens too small for a thought and its end tag: the thought ran out, streamed too.
    body = {"model": model, "messages": _user("Hi!"), "max_tokens": 2, "temperature": 0}
    whole = smol_server.openai().chat.completions.create(**body)
    assert whole.choices[0].finish_reason == "length"
    assert whole.choices[0].model_extra["length_part"] == "reasoning"
    assert not whole.choices[0].message.content
    usage = whole.usage
    assert usage.completion_tokens_details.reasoning_tokens == usage.completion_tokens == 2
    finals = [
        choice
        for chunk in smol_server.openai().chat.completions.create(**body, stream=True)
        for choice in chunk.choices
        if choice.finish_reason is not None
    ]
    assert [(c.finish_reason, c.model_extra.get("length_part")) for c in finals] == [("length", "reasoning")]


@settings(max_examples=200, deadline=None)
@given(max_tokens=st.integers(1, 100_000), share=st.floats(0.001, 0.999))
def test_the_default_budget_keeps_the_whole_thought_within_its_share(
    smol_server: RunningServer, tag_tokens: int, max_tokens: int, share: float
) -> None:
    engine = smol_server.state.require_engine()

    def budget(n: int) -> int:
        return default_thinking_budget(
            n, share=share, tokenizer=engine.tokenizer, end_tag=engine.model.family.think_end
        )

    thought = budget(max_tokens)
    assert thought >= 1
    if math.floor(share * max_tokens) > tag_tokens:
        assert thought + tag_tokens == math.floor(share * max_tokens)  # the answer keeps the rest
    assert budget(max_tokens + 1) >= thought


@pytest.mark.parametrize("share", [0.0, 1.0, -0.5, float("nan")])
def test_a_share_outside_zero_to_one_is_refused(share: float, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="reasoning_share"):
        ServerSettings(reasoning_share=share)
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--reasoning-share", str(share)])
    assert exit_.value.code == 2 and "--reasoning-share" in capsys.readouterr().err
