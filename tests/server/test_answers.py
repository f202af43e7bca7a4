"""Answers of the embedded SmolLM2-135M-Instruct through the server, with the openai client.

Every ``json_schema`` answer that finishes validates with jsonschema (answers cut by
``max_tokens`` are counted separately); regex, choice and EBNF answers match; with
thinking on, the thought is in ``reasoning_content`` and only the answer in ``content``;
a thinking budget forces the answer, which still validates; a streamed answer equals the
non-streamed one with the same seed; 8 concurrent requests with different schemas and
backends all validate, and a seeded request gives the same answer whatever else is in
the batch.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from typing import Any

import jsonschema
import openai
import pytest
from server_harness import RunningServer

pytestmark = pytest.mark.slow

OFF = {"chat_template_kwargs": {"enable_thinking": False}}

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 30},
        "country": {"enum": ["France", "Germany", "Italy", "Spain", "Other"]},
        "population_millions": {"type": "number", "minimum": 0, "maximum": 50},
    },
    "required": ["city", "country"],
    "additionalProperties": False,
}
ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}},
    "required": ["answer"],
    "additionalProperties": False,
}
COLORS = {
    "type": "array",
    "items": {"enum": ["red", "green", "blue", "yellow"]},
    "minItems": 1,
    "maxItems": 3,
}
VERDICT = {
    "type": "object",
    "properties": {
        "sentiment": {"enum": ["positive", "negative", "neutral"]},
        "score": {"type": "integer", "minimum": 1, "maximum": 5},
    },
    "required": ["sentiment", "score"],
    "additionalProperties": False,
}


def _format(schema: dict[str, Any], name: str = "answer") -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module")
def model(smol_server: RunningServer) -> str:
    return str(smol_server.state.model_name)


def _concurrently(server: RunningServer, requests: list[dict[str, Any]]) -> list[Any]:
    """Send chat requests at once (one client per event loop) and return their answers."""

    async def run() -> list[Any]:
        async with server.async_openai() as client:
            return await asyncio.gather(*(client.chat.completions.create(**r) for r in requests))

    return asyncio.run(run())


def _check_schema_answer(choice: Any, schema: dict[str, Any]) -> bool:
    """True when the answer finished and validates; False when cut by max_tokens."""
    if choice.finish_reason == "length":
        return False
    assert choice.finish_reason == "stop", choice
    jsonschema.validate(json.loads(choice.message.content), schema)
    return True


def test_json_schema_answers_validate(smol_server: RunningServer, model: str) -> None:
    cases = [
        ("Describe a person called Ada who is 36 years old, as JSON.", PERSON),
        ("Which city is the capital of France? Answer as JSON.", CITY),
        ("What is 2 + 3? Answer as JSON.", ANSWER),
        ("Name one or two colors of the sky, as a JSON list.", COLORS),
    ]
    answers = _concurrently(
        smol_server,
        [
            {
                "model": model,
                "messages": _user(q),
                "max_tokens": 48,
                "temperature": 0,
                "response_format": _format(s),
                "extra_body": OFF,
            }
            for q, s in cases
        ],
    )
    finished = [_check_schema_answer(a.choices[0], s) for a, (_, s) in zip(answers, cases)]
    assert sum(finished) >= 3, [a.choices[0].message.content for a in answers]
    assert "Paris" in answers[1].choices[0].message.content  # greedy SmolLM2 knows this one


def test_regex_choice_and_ebnf_answers_match(smol_server: RunningServer, model: str) -> None:
    date = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
    grammar = 'root ::= "The answer is " ("yes" | "no") "."'
    regex, choice, ebnf = _concurrently(
        smol_server,
        [
            {
                "model": model,
                "messages": _user("When did the Apollo 11 landing happen? Give the date."),
                "max_tokens": 16,
                "temperature": 0,
                "extra_body": {**OFF, "regex": date},
            },
            {
                "model": model,
                "messages": _user("What is the capital of France?"),
                "max_tokens": 8,
                "temperature": 0,
                "extra_body": {**OFF, "choice": ["Paris", "London", "Berlin"]},
            },
            {
                "model": model,
                "messages": _user("Is the sky blue?"),
                "max_tokens": 16,
                "temperature": 0,
                "extra_body": {**OFF, "ebnf": grammar},
            },
        ],
    )
    assert re.fullmatch(date, regex.choices[0].message.content), regex.choices[0].message.content
    assert choice.choices[0].message.content in ("Paris", "London", "Berlin")
    assert re.fullmatch(r"The answer is (yes|no)\.", ebnf.choices[0].message.content)
    assert all(r.choices[0].finish_reason == "stop" for r in (regex, choice, ebnf))


def test_thinking_lands_in_reasoning_content_and_the_budget_forces_a_valid_answer(
    smol_server: RunningServer, model: str
) -> None:
    question = _user("What is 12 + 30? Answer as JSON.")
    free, tight = _concurrently(
        smol_server,
        [
            {
                "model": model,
                "messages": question,
                "max_tokens": 64,
                "temperature": 0,
                "response_format": _format(ANSWER),
                "extra_body": {"max_reasoning_tokens": 32},
            },
            {
                "model": model,
                "messages": question,
                "max_tokens": 32,
                "temperature": 0,
                "response_format": _format(ANSWER),
                "extra_body": {"max_reasoning_tokens": 6},
            },
        ],
    )
    for answer in (free, tight):
        choice = answer.choices[0]
        reasoning = choice.message.reasoning_content  # type: ignore[attr-defined]
        assert reasoning and "<think>" not in reasoning and "</think>" not in reasoning
        assert "think>" not in choice.message.content
        assert _check_schema_answer(choice, ANSWER), choice.message.content
        details = answer.usage.completion_tokens_details
        assert details is not None and details.reasoning_tokens >= 1
    # SmolLM2's </think> is several ordinary tokens: the budget, then the tag.
    assert tight.usage.completion_tokens_details.reasoning_tokens <= 6 + 4


def test_streamed_answer_equals_the_non_streamed_one(smol_server: RunningServer, model: str) -> None:
    body: dict[str, Any] = {
        "model": model,
        "messages": _user("Describe a person called Bob, as JSON."),
        "max_tokens": 48,
        "temperature": 0.8,
        "seed": 1234,
        "response_format": _format(PERSON),
        "extra_body": {"max_reasoning_tokens": 16},
    }

    async def one_then_the_other() -> tuple[Any, tuple[str, str, str | None]]:
        # One after the other, each alone in the batch: this is about streaming, not batching
        # (see test_a_seeded_answer_does_not_depend_on_the_batch).
        async with smol_server.async_openai() as client:
            whole = await client.chat.completions.create(**body)
            reasoning = content = ""
            finish = None
            async for chunk in await client.chat.completions.create(**body, stream=True):
                for choice in chunk.choices:
                    reasoning += getattr(choice.delta, "reasoning_content", None) or ""
                    content += choice.delta.content or ""
                    finish = choice.finish_reason or finish
            return whole, (reasoning, content, finish)

    whole, (reasoning, content, finish) = asyncio.run(one_then_the_other())
    message = whole.choices[0].message
    assert (reasoning, content, finish) == (
        message.reasoning_content,
        message.content,
        whole.choices[0].finish_reason,
    )  # type: ignore[attr-defined]
    assert reasoning and content


def test_bad_schema_is_a_400_and_the_next_request_succeeds(smol: openai.OpenAI, model: str) -> None:
    bad = {"type": "object", "properties": {"age": {"type": "integr"}}}
    with pytest.raises(openai.BadRequestError) as info:
        smol.chat.completions.create(
            model=model, messages=_user("hi"), max_tokens=8, response_format=_format(bad)
        )
    body = info.value.body
    assert isinstance(body, dict) and body["pointer"] == "/properties/age/type"
    answer = smol.chat.completions.create(
        model=model,
        messages=_user("Describe Ada, 36, as JSON."),
        max_tokens=64,
        temperature=0,
        response_format=_format(PERSON),
        extra_body=OFF,
    )
    assert _check_schema_answer(answer.choices[0], PERSON)


def test_eight_concurrent_requests_with_different_schemas_and_backends_all_validate(
    smol_server: RunningServer, model: str
) -> None:
    jobs = [
        ("Describe a person called Ada, 36, as JSON.", PERSON, "auto"),
        ("Describe a person called Linus, 54, as JSON.", PERSON, "xgrammar"),
        ("Which city is the capital of Italy? Answer as JSON.", CITY, "llguidance"),
        ("Which city is the capital of Spain? Answer as JSON.", CITY, "auto"),
        ("What is 7 times 6? Answer as JSON.", ANSWER, "outlines"),
        ("Name a color, as a JSON list.", COLORS, "outlines"),
        ("Review: 'I loved this film.' Give the sentiment as JSON.", VERDICT, "xgrammar"),
        ("Review: 'Terrible food.' Give the sentiment as JSON.", VERDICT, "llguidance"),
    ]
    requests = [
        {
            "model": model,
            "messages": _user(q),
            "max_tokens": 48,
            "temperature": 0.7,
            "seed": i,
            "response_format": _format(s),
            "extra_body": {**OFF, "backend": b},
        }
        for i, (q, s, b) in enumerate(jobs)
    ]
    answers = _concurrently(smol_server, requests)
    finished = [_check_schema_answer(a.choices[0], s) for a, (_, s, _) in zip(answers, jobs)]
    assert sum(finished) >= 6, [a.choices[0].message.content for a in answers]


def test_a_seeded_answer_does_not_depend_on_the_batch(smol_server: RunningServer, model: str) -> None:
    target = {
        "model": model,
        "messages": _user("Review: 'Terrible food.' Give the sentiment as JSON."),
        "max_tokens": 32,
        "temperature": 0.8,
        "seed": 77,
        "response_format": _format(VERDICT),
        "extra_body": OFF,
    }
    others = [
        {
            **target,
            "seed": 78 + i,
            "messages": _user(f"Describe person number {i}, as JSON."),
            "response_format": _format(PERSON),
        }
        for i in range(3)
    ]
    batch = _concurrently(smol_server, [target, *others])
    (alone,) = _concurrently(smol_server, [target])
    # int8 weights on the compiled kernels (what serve runs by default) compute each row
    # alone, so the answer is the same bits; bfloat16 through torch is not batch-invariant.
    assert smol_server.state.engine.model.quantize == "int8-weights"
    assert alone.choices[0].message.content == batch[0].choices[0].message.content


def test_a_model_without_fim_template_refuses_suffix(smol: openai.OpenAI, model: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        smol.completions.create(model=model, prompt="def f():\n    ", suffix="\n", max_tokens=4)
    body = info.value.body
    assert isinstance(body, dict) and body["param"] == "suffix" and body["code"] == "fim_not_supported"
    plain = smol.completions.create(
        model=model, prompt="The capital of France is", max_tokens=3, temperature=0
    )
    assert plain.choices[0].text.strip()


def test_a_prompt_longer_than_the_context_is_a_400(
    smol: openai.OpenAI, model: str, smol_server: RunningServer
) -> None:
    context = smol_server.state.engine.model.context_length
    with pytest.raises(openai.BadRequestError) as info:
        smol.chat.completions.create(model=model, messages=_user("word " * (context + 100)), max_tokens=4)
    body = info.value.body
    assert (
        isinstance(body, dict)
        and body["code"] == "context_length_exceeded"
        and str(context) in body["message"]
    )


def test_a_prompt_prefix_in_the_batch_is_reported_as_cached(smol: openai.OpenAI, model: str) -> None:
    """SmolLM2's chat template opens with a system prompt: a request that arrives while
    another one runs copies that prefix's keys and values (int8 weights: the same bits)
    and says so in OpenAI's ``usage.prompt_tokens_details.cached_tokens``."""
    running = smol.chat.completions.create(
        model=model, messages=_user("Tell me a long story."), max_tokens=200, stream=True, extra_body=OFF
    )
    next(iter(running))  # it runs: its prompt is in its slot
    try:
        answer = smol.chat.completions.create(
            model=model, messages=_user("What is 2 + 2?"), max_tokens=4, extra_body=OFF
        )
    finally:
        running.close()
    usage = answer.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert 10 <= usage.prompt_tokens_details.cached_tokens < usage.prompt_tokens


