"""Schemathesis against the server's own OpenAPI document (``/openapi.json``): for a
bounded number of generated requests per operation, valid and invalid by the document,
the server never answers a 5xx and every answer matches what the document says (status
codes, content types, response schemas, headers).

The requests go to ``short_timeout_server`` (the tiny model; a generated schema compiles
in at most 5 s). Generated bodies keep their shape, but ``max_tokens`` and ``n`` are capped
so no example generates for long: the document allows up to the context, and what is
fuzzed here is the protocol, not the model.
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance
from server_harness import RunningServer

#: Examples per operation and generation mode: the whole file stays within about 30 s.
EXAMPLES = {"POST": 15, "GET": 5, "DELETE": 5}

#: Every documented operation; a new endpoint fails the test until it is listed here.
OPERATIONS = [
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/responses"),
    ("GET", "/v1/responses/{response_id}"),
    ("DELETE", "/v1/responses/{response_id}"),
    ("POST", "/v1/messages"),
    ("POST", "/tokenize"),
    ("POST", "/detokenize"),
    ("GET", "/v1/models"),
    ("GET", "/v1/models/{model_id}"),
    ("GET", "/health"),
    ("GET", "/metrics"),
    ("GET", "/playground/config"),
    ("POST", "/playground/lint"),
    ("POST", "/playground/validate"),
]


@pytest.fixture(scope="module")
def document(short_timeout_server: RunningServer) -> dict[str, Any]:
    with short_timeout_server.http() as http:
        return http.get("/openapi.json").json()


@pytest.fixture(scope="module")
def api(document: dict[str, Any]) -> Any:
    return schemathesis.openapi.from_dict(document)


def test_every_operation_is_fuzzed(document: dict[str, Any]) -> None:
    documented = {(method.upper(), path) for path, ops in document["paths"].items() for method in ops}
    assert documented == set(OPERATIONS)


def _bounded(case: Any, *, model: str, positive: bool) -> None:
    # Cheap generations only: the shape of the request is what is being tested.
    body = case.body
    if isinstance(body, dict):
        if positive and "model" in body:
            body["model"] = model  # a valid body then reaches the engine, not only a 404
        for field in ("max_tokens", "max_completion_tokens", "max_reasoning_tokens", "max_output_tokens"):
            value = body.get(field)
            if isinstance(value, int) and not isinstance(value, bool) and value > 4:
                body[field] = 4
        if isinstance(body.get("n"), int) and not isinstance(body["n"], bool) and body["n"] > 2:
            body["n"] = 2


#: Operations with a body, so a request can break the document (any text is a valid path
#: parameter).
WITH_INPUT = {(m, p) for m, p in OPERATIONS if m == "POST"}

CASES = [(m, p, GenerationMode.POSITIVE) for m, p in OPERATIONS] + [
    (m, p, GenerationMode.NEGATIVE) for m, p in OPERATIONS if (m, p) in WITH_INPUT
]


@pytest.mark.parametrize(("method", "path", "mode"), CASES, ids=[f"{m} {p} {g}" for m, p, g in CASES])
def test_operation_answers_as_documented(
    api: Any, short_timeout_server: RunningServer, method: str, path: str, mode: GenerationMode
) -> None:
    operation = api[path][method]
    url = short_timeout_server.url
    model = short_timeout_server.state.model_name

    @settings(
        max_examples=EXAMPLES[method],
        deadline=None,
        derandomize=True,  # the same examples on every run: a failure is reproducible
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def answers_as_documented(case: Any) -> None:
        _bounded(case, model=model, positive=mode is GenerationMode.POSITIVE)
        # A schema-valid request may still be refused: an unknown model, a constraint that
        # does not compile, a prompt longer than the context are 4xx (documented), and
        # none of them is expressible in the document.
        response = case.call_and_validate(
            base_url=url, timeout=60, excluded_checks=[positive_data_acceptance]
        )
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1

    statuses: dict[int, int] = {}
    answers_as_documented()
    print(f"\n{method} {path} {mode}: statuses {dict(sorted(statuses.items()))}")
