"""Hostile and malformed requests: a 4xx with an OpenAI error object, never a 500 or a
stack trace, and the server answers the next request as if nothing happened."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from server_harness import API_KEY, RunningServer, serving

from thinkstruct.server import ServerSettings

MESSAGES = [{"role": "user", "content": "hi"}]


def _chat(model: str, **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": MESSAGES, "max_tokens": 4, **fields}


def _assert_error(
    response: httpx.Response, status: int, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert {"message", "type", "param", "code"} <= set(error)
    assert error["message"] and "Traceback" not in response.text
    if param is not None:
        assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    return error


def _post_raw(server: RunningServer, body: bytes, path: str = "/v1/chat/completions") -> httpx.Response:
    with server.http() as http:
        return http.post(path, content=body, headers={"content-type": "application/json"})


@pytest.fixture(scope="module")
def model(tiny_server: RunningServer) -> str:
    return tiny_server.state.model_name


RAW_BODIES = {
    "malformed JSON": (b'{"model": "x", "messages": [', "invalid_json"),
    "invalid UTF-8": (b'{"model": "\xff\xfe", "messages": []}', "invalid_json"),
    "NaN literal": (b'{"model": "x", "messages": [], "temperature": NaN}', "invalid_json"),
    "Infinity literal": (b'{"model": "x", "messages": [], "temperature": Infinity}', "invalid_json"),
    "number too large for a float": (b'{"model": "x", "messages": [], "temperature": 1e999}', "invalid_json"),
    "not an object": (b"[1, 2, 3]", "invalid_json"),
    "empty body": (b"", "invalid_json"),
    "nested 10,000 deep": (b"[" * 10_000 + b"]" * 10_000, "invalid_json"),
    "lone surrogate in a string": (
        b'{"model": "x", "messages": [{"role": "user", "content": "a\\ud800b"}]}',
        "invalid_json",
    ),
    "lone surrogate in a key": (b'{"model": "x", "messages": [], "\\udfff": 1}', "invalid_json"),
}


@pytest.mark.parametrize("case", RAW_BODIES, ids=list(RAW_BODIES))
def test_unparseable_bodies_are_400(tiny_server: RunningServer, case: str) -> None:
    body, code = RAW_BODIES[case]
    _assert_error(_post_raw(tiny_server, body), 400, code=code)


def _field_cases(model: str) -> dict[str, tuple[dict[str, Any], int, str | None]]:
    return {
        "wrong type: max_tokens as text": (_chat(model, max_tokens="5"), 400, "max_tokens"),
        "wrong type: messages as text": ({"model": model, "messages": "hi"}, 400, "messages"),
        "wrong type: stream as text": (_chat(model, stream="yes"), 400, "stream"),
        "wrong type: content as number": (
            {"model": model, "messages": [{"role": "user", "content": 5}]},
            400,
            "messages[0].content",
        ),
        "negative max_tokens": (_chat(model, max_tokens=-1), 400, "max_tokens"),
        "huge max_tokens": (_chat(model, max_tokens=10**12), 400, "max_tokens"),
        "huge n": (_chat(model, n=10**9), 400, "n"),
        "empty messages": ({"model": model, "messages": []}, 400, "messages"),
        "unknown role": (
            {"model": model, "messages": [{"role": "wizard", "content": "x"}]},
            400,
            "messages[0].role",
        ),
        "image content": (
            {
                "model": model,
                "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
            },
            400,
            "messages[0].content",
        ),
        "unknown field": (_chat(model, reponse_format={"type": "json_object"}), 400, "reponse_format"),
        "unsupported field with effect": (_chat(model, functions=[{"name": "f"}]), 400, "functions"),
        "missing model": ({"messages": MESSAGES}, 400, "model"),
        "unknown model": (_chat("no-such-model"), 404, "model"),
        "temperature above 2": (_chat(model, temperature=7), 400, "temperature"),
        "top_p zero": (_chat(model, top_p=0), 400, "top_p"),
        "seed beyond 64 bits": (_chat(model, seed=2**70), 400, "seed"),
        "empty stop string": (_chat(model, stop=[""]), 400, "stop"),
        "too many stop strings": (_chat(model, stop=[f"s{i}" for i in range(40)]), 400, "stop"),
        "two constraints": (_chat(model, regex="a+", choice=["a"]), 400, "choice"),
        "unknown response_format": (_chat(model, response_format={"type": "xml"}), 400, "response_format"),
        "json_schema without schema": (
            _chat(model, response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
            400,
            "response_format.json_schema.schema",
        ),
        "unknown backend": (_chat(model, regex="a", backend="magic"), 400, "backend"),
        "bad thinking switch": (
            _chat(model, chat_template_kwargs={"thinking": "yes"}),
            400,
            "chat_template_kwargs",
        ),
        "negative thinking budget": (_chat(model, max_reasoning_tokens=-3), 400, "max_reasoning_tokens"),
        "max_tokens and max_completion_tokens disagree": (
            _chat(model, max_tokens=3, max_completion_tokens=5),
            400,
            "max_completion_tokens",
        ),
    }


def test_bad_fields_are_4xx_naming_the_field(tiny_server: RunningServer, model: str) -> None:
    failures = []
    with tiny_server.http() as http:
        for case, (body, status, param) in _field_cases(model).items():
            response = http.post("/v1/chat/completions", json=body)
            try:
                _assert_error(response, status, param=param)
            except AssertionError as e:
                failures.append(f"{case}: {e}")
    assert not failures, "\n".join(failures)


def test_bad_text_completion_fields(tiny_server: RunningServer, model: str) -> None:
    cases = {
        "empty prompt list": ({"model": model, "prompt": []}, "prompt"),
        "token id outside the vocabulary": ({"model": model, "prompt": [1, 10**9]}, "prompt"),
        "suffix with token ids": ({"model": model, "prompt": [1, 2], "suffix": "x"}, "suffix"),
        "logprobs above 5": ({"model": model, "prompt": "x", "logprobs": 6}, "logprobs"),
        "best_of other than n": ({"model": model, "prompt": "x", "best_of": 3}, "best_of"),
        "n for each of several prompts over the limit": (
            {"model": model, "prompt": ["a", "b", "c"], "n": 2},
            "n",
        ),
    }
    failures = []
    with tiny_server.http() as http:
        for case, (body, param) in cases.items():
            try:
                _assert_error(http.post("/v1/completions", json=body), 400, param=param)
            except AssertionError as e:
                failures.append(f"{case}: {e}")
    assert not failures, "\n".join(failures)


def test_prompt_limits(tiny_server: RunningServer, model: str) -> None:
    # This server allows 2,000 prompt tokens and 1 MiB bodies.
    long_text = "word " * 3000
    with tiny_server.http() as http:
        error = _assert_error(
            http.post(
                "/v1/chat/completions",
                json={"model": model, "messages": [{"role": "user", "content": long_text}]},
            ),
            400,
            param="messages",
            code="prompt_too_long",
        )
        assert "2000" in error["message"]
        huge = "x" * (10 << 20)  # a 10 MB prompt: refused by size before it is parsed
        _assert_error(
            http.post("/v1/completions", json={"model": model, "prompt": huge}), 413, code="request_too_large"
        )
        # A prompt that fits the limit but leaves no room for max_tokens in the context.
        error = _assert_error(
            http.post("/v1/completions", json={"model": model, "prompt": "word " * 1500, "max_tokens": 4000}),
            400,
            param="max_tokens",
            code="context_length_exceeded",
        )
        assert "4096" in error["message"]


@pytest.mark.parametrize(
    "text",
    ["\x00a\x00b\x01\x1f\x7f", "\ufffe\uffff \U0001f600"],
    ids=["nul-and-controls", "noncharacters-and-emoji"],
)
def test_odd_characters_in_every_string_field_never_fail_the_server(
    tiny_server: RunningServer, model: str, text: str
) -> None:
    bodies = [
        {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 2},
        {"model": model + text, "messages": MESSAGES},
        {"model": model, "messages": [{"role": "user", "content": "x", "name": text}], "max_tokens": 2},
        {"model": model, "messages": MESSAGES, "stop": [text], "max_tokens": 2},
        {"model": model, "messages": MESSAGES, "regex": text, "max_tokens": 2},
        {"model": model, "messages": MESSAGES, "ebnf": text, "max_tokens": 2},
        {"model": model, "messages": MESSAGES, "choice": [text], "max_tokens": 2},
        {
            "model": model,
            "messages": MESSAGES,
            "max_tokens": 2,
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": text,
                    "schema": {"type": "object", "properties": {text: {"const": text}}},
                },
            },
        },
        {"model": model, "messages": MESSAGES, "chat_template_kwargs": {text: text}, "max_tokens": 2},
    ]
    with tiny_server.http() as http:
        for body in bodies:
            response = http.post("/v1/chat/completions", json=body)
            assert response.status_code < 500, (body, response.text)
            if response.status_code >= 400:
                _assert_error(response, response.status_code)
        completion = http.post(
            "/v1/completions", json={"model": model, "prompt": text, "suffix": text, "max_tokens": 2}
        )
        assert completion.status_code < 500, completion.text


def test_unknown_paths_and_methods_are_error_objects(tiny_server: RunningServer) -> None:
    with tiny_server.http() as http:
        _assert_error(http.get("/v1/nothing-here"), 404)
        _assert_error(http.get("/v1/chat/completions"), 405)


def test_fields_without_effect_are_accepted(tiny: openai.OpenAI, model: str) -> None:
    answer = tiny.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "hi", "refusal": None}],  # an echoed message's extra key
        max_tokens=2,
        seed=8,
        user="someone",
        metadata={"k": "v"},
        store=False,
        frequency_penalty=0,
        presence_penalty=0,
        logprobs=False,
        parallel_tool_calls=False,
    )
    assert answer.choices[0].finish_reason == "length", answer.choices[0]


def test_the_server_is_healthy_after_hostile_requests(
    tiny_server: RunningServer, tiny: openai.OpenAI, model: str
) -> None:
    for body, _ in RAW_BODIES.values():
        _post_raw(tiny_server, body)
    answer = tiny.chat.completions.create(model=model, messages=MESSAGES, max_tokens=3)
    assert answer.usage is not None and answer.usage.completion_tokens >= 1
    with tiny_server.http() as http:
        assert http.get("/health").status_code == 200
        metrics = http.get("/metrics").text
    assert 'thinkstruct_http_requests_total{endpoint="/v1/chat/completions",status="400"}' in metrics
    assert 'status="500"' not in metrics


# ---- access ----------------------------------------------------------------------------


def test_api_key_guards_every_endpoint_but_health(tiny_engine: Any) -> None:
    with serving(tiny_engine, ServerSettings(api_key=API_KEY)) as server:
        with server.http() as http:
            assert http.get("/health").status_code == 200
            for method, path in (
                ("GET", "/v1/models"),
                ("POST", "/v1/chat/completions"),
                ("POST", "/v1/completions"),
                ("GET", "/metrics"),
                ("GET", "/openapi.json"),
                ("GET", "/no-such-path"),  # no key: 401, not 404 (nothing to learn about paths)
            ):
                for headers in (
                    {},
                    {"authorization": "Bearer wrong"},
                    {"authorization": f"Basic {API_KEY}"},
                    {"authorization": f"Bearer {API_KEY}x"},
                ):
                    response = http.request(method, path, headers=headers, json={})
                    error = _assert_error(response, 401, code="invalid_api_key")
                    assert error["type"] == "authentication_error"
                    assert response.headers["www-authenticate"].startswith("Bearer")
            assert http.get("/metrics", headers={"authorization": f"Bearer {API_KEY}"}).status_code == 200
        with pytest.raises(openai.AuthenticationError):
            server.openai(api_key="wrong").models.list()
        models = server.openai(api_key=API_KEY).models.list()
        assert [m.id for m in models.data] == [server.state.model_name]


def test_api_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THINKSTRUCT_API_KEY", "from-env")
    assert ServerSettings.api_key_from_env(None) == "from-env"
    assert ServerSettings.api_key_from_env("explicit") == "explicit"
    monkeypatch.setenv("THINKSTRUCT_API_KEY", "")
    assert ServerSettings.api_key_from_env(None) is None


def test_openapi_document_describes_the_request_bodies(tiny_server: RunningServer) -> None:
    with tiny_server.http() as http:
        doc = http.get("/openapi.json").json()
    body = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"][
        "schema"
    ]
    name = body["$ref"].rsplit("/", 1)[1]
    schema = doc["components"]["schemas"][name]
    assert {"messages", "model", "response_format", "regex", "max_reasoning_tokens"} <= set(
        schema["properties"]
    )
    assert schema["additionalProperties"] is False
    json.dumps(doc)  # every $ref target is in components: the document is self-contained
    refs = {v for v in _walk(doc) if isinstance(v, str) and v.startswith("#/components/schemas/")}
    assert {r.rsplit("/", 1)[1] for r in refs} <= set(doc["components"]["schemas"])


def _walk(value: Any) -> Any:
    if isinstance(value, dict):
        for v in value.values():
            yield from _walk(v)
    elif isinstance(value, list):
        for v in value:
            yield from _walk(v)
    else:
        yield value
