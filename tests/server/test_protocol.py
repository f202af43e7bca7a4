"""The OpenAI protocol as built, on the tiny random-weight model (native think tokens).

The tiny model writes gibberish, so these tests check structure: what the grammar forces
(every constrained answer matches), where reasoning goes, streaming, usage, seeds,
choices, text completions, limits, cancellation and metrics.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from server_harness import RunningServer, serving, start_engine, stop_engine

from polling import wait_until
from thinkstruct.server import ServerSettings, create_app

MESSAGES = [{"role": "user", "content": "Say something."}]
SMALL_SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "n": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["color", "n"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def model(tiny_server: RunningServer) -> str:
    return str(tiny_server.state.model_name)


def test_chat_completion_shape_and_usage(tiny: openai.OpenAI, model: str) -> None:
    answer = tiny.chat.completions.create(model=model, messages=MESSAGES, max_tokens=6, temperature=0)
    assert answer.id.startswith("chatcmpl-") and answer.object == "chat.completion" and answer.model == model
    (choice,) = answer.choices
    assert choice.index == 0 and choice.message.role == "assistant"
    assert choice.finish_reason == "length", choice  # greedy: six tokens, none of them the end
    usage = answer.usage
    assert usage is not None
    assert 1 <= usage.completion_tokens <= 6
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert (
        usage.completion_tokens_details is not None and usage.completion_tokens_details.reasoning_tokens == 0
    )
    # deepseek-v4 thinks only when asked: no thought, so no reasoning_content.
    assert getattr(choice.message, "reasoning_content", None) is None


@pytest.mark.parametrize(
    ("field", "value", "check"),
    [
        ("regex", r"[a-z]{3,8}( [a-z]{2,5})?", lambda text: re.fullmatch(r"[a-z]{3,8}( [a-z]{2,5})?", text)),
        ("choice", ["alpha", "beta", "gamma delta"], lambda text: text in ("alpha", "beta", "gamma delta")),
        (
            "ebnf",
            'root ::= "yes" | "no" | "maybe " [0-9]',
            lambda text: re.fullmatch(r"yes|no|maybe [0-9]", text),
        ),
    ],
    ids=["regex", "choice", "ebnf"],
)
@pytest.mark.parametrize("backend", ["auto", "xgrammar", "llguidance"])
def test_constrained_answers_match(
    tiny: openai.OpenAI, model: str, field: str, value: Any, check: Callable[[str], Any], backend: str
) -> None:
    answer = tiny.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=24, seed=3, extra_body={field: value, "backend": backend}
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "stop", choice
    assert check(choice.message.content or ""), choice.message.content
    info = (answer.model_extra or {})["thinkstruct"]
    assert (
        info["backend"] == backend
        if backend != "auto"
        else info["backend"] in ("xgrammar", "llguidance", "outlines")
    )
    assert info["compile_seconds"] >= 0 and info["ignored_keywords"] == []


def test_json_schema_answers_validate(tiny: openai.OpenAI, model: str) -> None:
    finishes = []
    for seed in range(4):
        answer = tiny.chat.completions.create(
            model=model,
            messages=MESSAGES,
            max_tokens=48,
            seed=seed,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "small", "schema": SMALL_SCHEMA, "strict": True},
            },
        )
        choice = answer.choices[0]
        finishes.append(choice.finish_reason)
        if choice.finish_reason == "stop":
            jsonschema.validate(json.loads(choice.message.content or ""), SMALL_SCHEMA)
    # A seed fixes each answer; one cut short is checked for in the SmolLM2 tests, where
    # answers are real.
    assert finishes == ["stop"] * 4, finishes


def test_thinking_goes_to_reasoning_content_and_the_budget_forces_the_answer(
    tiny: openai.OpenAI, model: str
) -> None:
    answer = tiny.chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=40,
        seed=5,
        extra_body={
            "chat_template_kwargs": {"thinking": True},
            "max_reasoning_tokens": 6,
            "regex": "[0-9]{2,4}",
        },
    )
    choice = answer.choices[0]
    reasoning = choice.message.reasoning_content  # type: ignore[attr-defined]
    assert reasoning, "a thought was expected"
    assert "</think>" not in reasoning and "<think>" not in (choice.message.content or "")
    assert re.fullmatch("[0-9]{2,4}", choice.message.content or ""), choice.message.content
    assert choice.finish_reason == "stop"
    assert answer.usage is not None and answer.usage.completion_tokens_details is not None
    assert (
        1 <= answer.usage.completion_tokens_details.reasoning_tokens <= 6 + 1
    )  # the budget, then the end tag


def test_enable_thinking_is_the_same_switch(tiny: openai.OpenAI, model: str) -> None:
    # deepseek-v4's switch is "thinking"; "enable_thinking" (Qwen's spelling) means the same.
    answer = tiny.chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=12,
        seed=5,
        extra_body={"chat_template_kwargs": {"enable_thinking": True}, "max_reasoning_tokens": 3},
    )
    assert answer.choices[0].message.reasoning_content  # type: ignore[attr-defined]


def test_separate_reasoning_false_keeps_the_raw_text(tiny: openai.OpenAI, model: str) -> None:
    body = {"chat_template_kwargs": {"thinking": True}, "max_reasoning_tokens": 3, "regex": "[a-z]{3}"}
    split = tiny.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=20, seed=9, extra_body=body
    )
    raw = tiny.chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=20,
        seed=9,
        extra_body={**body, "separate_reasoning": False},
    )
    message = raw.choices[0].message
    assert getattr(message, "reasoning_content", None) is None
    assert "</think>" in (message.content or "")
    assert (message.content or "").endswith(split.choices[0].message.content or "")


def _stream_text(stream: Any) -> tuple[dict[int, str], dict[int, str], dict[int, str], list[Any]]:
    reasoning: dict[int, str] = {}
    content: dict[int, str] = {}
    finish: dict[int, str] = {}
    usage = []
    for chunk in stream:
        if chunk.usage is not None:
            usage.append(chunk.usage)
        for choice in chunk.choices:
            delta = choice.delta
            reasoning[choice.index] = reasoning.get(choice.index, "") + (
                getattr(delta, "reasoning_content", None) or ""
            )
            content[choice.index] = content.get(choice.index, "") + (delta.content or "")
            if choice.finish_reason is not None:
                finish[choice.index] = choice.finish_reason
    return reasoning, content, finish, usage


def test_streamed_equals_non_streamed_with_the_same_seed(tiny: openai.OpenAI, model: str) -> None:
    body: dict[str, Any] = {
        "model": model,
        "messages": MESSAGES,
        "max_tokens": 24,
        "seed": 11,
        "temperature": 1.0,
        "extra_body": {
            "chat_template_kwargs": {"thinking": True},
            "max_reasoning_tokens": 8,
            "response_format": {"type": "json_object"},
        },
    }
    whole = tiny.chat.completions.create(**body)
    reasoning, content, finish, usage = _stream_text(
        tiny.chat.completions.create(**body, stream=True, stream_options={"include_usage": True})
    )
    message = whole.choices[0].message
    assert reasoning[0] == message.reasoning_content  # type: ignore[attr-defined]
    assert content[0] == message.content
    assert finish[0] == whole.choices[0].finish_reason
    (last_usage,) = usage
    assert (whole.model_extra or {})["thinkstruct"]["backend"] is not None
    assert whole.usage is not None
    assert last_usage.completion_tokens == whole.usage.completion_tokens
    assert last_usage.prompt_tokens == whole.usage.prompt_tokens


def test_stream_without_include_usage_has_no_usage_chunk(tiny: openai.OpenAI, model: str) -> None:
    chunks = list(
        tiny.chat.completions.create(model=model, messages=MESSAGES, max_tokens=3, seed=4, stream=True)
    )
    assert all(chunk.usage is None for chunk in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == "length"


def test_n_choices_use_consecutive_seeds(tiny: openai.OpenAI, model: str) -> None:
    both = tiny.chat.completions.create(model=model, messages=MESSAGES, max_tokens=8, seed=40, n=3)
    assert [c.index for c in both.choices] == [0, 1, 2]
    tokens = 0
    for i, choice in enumerate(both.choices):
        alone = tiny.chat.completions.create(model=model, messages=MESSAGES, max_tokens=8, seed=40 + i)
        assert choice.message.content == alone.choices[0].message.content
        assert alone.usage is not None
        tokens += alone.usage.completion_tokens
        prompt_tokens = alone.usage.prompt_tokens
    # The prompt is counted once, the completions of all choices summed.
    assert both.usage is not None
    assert (both.usage.prompt_tokens, both.usage.completion_tokens) == (prompt_tokens, tokens)
    streamed = _stream_text(
        tiny.chat.completions.create(model=model, messages=MESSAGES, max_tokens=8, seed=40, n=3, stream=True)
    )
    assert [streamed[1][i] for i in range(3)] == [c.message.content for c in both.choices]


def test_text_completions(tiny: openai.OpenAI, model: str) -> None:
    plain = tiny.completions.create(model=model, prompt="Once upon a time", max_tokens=5, seed=1)
    assert plain.object == "text_completion" and plain.id.startswith("cmpl-")
    assert plain.choices[0].finish_reason == "length" and plain.usage is not None
    echoed = tiny.completions.create(model=model, prompt="Once upon a time", max_tokens=5, seed=1, echo=True)
    assert echoed.choices[0].text == "Once upon a time" + plain.choices[0].text
    # Several prompts, n each: choice i * n + j is prompt i's j-th.
    many = tiny.completions.create(model=model, prompt=["a", "b"], n=2, max_tokens=3, seed=2)
    assert [c.index for c in many.choices] == [0, 1, 2, 3]
    # Token ids are a prompt too.
    ids = tiny.completions.create(
        model=model, prompt=[0, 100, 200], max_tokens=3, seed=2, extra_body={"regex": "[xyz]{3}"}
    )
    assert re.fullmatch("[xyz]{3}", ids.choices[0].text)
    # A constraint holds from the first token (no chat template, no thought).
    fim = tiny.completions.create(
        model=model,
        prompt="def add(a, b):\n    return ",
        suffix="\n",
        max_tokens=8,
        extra_body={"regex": "a [+] b"},
    )
    assert fim.choices[0].text == "a + b" and fim.choices[0].finish_reason == "stop"


def test_streamed_text_completion_matches(tiny: openai.OpenAI, model: str) -> None:
    body = {"model": model, "prompt": "Hello", "max_tokens": 6, "seed": 4, "echo": True}
    whole = tiny.completions.create(**body)
    text = "".join(c.choices[0].text for c in tiny.completions.create(**body, stream=True) if c.choices)
    assert text == whole.choices[0].text


def test_models_and_health(tiny_server: RunningServer, tiny: openai.OpenAI, model: str) -> None:
    listed = tiny.models.list().data
    assert [m.id for m in listed] == [model]
    assert tiny.models.retrieve(model).id == model
    with pytest.raises(openai.NotFoundError):
        tiny.models.retrieve("gpt-4o")
    with tiny_server.http() as http:
        health = http.get("/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"


def test_health_is_503_until_the_engine_is_attached(tiny_engine: Any) -> None:
    app = create_app(None, ServerSettings())
    with RunningServer(app) as server, server.http() as http:
        loading = http.get("/health")
        assert loading.status_code == 503 and loading.json()["status"] == "loading"
        early = http.post("/v1/chat/completions", json={"model": "x", "messages": MESSAGES})
        assert early.status_code == 503 and early.json()["error"]["code"] == "model_not_ready"
        assert "retry-after" in early.headers
        server.state.attach(tiny_engine)
        assert http.get("/health").status_code == 200
        server.state.draining = True
        assert http.get("/health").status_code == 503


def test_bad_schema_is_400_with_its_pointer_and_the_next_request_succeeds(
    tiny: openai.OpenAI, model: str
) -> None:
    bad = {"type": "object", "properties": {"age": {"type": "integer", "minimum": "ten"}}}
    with pytest.raises(openai.BadRequestError) as info:
        tiny.chat.completions.create(
            model=model,
            messages=MESSAGES,
            max_tokens=8,
            response_format={"type": "json_schema", "json_schema": {"name": "bad", "schema": bad}},
        )
    error = info.value.body
    assert isinstance(error, dict)
    assert (
        error["param"] == "response_format.json_schema.schema"
        and error["pointer"] == "/properties/age/minimum"
    )
    assert "/properties/age/minimum" in error["message"]
    answer = tiny.chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=48,
        seed=6,
        response_format={"type": "json_schema", "json_schema": {"name": "ok", "schema": SMALL_SCHEMA}},
    )
    assert answer.choices[0].finish_reason == "stop", answer.choices[0]
    jsonschema.validate(json.loads(answer.choices[0].message.content or ""), SMALL_SCHEMA)


def test_bad_regex_and_grammar_name_the_position(tiny: openai.OpenAI, model: str) -> None:
    for field, value in (("regex", "ab(c"), ("ebnf", 'root ::= "a" missing_rule')):
        with pytest.raises(openai.BadRequestError) as info:
            tiny.chat.completions.create(
                model=model, messages=MESSAGES, max_tokens=4, extra_body={field: value}
            )
        body = info.value.body
        assert isinstance(body, dict) and body["param"] == field and body["code"] == "invalid_constraint"


def test_strict_accepts_what_is_checked(tiny: openai.OpenAI, model: str) -> None:
    schema = {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
    }
    # Strict: no grammar enforces uniqueItems; it is checked, so nothing is ignored.
    strict = tiny.chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=4,
        seed=7,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "s", "schema": schema, "strict": True},
        },
    )
    assert strict.choices[0].finish_reason == "length", strict.choices[0]
    assert (strict.model_extra or {})["thinkstruct"]["ignored_keywords"] == []
    # Not strict: compiled with that keyword ignored (the server's default here).
    lenient = tiny.chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=4,
        seed=7,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "s", "schema": schema, "strict": False},
        },
    )
    assert lenient.choices[0].finish_reason == "length", lenient.choices[0]
    assert (lenient.model_extra or {})["thinkstruct"]["ignored_keywords"] == ["/properties/tags/uniqueItems"]


def test_queue_full_is_429_with_retry_after(tiny_engine: Any) -> None:
    engine = start_engine(tiny_engine.model, warm=False, max_batch=1, max_queue=1)
    try:
        with serving(engine) as server:
            client = server.async_openai()

            async def one() -> Any:
                try:
                    return await client.chat.completions.with_raw_response.create(
                        model=server.state.model_name, messages=MESSAGES, max_tokens=64, temperature=0
                    )
                except openai.RateLimitError as e:
                    return e

            async def burst() -> list[Any]:
                return await asyncio.gather(*(one() for _ in range(6)))

            results = asyncio.run(burst())
        refused = [r for r in results if isinstance(r, openai.RateLimitError)]
        served = [r for r in results if not isinstance(r, openai.RateLimitError)]
        assert refused and served
        for error in refused:
            assert int(error.response.headers["retry-after"]) >= 1
            assert error.body["code"] == "queue_full"  # type: ignore[index]
    finally:
        stop_engine(engine)


def test_client_disconnect_cancels_the_request(
    tiny_server: RunningServer, tiny_engine: Any, model: str
) -> None:
    stats = tiny_engine.stats
    aborted = stats.finished["abort"]
    body = {
        "model": model,
        "messages": MESSAGES,
        "max_tokens": 2000,
        "stream": True,
        "temperature": 1.0,
        "chat_template_kwargs": {"thinking": True},
    }
    with (
        httpx.Client(base_url=tiny_server.url, timeout=60) as http,
        http.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        for i, _ in enumerate(response.iter_lines()):
            if i > 6:
                break  # leave mid-stream: the connection closes here
    wait_until(lambda: stats.finished["abort"] > aborted and stats.running == 0, "the stream aborted")
    # A non-streamed request whose client gives up is cancelled too.
    aborted = stats.finished["abort"]
    with pytest.raises(httpx.ReadTimeout), httpx.Client(base_url=tiny_server.url, timeout=0.5) as http:
        http.post("/v1/chat/completions", json={**body, "stream": False})
    wait_until(lambda: stats.finished["abort"] > aborted and stats.running == 0, "the request aborted")


def test_metrics_count_what_happened(tiny_server: RunningServer, tiny: openai.OpenAI, model: str) -> None:
    tiny.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=24, extra_body={"choice": ["up", "down"]}
    )
    with tiny_server.http() as http:
        text = http.get("/metrics").text
    values = _samples(text)
    assert values['thinkstruct_http_requests_total{endpoint="/v1/chat/completions",status="200"}'] >= 1
    assert values["thinkstruct_completion_tokens_total"] >= 1
    assert values["thinkstruct_prompt_tokens_total"] >= 1
    assert values["thinkstruct_time_to_first_token_seconds_count"] >= 1
    assert values["thinkstruct_time_per_output_token_seconds_count"] >= 0
    assert values["thinkstruct_grammar_compile_wait_seconds_count"] >= 1
    assert any(k.startswith("thinkstruct_grammar_backend_chosen_total{backend=") for k in values)
    assert values["thinkstruct_grammar_misses_total"] >= 1
    for name in (
        "thinkstruct_queue_length",
        "thinkstruct_batch_size",
        "thinkstruct_engine_jump_forward_tokens_total",
        "thinkstruct_grammar_hits_total",
        "thinkstruct_grammar_compile_seconds_total",
        "thinkstruct_grammar_timeouts_total",
        "thinkstruct_engine_ready",
    ):
        assert name in values, name
    assert values["thinkstruct_engine_ready"] == 1.0


def _samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_a_family_whose_model_opens_its_thought_still_splits_a_constrained_answer(
    tiny_model_dir: Any,
) -> None:
    # qwen3's template leaves <think> to the model; the grammar starts inside the thought,
    # so a constrained request gets the tag written into its prompt instead.
    from thinkstruct.engine import load_model

    engine = start_engine(
        load_model(tiny_model_dir, dtype="float32", reasoning_parser="qwen3", progress=False), warm=False
    )
    try:
        with serving(engine) as server:
            client = server.openai()
            model = server.state.model_name
            answer = client.chat.completions.create(
                model=model,
                messages=MESSAGES,
                max_tokens=30,
                seed=2,
                extra_body={"max_reasoning_tokens": 5, "regex": "[a-z]{4}"},
            )
            message = answer.choices[0].message
            assert message.reasoning_content  # type: ignore[attr-defined]
            assert re.fullmatch("[a-z]{4}", message.content or ""), message.content
            # Unconstrained, the model opens its own thought (or not): nothing is added.
            free = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=4, seed=2)
            assert free.choices[0].finish_reason == "length", free.choices[0]
    finally:
        stop_engine(engine)
