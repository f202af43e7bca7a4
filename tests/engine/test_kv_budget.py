"""Keys and values within their budgets, with small sizes on the tiny model (a block of
its keys and values is 16 KiB): the pools never hold more than the running requests'
budget plus the prefix cache's plus one block, a request waits while its reservation
does not fit, one the budget cannot hold is refused with a 400-style error naming
``max_tokens``, one arriving while the running and waiting ones need the budget twice
over is refused with :class:`KvCacheFull` (429), the prefix cache evicts to stay within
its own budget, and the engine's gauges say so."""

from __future__ import annotations

import concurrent.futures
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_engine import wait_until

from thinkstruct import Constraint
from thinkstruct.engine import (
    Engine,
    EngineConfig,
    EngineOverloaded,
    FinishReason,
    GenerationRequest,
    SamplingParams,
    load_model,
)
from thinkstruct.engine.core.config import KV_DEMAND_BUDGETS, KvBudgetExceeded, KvCacheFull
from thinkstruct.engine.kv.blocks import KvPoolFull, PagedKvCache
from thinkstruct.engine.kv.budget import KvBudget
from thinkstruct.engine.kv.prefix_cache import BLOCK_TOKENS
from thinkstruct.engine.runners.decoder_runner import DecoderRunner
from thinkstruct.grammar.service.compiler import CompilerConfig, GrammarCompiler

#: Bytes of one block of the tiny model's keys and values (2 layers, 2 kv heads of 16,
#: float16, as the compiled kernels hold them by default): 2 x 2 x 2 x 32 x 16 x 2.
BLOCK = 8 << 10


@pytest.fixture(scope="module")
def compiler(tiny_model):
    with GrammarCompiler(tiny_model.tokenizer, CompilerConfig(timeout_s=60, worker_processes=0)) as c:
        yield c


@pytest.fixture(scope="module")
def int8w_model(tiny_model_dir):
    """The tiny model with int8 weights: the stacked, batch-invariant passes, with
    speculative drafts (which write past a row's own tokens) on."""
    return load_model(tiny_model_dir, quantize="int8-weights", progress=False)


def _request(prompt: list[int], *, max_tokens: int, seed: int = 0, **kwargs) -> GenerationRequest:
    return GenerationRequest(
        prompt_ids=prompt,
        sampling=SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed),
        **kwargs,
    )


def _prompt(n: int, salt: int = 0) -> list[int]:
    return [(i * 7919 + salt * 104729) % 5000 + 10 for i in range(n)]


# ---- the budget and the pools ------------------------------------------------------------


def test_a_request_reserves_whole_units_of_what_it_can_come_to_hold() -> None:
    budget = KvBudget(
        kv_bytes=4 * BLOCK, prefix_bytes=BLOCK, unit_tokens=32, unit_bytes=BLOCK, max_positions=128
    )
    assert budget.need(1) == budget.need(32) == BLOCK
    assert budget.need(33) == 2 * BLOCK
    assert budget.need(128) == 4 * BLOCK
    assert budget.need(129) is None
    smaller = budget.within(kv_bytes=2 * BLOCK + 5, prefix_bytes=10 * BLOCK)
    assert (smaller.kv_bytes, smaller.prefix_bytes, smaller.max_positions) == (2 * BLOCK, BLOCK, 64)
    assert smaller.need(65) is None


def test_pools_never_grow_past_their_capacity() -> None:
    """A capped pool reserves its capacity up front (no doubling while serving) and,
    with every block in use, refuses the next one instead of growing."""
    cache = PagedKvCache(
        layers=1, slots=2, kv_heads=1, head_dim=8, context_length=8 * BLOCK_TOKENS, dtype=torch.float32,
        capacity_blocks=5,
    )  # fmt: skip
    assert cache.num_blocks == 5
    cache.prepare(0, 0, 3 * BLOCK_TOKENS)
    cache.prepare(1, 0, 2 * BLOCK_TOKENS)
    assert cache.free_blocks == 0
    with pytest.raises(KvPoolFull, match="all 5 blocks"):
        cache.prepare(1, 2 * BLOCK_TOKENS, 2 * BLOCK_TOKENS + 1)
    assert cache.num_blocks == 5
    # Started smaller (a budget over the up-front reservation), it doubles up to its capacity.
    small = PagedKvCache(
        layers=1, slots=1, kv_heads=1, head_dim=8, context_length=8 * BLOCK_TOKENS, dtype=torch.float32,
        capacity_blocks=5, initial_blocks=2,
    )  # fmt: skip
    small.prepare(0, 0, 5 * BLOCK_TOKENS)
    assert small.num_blocks == 5


