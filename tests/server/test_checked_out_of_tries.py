"""An answer that cannot be made to meet a checked keyword, over HTTP: a request not
streamed is a 422 ``unmet_constraint_error`` (``constraint_unmet``) naming the keyword and
the pointers; a streamed one ends its choice with ``finish_reason: "error"`` and the same
error object; both are counted in ``/metrics`` by keyword. The schema asks for two
different items that must both be ``"x"``: no answer meets it, whatever the model."""

from __future__ import annotations

import json
import re
from typing import Any

import openai
import pytest
from server_harness import RunningServer

#: Two items, each "x", all different: unsatisfiable, and only uniqueItems is checked.
SCHEMA = {
    "type": "object",
    "properties": {
        "tags": {"type": "array", "items": {"const": "x"}, "minItems": 2, "maxItems": 2, "uniqueItems": True}
    },
    "required": ["tags"],
    "additionalProperties": False,
}
BODY: dict[str, Any] = {
    "messages": [{"role": "user", "content": "Give JSON."}],
    "max_tokens": 60,
    "temperature": 1.0,
    "seed": 3,
    "response_format": {
        "type": "json_schema",
        "json_schema": {"name": "tags", "schema": SCHEMA, "strict": True},
    },
}
UNMET = {
    "type": "unmet_constraint_error",
    "code": "constraint_unmet",
    "keyword": "uniqueItems",
    "pointer": "/tags",
    "schema_pointer": "/properties/tags/uniqueItems",
}


@pytest.fixture(scope="module")
def model(tiny_server: RunningServer) -> str:
    return str(tiny_server.state.model_name)


def _unmet_count(server: RunningServer) -> float:
    with server.http() as http:
        text = http.get("/metrics").text
    found = re.search(r'^thinkstruct_engine_checks_unmet_total\{keyword="uniqueItems"\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def test_an_unmet_keyword_is_a_422_naming_it_and_is_counted(tiny_server: RunningServer, model: str) -> None:
    before = _unmet_count(tiny_server)
    with pytest.raises(openai.UnprocessableEntityError) as info:
        tiny_server.openai().chat.completions.create(model=model, **BODY)
    error = info.value.body
    assert isinstance(error, dict)
    assert {k: error[k] for k in UNMET} == UNMET
    assert error["message"].startswith(
        "choice 0: the model could not write an answer that meets uniqueItems at /tags"
    )
    assert _unmet_count(tiny_server) == before + 1


def test_a_streamed_unmet_keyword_ends_the_choice_with_the_same_error(
    tiny_server: RunningServer, model: str
) -> None:
    before = _unmet_count(tiny_server)
    with tiny_server.http() as http:
        with http.stream(
            "POST", "/v1/chat/completions", json={"model": model, "stream": True, **BODY}
        ) as response:
            assert response.status_code == 200
            lines = [line[len("data: ") :] for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    last = chunks[-1]["choices"][0]
    assert last["finish_reason"] == "error"
    assert {k: last["error"][k] for k in UNMET} == UNMET
    # Nothing of the failed part was sent: what was streamed is a prefix of no valid answer
    # and never holds a repeated item.
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert '"x", "x"' not in text and '"x","x"' not in text
    assert _unmet_count(tiny_server) == before + 1


def test_a_streamed_response_fails_with_constraint_unmet(tiny_server: RunningServer, model: str) -> None:
    body = {
        "model": model,
        "input": "Give JSON.",
        "max_output_tokens": BODY["max_tokens"],
        "temperature": 1.0,
        "seed": BODY["seed"],
        "stream": True,
        "text": {"format": {"type": "json_schema", "name": "tags", "schema": SCHEMA, "strict": True}},
    }
    with tiny_server.http() as http:
        with http.stream("POST", "/v1/responses", json=body) as response:
            assert response.status_code == 200
            events = [
                json.loads(line[len("data: ") :])
                for line in response.iter_lines()
                if line.startswith("data: {")
            ]
    last = events[-1]
    assert last["type"] == "response.failed"
    error = last["response"]["error"]
    assert error["code"] == "constraint_unmet" and "uniqueItems at /tags" in error["message"]