def test_a_chats_next_turn_starts_from_the_last_one(
    smol: openai.OpenAI, model: str, smol_server: RunningServer
) -> None:
    """The first turn has finished when the second is asked: its keys and values come
    from the prefix cache (every whole 32-token block of its prompt at least), counted in
    ``cached_tokens`` and in ``/metrics``."""
    nonce = uuid.uuid4().hex  # nothing before this test holds this conversation
    messages: list[dict[str, str]] = [
        {"role": "user", "content": f"Note {nonce}. " + "Remember that the meeting is on Tuesday. " * 12}
    ]
    first = smol.chat.completions.create(model=model, messages=messages, max_tokens=8, extra_body=OFF)
    assert first.usage is not None
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content or ""},
        {"role": "user", "content": "When is the meeting?"},
    ]
    second = smol.chat.completions.create(model=model, messages=messages, max_tokens=8, extra_body=OFF)
    usage = second.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    cached = usage.prompt_tokens_details.cached_tokens or 0
    assert first.usage.prompt_tokens // 32 * 32 <= cached < usage.prompt_tokens
    with smol_server.http() as http:
        metrics = http.get("/metrics").text
    hits = re.search(r"^thinkstruct_engine_prefix_cache_hit_tokens_total (\S+)$", metrics, re.M)
    assert hits is not None and float(hits.group(1)) >= cached