def test_the_decoder_runners_pools_hold_both_budgets_and_one_block(tiny_model) -> None:
    runner = DecoderRunner(
        tiny_model.model,
        slots=4,
        context_length=tiny_model.context_length,
        kv_cache_bytes=6 * BLOCK + 100,
        prefix_cache_bytes=3 * BLOCK,
    )
    assert runner.cache.block_bytes == BLOCK
    assert runner.cache.capacity_blocks == runner.cache.num_blocks == 6 + 3 + 1
    assert runner.kv_budget == KvBudget(
        kv_bytes=6 * BLOCK, prefix_bytes=3 * BLOCK, unit_tokens=32, unit_bytes=BLOCK, max_positions=6 * 32
    )


def test_the_kv_cache_dtype_reaches_the_runner_and_the_same_bytes_hold_half_the_positions_in_float32(
    tiny_model,
) -> None:
    """``kv_cache_dtype`` (``--kv-cache-dtype``) picks what the runner's pools hold; the
    budget is bytes, so float32 admits half the positions float16 does."""
    with pytest.raises(ValueError, match="kv_cache_dtype must be float16, float32 or None"):
        EngineConfig(kv_cache_dtype="bfloat16")  # type: ignore[arg-type]
    for dtype, positions in ((None, 4 * 32), ("float32", 2 * 32)):
        config = EngineConfig(
            max_batch=2, kv_cache_bytes=4 * BLOCK, prefix_cache_bytes=0, kv_cache_dtype=dtype
        )
        with Engine(tiny_model, config=config) as e:
            assert e.runner is not None
            assert e.runner.cache.dtype == (torch.float32 if dtype else torch.float16)
            with pytest.raises(KvBudgetExceeded, match=rf"{positions} positions"):
                e.submit(_request(_prompt(20), max_tokens=positions))
            out = e.submit(_request(_prompt(20), max_tokens=positions - 20)).wait()
            assert out.finish_reason is FinishReason.LENGTH


# ---- admission ------------------------------------------------------------------------------


def test_a_request_the_budget_cannot_hold_is_refused_naming_max_tokens(tiny_model) -> None:
    config = EngineConfig(max_batch=2, kv_cache_bytes=4 * BLOCK, prefix_cache_bytes=0)
    with Engine(tiny_model, config=config) as e:
        with pytest.raises(KvBudgetExceeded, match=r"128 positions") as refused:
            e.submit(_request(_prompt(20), max_tokens=120))
        assert refused.value.field == "max_tokens"
        out = e.submit(_request(_prompt(20), max_tokens=108)).wait()  # 128 positions: fits
        assert out.finish_reason is FinishReason.LENGTH


def test_requests_past_twice_the_budget_get_kv_cache_full_and_a_retry_after(tiny_model, compiler) -> None:
    """Requests whose grammar is still compiling wait in the queue with their need counted:
    up to twice the budget they queue, past it the next is refused (429) with a
    ``Retry-After``; once they leave, a request is taken again."""
    config = EngineConfig(max_batch=4, kv_cache_bytes=4 * BLOCK, prefix_cache_bytes=0)
    with Engine(tiny_model, config=config, compiler=compiler) as e:
        futures = [concurrent.futures.Future() for _ in range(2)]
        # 20 + 76 = 96 positions: 3 blocks each; 6 of the 8 the demand may reach.
        held = [e.submit(_request(_prompt(20), max_tokens=76, grammar=f)) for f in futures]
        with pytest.raises(KvCacheFull) as refused:
            e.submit(_request(_prompt(20), max_tokens=76))
        assert isinstance(refused.value, EngineOverloaded) and refused.value.retry_after_s >= 1
        assert refused.value.code == "kv_cache_full"
        assert e.stats.kv_refused == 1
        small = e.submit(_request(_prompt(20), max_tokens=40))  # 2 blocks: exactly 8 in all
        assert small.wait().finish_reason is FinishReason.LENGTH
        grammar = compiler.compile(Constraint.choice(["left", "right"]))
        for f in futures:
            f.set_result(grammar)
        for h in held:
            assert h.wait().finish_reason is FinishReason.STOP
        e.submit(_request(_prompt(20), max_tokens=76)).wait()
        assert e.stats.kv_refused == 1
    assert KV_DEMAND_BUDGETS == 2  # the 8 blocks above


