"""Faults on the engine: each one ends only the request it belongs to, frees what that
request held, and leaves the engine thread serving.

Faults are injected into one request (keyed by its seed, see ``fault_injection.py``):
its sampling raises, its grammar matcher rejects a sampled token; or into the engine's
own step (a runner whose KV copy fails). The model, sampler and grammars are real.
"""

from __future__ import annotations

import re
import threading
from typing import Any

import pytest
from fault_injection import (
    ACCEPTED_BEFORE_REJECTING,
    REJECTING_GRAMMAR_SEED,
    SAMPLING_FAULT_SEED,
    inject_rejecting_grammar,
    inject_sampling_fault,
    step_log,
)

from polling import HANG_S, wait_until
from thinkstruct import Constraint
from thinkstruct.engine import Engine, EngineConfig, FinishReason, GenerationRequest, SamplingParams
from thinkstruct.engine.runners.runner import TransformersRunner
from thinkstruct.grammar.service.compiler import CompilerConfig, GrammarCompiler

PROMPT = [0, 1000, 2000, 3000, 4000]


@pytest.fixture(scope="module")
def compiler(tiny_model):
    # In-process compiles only: these tests need no worker processes.
    with GrammarCompiler(tiny_model.tokenizer, CompilerConfig(timeout_s=60, worker_processes=0)) as c:
        yield c


@pytest.fixture(scope="module")
def engine(tiny_model, compiler):
    with Engine(tiny_model, config=EngineConfig(max_batch=2), compiler=compiler) as e:
        yield e


def request(*, seed: int, max_tokens: int, **fields: Any) -> GenerationRequest:
    return GenerationRequest(
        prompt_ids=PROMPT,
        sampling=SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed),
        **fields,
    )


def finish_of(handle):
    """The handle's whole output, failing (instead of hanging) if it never ends."""
    out: list[Any] = []
    reader = threading.Thread(target=lambda: out.append(handle.wait()), daemon=True)
    reader.start()
    reader.join(HANG_S)
    assert out, f"request {handle.request_id} never finished"
    return out[0]


def test_a_cancelled_request_frees_its_slot_and_kv_cache_within_one_step(engine) -> None:
    wait_until(lambda: engine.stats.slots_used == 0, "the engine is idle")
    handle = engine.submit(request(seed=1, max_tokens=3000))
    stream = iter(handle)
    assert next(stream).finish_reason is None  # it holds a slot and decodes
    wait_until(lambda: engine.stats.kv_tokens > len(PROMPT), "the request holds KV cache")
    assert engine.stats.slots_used == 1
    with step_log(engine, lambda: handle.cancelled) as log:
        steps = engine.stats.steps
        handle.cancel()
        deltas = list(stream)
        wait_until(lambda: any(s.slots_used == 0 for s in log.after_cancel()), "the slot is free")
    assert deltas[-1].finish_reason is FinishReason.ABORT
    after = log.after_cancel()
    # At most the iteration already under way when cancel() came ends with the slot held.
    assert len([s for s in after if s.slots_used]) <= 1
    freed = next(s for s in after if s.slots_used == 0)
    assert freed.kv_tokens == 0
    assert freed.steps <= steps + 1  # no decoding step ran for it after the one in flight


def test_a_request_cancelled_while_queued_never_takes_a_slot(engine) -> None:
    running = [engine.submit(request(seed=s, max_tokens=3000)) for s in (1, 2)]  # both slots
    streams = [iter(h) for h in running]
    for s in streams:
        next(s)
    queued = engine.submit(request(seed=3, max_tokens=3000))
    queued.cancel()
    out = finish_of(queued)
    assert out.finish_reason is FinishReason.ABORT and out.usage.completion_tokens == 0
    assert engine.stats.slots_used == 2 and not any(h.finished for h in running)  # they went on
    for h in running:
        h.cancel()
        assert finish_of(h).finish_reason is FinishReason.ABORT


def test_a_fault_in_one_requests_sampling_ends_only_that_request(engine, monkeypatch) -> None:
    alone = finish_of(engine.submit(request(seed=7, max_tokens=12)))
    # The faulty request draws twice, then fails in a decoding step it shares with the
    # good one (their prompts are prefilled together or one step apart).
    inject_sampling_fault(monkeypatch, after=2)
    errors = engine.stats.finished["error"]
    bad = engine.submit(request(seed=SAMPLING_FAULT_SEED, max_tokens=12))
    good = engine.submit(request(seed=7, max_tokens=12))
    bad_out, good_out = finish_of(bad), finish_of(good)
    assert bad_out.finish_reason is FinishReason.ERROR
    assert "injected fault" in bad_out.error and bad_out.usage.completion_tokens == 2
    assert good_out.finish_reason is FinishReason.LENGTH
    # The good request's draws were not disturbed by the failed batch it was part of.
    assert good_out.token_ids == alone.token_ids
    assert engine.stats.finished["error"] == errors + 1


def test_a_grammar_that_rejects_a_sampled_token_ends_only_that_request(engine, compiler, monkeypatch) -> None:
    letters = compiler.compile(Constraint.regex("[a-z]{40}"))
    inject_rejecting_grammar(monkeypatch, engine)
    bad = engine.submit(request(seed=REJECTING_GRAMMAR_SEED, max_tokens=60, grammar=letters))
    good = engine.submit(request(seed=5, max_tokens=60, grammar=letters))
    bad_out, good_out = finish_of(bad), finish_of(good)
    assert bad_out.finish_reason is FinishReason.ERROR
    assert "rejected the sampled token" in bad_out.error
    assert bad_out.usage.completion_tokens == ACCEPTED_BEFORE_REJECTING
    assert good_out.finish_reason is FinishReason.STOP and good_out.error is None
    assert re.fullmatch("[a-z]{40}", good_out.content)


class KvCopyFailsOnce(TransformersRunner):
    """The real runner, except that its first KV slot copy once ``armed`` fails (a fault
    in the engine's own step, not in any one request). Armed by the test, so a copy made
    before it (the second prompt taking the first's prefix, when the engine happened to
    prefill them in two passes) is not the one that fails."""

    armed = False
    failed = False

    def copy_slot(self, src: int, dst: int, length: int) -> None:
        if self.armed and not self.failed:
            self.failed = True
            raise RuntimeError("injected fault copying a KV slot")
        super().copy_slot(src, dst, length)


def test_a_fault_in_the_engines_own_step_ends_its_rows_and_the_engine_goes_on(tiny_model) -> None:
    runner = KvCopyFailsOnce(
        tiny_model.model,
        slots=2,
        context_length=tiny_model.context_length,
        vocab_size=tiny_model.tokenizer.vocab_size,
    )
    with Engine(tiny_model, config=EngineConfig(max_batch=2), runner=runner) as e:
        first, second = (e.submit(request(seed=s, max_tokens=3000)) for s in (1, 2))
        streams = [iter(first), iter(second)]
        for s in streams:
            next(s)
        runner.armed = True
        first.cancel()  # the second moves down a slot: that copy fails
        assert finish_of(first).finish_reason is FinishReason.ABORT
        out = finish_of(second)
        assert out.finish_reason is FinishReason.ERROR and "injected fault" in out.error
        assert e.running
        after = finish_of(e.submit(request(seed=3, max_tokens=4)))
        assert after.finish_reason is FinishReason.LENGTH and after.usage.completion_tokens == 4
        wait_until(lambda: e.stats.slots_used == 0, "every slot is free again")
