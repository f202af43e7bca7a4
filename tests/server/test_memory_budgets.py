"""Memory budgets over HTTP: a real server on the tiny model (float32: a block of its keys
and values is 16 KiB) with a 4-block KV budget (128 positions a request), a 2-block
prefix cache and a 1 MiB grammar cache. A request the budget cannot hold is a 400
naming ``max_tokens``; one whose choices would need the budget more than twice over is
a 429 with ``Retry-After`` (code ``kv_cache_full``) and the server goes on; the prefix
cache evicts within its budget; ``/metrics`` reports each budget's bytes used and
allowed."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from server_harness import RunningServer, serving, stop_engine

from thinkstruct.server import ServerSettings

BLOCK = 16 << 10
GRAMMAR_CACHE = 1 << 20


@pytest.fixture(scope="module")
def budget_server(tiny_model_dir: Path) -> Iterator[RunningServer]:
    from thinkstruct.engine import Engine, EngineConfig, load_model
    from thinkstruct.grammar.service.compiler import CompilerConfig, GrammarCompiler

    model = load_model(tiny_model_dir, dtype="float32", progress=False)
    compiler = GrammarCompiler(model.tokenizer, CompilerConfig(timeout_s=60.0, cache_bytes=GRAMMAR_CACHE))
    config = EngineConfig(max_batch=4, kv_cache_bytes=4 * BLOCK, prefix_cache_bytes=2 * BLOCK)
    engine = Engine(model, config=config, compiler=compiler).start()
    try:
        with serving(engine, ServerSettings(max_n=8, default_max_tokens=16)) as server:
            yield server
    finally:
        stop_engine(engine)


def _gauges(http: httpx.Client) -> dict[str, float]:
    text = http.get("/metrics").text
    found = re.findall(r'^thinkstruct_memory_(used|allowed)_bytes\{budget="(\w+)"\} (\S+)$', text, re.M)
    numbers = {f"{budget} {kind}": float(value) for kind, budget, value in found}
    for name in ("thinkstruct_prefix_cache_evicted_blocks_total", "thinkstruct_engine_kv_refused_total"):
        match = re.search(rf"^{name} (\S+)$", text, re.M)
        assert match is not None, name
        numbers[name] = float(match.group(1))
    return numbers


def _chat(client: openai.OpenAI, model: str, text: str, **kwargs: Any) -> Any:
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": text}], temperature=1.0, seed=1, **kwargs
    )


def _retrying(call: Any, *, timeout_s: float = 60.0) -> Any:
    """``call()`` again while it gets a 429 (the refused choices leave within an engine
    round); a hang check, not a timing assertion."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except openai.RateLimitError:
            assert time.monotonic() < deadline, "still refused"
            time.sleep(0.05)


def test_each_budget_is_reported_used_and_allowed(budget_server: RunningServer) -> None:
    with budget_server.http() as http:
        gauges = _gauges(http)
    assert gauges["kv_cache allowed"] == 4 * BLOCK
    assert gauges["prefix_cache allowed"] == 2 * BLOCK
    assert gauges["grammar_cache allowed"] == GRAMMAR_CACHE
    assert gauges["kv_cache used"] == 0
    assert {"prefix_cache used", "grammar_cache used"} <= gauges.keys()


def test_a_request_the_kv_budget_cannot_hold_is_a_400_naming_max_tokens(budget_server: RunningServer) -> None:
    client = budget_server.openai()
    model = client.models.list().data[0].id
    with pytest.raises(openai.BadRequestError) as refused:
        _chat(client, model, "hi", max_tokens=500)
    assert refused.value.body["param"] == "max_tokens"
    assert "--kv-cache-bytes" in refused.value.body["message"]


def test_choices_needing_the_budget_twice_over_get_429_with_retry_after(budget_server: RunningServer) -> None:
    """Six choices of 3 blocks each (a short prompt and 60 tokens) against the 8 blocks
    the running and waiting requests may need: a 429 naming the KV cache, the choices
    already queued cancelled, and a request that fits is answered afterwards."""
    client = budget_server.openai()
    model = client.models.list().data[0].id
    with budget_server.http() as http:
        refused_before = _gauges(http)["thinkstruct_engine_kv_refused_total"]
        response = http.post(
            "/v1/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": "hi"}], "n": 6, "max_tokens": 60},
        )
        assert response.status_code == 429
        assert int(response.headers["retry-after"]) >= 1
        error = response.json()["error"]
        assert error["code"] == "kv_cache_full" and error["type"] == "rate_limit_error"
        assert "--kv-cache-bytes" in error["message"]
        assert _gauges(http)["thinkstruct_engine_kv_refused_total"] == refused_before + 1
    out = _retrying(lambda: _chat(client, model, "hi", max_tokens=20, n=2))
    assert [c.finish_reason for c in out.choices] == ["length", "length"]


def test_the_prefix_cache_evicts_within_its_budget(budget_server: RunningServer) -> None:
    """Three different prompts of over three blocks each leave more whole blocks behind
    than the prefix cache may keep: it holds at most its budget and evicts the rest."""
    client = budget_server.openai()
    model = client.models.list().data[0].id
    for word in ("apple", "river", "stone"):
        out = _retrying(lambda word=word: _chat(client, model, f"{word} " * 100, max_tokens=4))
        assert out.choices[0].finish_reason == "length"
    with budget_server.http() as http:
        deadline = time.monotonic() + 60
        while (gauges := _gauges(http))["thinkstruct_prefix_cache_evicted_blocks_total"] == 0:
            assert time.monotonic() < deadline, "the prefix cache never evicted"
            time.sleep(0.05)
    assert 0 < gauges["prefix_cache used"] <= gauges["prefix_cache allowed"] == 2 * BLOCK