def test_a_request_waits_while_its_reservation_does_not_fit(tiny_model) -> None:
    """Three requests of 2 blocks each under a 4-block budget with 4 slots: at most two
    run at once, the third takes its slot when one leaves, and nothing is refused."""
    config = EngineConfig(max_batch=4, kv_cache_bytes=4 * BLOCK, prefix_cache_bytes=0)
    seen: list[tuple[int, int]] = []
    with Engine(tiny_model, config=config) as e:
        e._on_step = lambda: seen.append((e.stats.slots_used, e.stats.kv_cache_reserved_bytes))
        handles = [e.submit(_request(_prompt(20, salt=i), max_tokens=40, seed=i)) for i in range(3)]
        outs = [h.wait() for h in handles]
        wait_until(lambda: e.stats.slots_used == 0, "the last row laid out")
        assert e.stats.kv_cache_reserved_bytes == 0
    assert all(o.finish_reason is FinishReason.LENGTH for o in outs)
    assert max(slots for slots, _ in seen) == 2
    assert max(reserved for _, reserved in seen) == 4 * BLOCK


def test_the_prefix_cache_evicts_within_its_budget_and_the_gauges_say_so(tiny_model) -> None:
    config = EngineConfig(max_batch=2, kv_cache_bytes=8 * BLOCK, prefix_cache_bytes=2 * BLOCK)
    with Engine(tiny_model, config=config) as e:
        for i in range(4):  # distinct 3-block prompts: each leaves 3 whole blocks behind
            e.submit(_request(_prompt(3 * BLOCK_TOKENS + 5, salt=i), max_tokens=8, seed=i)).wait()
        wait_until(lambda: e.stats.slots_used == 0, "the last row laid out")
        stats = e.stats
        assert stats.kv_cache_allowed_bytes == 8 * BLOCK and stats.prefix_cache_allowed_bytes == 2 * BLOCK
        assert 0 < stats.prefix_cache_bytes <= 2 * BLOCK
        assert stats.prefix_cache_evicted_blocks > 0
        cache = e.runner.cache
        assert cache.num_blocks == 8 + 2 + 1
        assert stats.kv_pool_bytes == cache.nbytes <= (8 + 2 + 1) * BLOCK
        assert cache.num_blocks - cache.free_blocks == stats.prefix_cache_blocks  # what it holds, no more


# ---- no admitted request finds the pool short -----------------------------------------------


@st.composite
def _workloads(draw: st.DrawFn) -> list[dict]:
    """Requests of random prompts (some starting with a shared system prompt, some a
    previous one's whole prompt: prefix cache and donor sharing), lengths and cancels."""
    count = draw(st.integers(3, 8))
    return [
        {
            "shared": draw(st.sampled_from([0, 40, 70])),
            "own": draw(st.integers(1, 40)),
            "max_tokens": draw(st.integers(1, 50)),
            "cancel": draw(st.booleans()) and draw(st.booleans()),
            "seed": draw(st.integers(0, 1000)),
        }
        for _ in range(count)
    ]


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(workload=_workloads())
def test_admitted_requests_never_find_the_pool_short(int8w_model, workload: list[dict]) -> None:
    """Whatever the prompts share, however long the answers run (speculative drafts
    included) and whoever is cancelled, under a 10-block budget (3 requests of up to 160
    positions) and a 3-block prefix cache: no request ends in an error, the reservations
    stay within the budget at every step, and the pools never grow past both budgets and
    one block."""
    config = EngineConfig(max_batch=4, kv_cache_bytes=10 * BLOCK, prefix_cache_bytes=3 * BLOCK, max_queue=64)
    system = _prompt(70, salt=99)
    over: list[str] = []
    with Engine(int8w_model, config=config) as e:
        capacity = e.runner.cache.capacity_blocks
        assert capacity == 10 + 3 + 1

        def check() -> None:
            stats = e.stats
            if stats.kv_cache_reserved_bytes > 10 * BLOCK or e.runner.cache.num_blocks > capacity:
                over.append(f"{stats.kv_cache_reserved_bytes} reserved, {e.runner.cache.num_blocks} blocks")

        e._on_step = check
        rng = random.Random(0)
        handles = []
        for i, r in enumerate(workload):
            prompt = [*system[: r["shared"]], *_prompt(r["own"], salt=rng.randrange(3))]
            try:
                handles.append(
                    (r, e.submit(_request(prompt, max_tokens=r["max_tokens"], seed=r["seed"] + i)))
                )
            except KvCacheFull:
                continue
        for r, h in handles:
            if r["cancel"]:
                h.cancel()
        outs = [h.wait() for _, h in handles]
        wait_until(lambda: e.stats.slots_used == 0, "the last row laid out")
        assert e.stats.kv_cache_reserved_bytes == 0
        assert e.runner.cache.num_blocks <= capacity
    assert not over
    assert all(o.finish_reason is not FinishReason.ERROR for o in outs), [o.error for o in outs]
