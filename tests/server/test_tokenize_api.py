"""``/tokenize`` and ``/detokenize`` in vLLM's shapes, on the embedded SmolLM2's tokenizer:
a text round trip gives the text back (property-tested, over texts whose bytes the
vocabulary has), a conversation counts the tokens
a chat request's prompt has, and bad input is a 400 naming the field."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from server_harness import RunningServer

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is the capital of France?"},
]


@pytest.fixture(scope="module")
def http(smol_server: RunningServer) -> Any:
    with smol_server.http() as client:
        yield client


@pytest.fixture(scope="module")
def byte_alphabet(smol_server: RunningServer) -> frozenset[int]:
    """The bytes the tokenizer has a token for (SmolLM2's vocabulary lacks a few control
    bytes and the UTF-8 lead bytes 0xF1 and 0xF2, so planes 4 to 11 cannot be encoded)."""
    vocab = smol_server.state.engine.tokenizer.decoded_vocab()
    return frozenset(token[0] for token in vocab if len(token) == 1)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=80))
def test_a_text_round_trips(http: httpx.Client, byte_alphabet: frozenset[int], text: str) -> None:
    assume(set(text.encode("utf-8")) <= byte_alphabet)
    tokens = http.post("/tokenize", json={"prompt": text, "return_token_strs": True}).json()
    assert tokens["count"] == len(tokens["tokens"]) == len(tokens["token_strs"])
    assert tokens["max_model_len"] > 0
    back = http.post("/detokenize", json={"tokens": tokens["tokens"]}).json()
    assert back == {"prompt": text}


@pytest.mark.slow
def test_a_conversation_counts_what_a_chat_prompt_has(
    http: httpx.Client, smol: openai.OpenAI, smol_server: RunningServer
) -> None:
    model = smol_server.state.model_name
    counted = http.post("/tokenize", json={"model": model, "messages": MESSAGES}).json()
    chat = smol.chat.completions.create(model=model, messages=MESSAGES, max_tokens=2)  # type: ignore[arg-type]
    assert chat.usage is not None and counted["count"] == chat.usage.prompt_tokens
    rendered = http.post("/detokenize", json={"tokens": counted["tokens"]}).json()["prompt"]
    assert rendered.startswith("<|im_start|>system\nBe brief.") and rendered.rstrip().endswith("<think>")
    off = http.post(
        "/tokenize", json={"messages": MESSAGES, "chat_template_kwargs": {"enable_thinking": False}}
    ).json()
    assert off["count"] < counted["count"]  # no thinking instruction, no opened thought


def test_bad_requests_name_the_field(http: httpx.Client) -> None:
    cases = {
        "neither prompt nor messages": ({}, 400, "prompt"),
        "both": ({"prompt": "x", "messages": MESSAGES}, 400, "prompt"),
        "unknown field": ({"prompt": "x", "add_bos": True}, 400, "add_bos"),
        "unknown model": ({"prompt": "x", "model": "nope"}, 404, "model"),
        "a bad message": ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role"),
    }
    for case, (body, status, param) in cases.items():
        response = http.post("/tokenize", json=body)
        assert response.status_code == status and response.json()["error"]["param"] == param, case
    response = http.post("/detokenize", json={"tokens": [1, 10**9]})
    assert response.status_code == 400 and response.json()["error"]["param"] == "tokens[1]"
    response = http.post("/detokenize", json={"tokens": "1 2"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "tokens"
