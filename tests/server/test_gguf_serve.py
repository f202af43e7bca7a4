"""The server on the embedded SmolLM2's own GGUF blocks (what ``thinkstruct serve`` loads by
default for it): chat answers, constrained and free, and a seed's answer alone and
beside other requests the same bits (the blocks' kernels compute each row alone)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from server_harness import RunningServer, serving, start_engine, stop_engine

from thinkstruct.server import ServerSettings

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def gguf_server() -> Iterator[RunningServer]:
    from thinkstruct.engine import load_model

    engine = start_engine(
        load_model(None, quantize="auto", progress=False), warm=False, max_batch=4, max_queue=16
    )
    try:
        with serving(engine, ServerSettings(default_max_tokens=48)) as server:
            yield server
    finally:
        stop_engine(engine)


def test_the_embedded_gguf_serves_on_its_own_blocks(gguf_server: RunningServer) -> None:
    assert gguf_server.state.engine.model.quantize == "gguf"
    client = gguf_server.openai()
    model = client.models.list().data[0].id
    constrained = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Alice is 31. Give her name and age as JSON."}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": SCHEMA, "strict": True},
        },
        temperature=0,
    )
    answer = json.loads(constrained.choices[0].message.content or "")
    assert set(answer) == {"name", "age"} and isinstance(answer["age"], int)
    free = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is the capital of France?"}], temperature=0
    )
    message = free.choices[0].message.model_dump()
    assert "Paris" in (message["content"] or "") + (message.get("reasoning_content") or "")


def test_a_seeded_answer_does_not_depend_on_its_batch(gguf_server: RunningServer) -> None:
    client = gguf_server.openai()
    model = client.models.list().data[0].id

    def ask(question: str) -> str:
        reply = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": question}],
            temperature=1.0,
            seed=7,
            max_tokens=32,
        )
        return reply.choices[0].message.content or ""

    alone = ask("Write a line about the sea.")
    with ThreadPoolExecutor(4) as pool:
        beside = list(
            pool.map(ask, ["Write a line about the sea.", "Name a fruit.", "Count to five.", "Hi!"])
        )
    assert beside[0] == alone
