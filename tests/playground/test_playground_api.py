"""What the page relies on, over HTTP: the per-step allowed-token counts, the lint and
validate endpoints, and which playground paths the API key guards."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from playground_harness import PREFIX
from server_harness import API_KEY, RunningServer

from thinkstruct.grammar.runtime.bitmask import allowed_count

TAGS = {
    "type": "object",
    "properties": {
        "tags": {
            "type": "array",
            "items": {"type": "string", "maxLength": 8},
            "maxItems": 3,
            "uniqueItems": True,
        }
    },
    "required": ["tags"],
    "additionalProperties": False,
}


def _chat(server: RunningServer, **fields: Any) -> dict[str, Any]:
    body = {"model": "SmolLM2-135M-Instruct", "temperature": 0, **fields}
    with server.http() as http:
        answer = http.post("/v1/chat/completions", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_allowed_count_is_the_popcount_below_the_vocabulary(data: st.DataObject) -> None:
    vocab = data.draw(st.integers(1, 300))
    words = (vocab + 31) // 32
    values = data.draw(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=words, max_size=words))
    row = torch.tensor(values, dtype=torch.int32)
    bits = np.unpackbits(np.array(values, dtype="<i4").view(np.uint8), bitorder="little")
    assert allowed_count(row, vocab) == int(bits[:vocab].sum())


def test_allowed_tokens_one_count_per_output_token(server: RunningServer) -> None:
    vocab = server.state.engine.tokenizer.vocab_size
    choices = ["Paris", "London", "Berlin"]
    plain = _chat(
        server,
        messages=[{"role": "user", "content": "Capital of France?"}],
        choice=choices,
        chat_template_kwargs={"enable_thinking": False},
    )
    assert plain["thinkstruct"]["allowed_tokens"] is None  # only when asked for

    answer = _chat(
        server,
        messages=[{"role": "user", "content": "Capital of France?"}],
        choice=choices,
        chat_template_kwargs={"enable_thinking": False},
        return_allowed_tokens=True,
    )
    assert answer["choices"][0]["message"]["content"] in choices
    (counts,) = answer["thinkstruct"]["allowed_tokens"]
    assert len(counts) == answer["usage"]["completion_tokens"]
    assert 1 < counts[0] < 100  # the first tokens of three words, not the vocabulary
    assert all(1 <= c <= vocab for c in counts)
    assert answer["thinkstruct"]["jump_forward_tokens"] <= counts.count(1)

    # With a thought: free while thinking (every token but the stop ids), narrow after it;
    # the budget forces the end tag, one allowed token per step (earlier where the model
    # samples its stop inside the thought: that ends the thought the same way).
    thought = _chat(
        server,
        messages=[{"role": "user", "content": "Give two tags for a post on bread."}],
        response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": TAGS}},
        max_reasoning_tokens=6,
        max_tokens=96,
        return_allowed_tokens=True,
    )
    (counts,) = thought["thinkstruct"]["allowed_tokens"]
    reasoning = thought["usage"]["completion_tokens_details"]["reasoning_tokens"]
    assert len(counts) == thought["usage"]["completion_tokens"]
    free = next((k for k, c in enumerate(counts[:reasoning]) if c == 1), reasoning)
    assert 1 <= free <= 6 and free < reasoning  # at most the budget free, then the forced end tag
    assert all(c > vocab - 16 for c in counts[:free])
    assert counts[free:reasoning] == [1] * (reasoning - free)
    assert counts[reasoning] < 50  # the answer must open its object


def test_lint_and_validate(server: RunningServer) -> None:
    import json

    with server.http() as http:
        lenient = http.post(
            "/playground/lint", json={"kind": "json_schema", "value": json.dumps(TAGS), "strict": False}
        ).json()
        assert lenient["ok"] and lenient["ignored_keywords"] == ["/properties/tags/uniqueItems"]
        assert lenient["backend"] and lenient["compile_ms"] >= 0
        strict = http.post(
            "/playground/lint", json={"kind": "json_schema", "value": json.dumps(TAGS), "strict": True}
        ).json()
        assert strict["ok"] and strict["ignored_keywords"] == []
        checked = [e for e in strict["enforcement"] if e["enforcement"] == "checked"]
        assert checked == [
            {
                "keyword": "uniqueItems",
                "pointer": "/properties/tags/uniqueItems",
                "enforcement": "checked",
                "location": "/tags",
            }
        ]
        assert {e["enforcement"] for e in lenient["enforcement"]} == {"grammar", "ignored"}
        ebnf = http.post("/playground/lint", json={"kind": "ebnf", "value": 'root ::= "a" missing'}).json()
        assert not ebnf["ok"] and "missing" in ebnf["error"]["message"], ebnf

        # The grammar holds the shape; jsonschema catches what the lenient grammar ignored.
        twice = {
            "kind": "json_schema",
            "value": json.dumps(TAGS),
            "strict": False,
            "answer": '{"tags":["rye","rye"]}',
        }
        result = http.post("/playground/validate", json=twice).json()
        assert result["grammar_accepts"] is True and result["valid"] is False
        assert [(e["pointer"], e["keyword"]) for e in result["errors"]] == [("/tags", "uniqueItems")]
        cut = http.post("/playground/validate", json={**twice, "answer": '{"tags":["rye"'}).json()
        assert cut["valid"] is False and cut["parse_error"] and cut["rejected_at"] == len('{"tags":["rye"')
        date = {"kind": "regex", "value": r"\d{4}-\d{2}-\d{2}"}
        assert (
            http.post("/playground/validate", json={**date, "answer": "1969-07-20"}).json()["valid"] is True
        )
        wrong = http.post("/playground/validate", json={**date, "answer": "1969-7-20"}).json()
        assert wrong["valid"] is False and wrong["rejected_at"] == 6

        bad = http.post("/playground/lint", json={"kind": "yaml", "value": "x"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "kind"


def test_only_the_page_and_its_config_are_public(keyed_server: RunningServer) -> None:
    with httpx.Client(base_url=keyed_server.url + PREFIX, timeout=60) as http:
        page = http.get("/")
        assert page.status_code == 200 and "<script>" in page.text and 'src="' not in page.text  # all inline
        assert "script-src 'sha256-" in page.headers["content-security-policy"]
        config = http.get("/playground/config").json()
        assert config == {
            "api_key_required": True,
            "reasoning_share": keyed_server.state.settings.reasoning_share,
        }
        body = {"kind": "regex", "value": "a+"}
        assert http.post("/playground/lint", json=body).status_code == 401
        assert http.post("/playground/validate", json={**body, "answer": "a"}).status_code == 401
        keyed = http.post("/playground/lint", json=body, headers={"Authorization": f"Bearer {API_KEY}"})
        assert keyed.status_code == 200 and keyed.json()["ok"] is True
