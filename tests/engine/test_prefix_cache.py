"""The prefix cache of finished requests: the tree alone (a hypothesis state machine
against a plain model of it), then in the engine (a chat's next turn reuses the last)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from thinkstruct.engine import Engine, EngineConfig, GenerationRequest, SamplingParams, load_model
from thinkstruct.engine.kv.prefix_cache import KvSpan, PrefixCache

BLOCK = 4
LAYERS = 2


def _kv_of(tokens: list[int], start: int, stop: int) -> KvSpan:
    """What a model would compute at ``[start, stop)`` after ``tokens[:start]``: a function
    of the whole prefix, so a block reused after another prefix would show."""
    rows = [hash(tuple(tokens[: p + 1])) % 1000 for p in range(start, stop)]
    base = torch.tensor(rows, dtype=torch.float32).view(1, -1, 1).expand(2, -1, 3)
    return KvSpan(
        keys=tuple(base + layer for layer in range(LAYERS)),
        values=tuple(-base - layer for layer in range(LAYERS)),
    )


def _block_bytes() -> int:
    return _kv_of([1] * BLOCK, 0, BLOCK).nbytes


class PrefixCacheMachine(RuleBasedStateMachine):
    """Inserted sequences, matched prompts: a match is the longest run of whole blocks of
    an inserted sequence not evicted, its keys and values those computed for it."""

    def __init__(self) -> None:
        super().__init__()
        self.budget_blocks = 6
        self.cache = PrefixCache(block_tokens=BLOCK, max_bytes=self.budget_blocks * _block_bytes())
        self.reads = 0

    tokens = st.lists(st.integers(0, 2), min_size=0, max_size=14)

    @rule(seq=tokens)
    def insert(self, seq: list[int]) -> None:
        def read(start: int, stop: int) -> KvSpan:
            self.reads += 1
            return _kv_of(seq, start, stop)

        before = self.cache.blocks
        added = self.cache.insert(seq, read)
        assert added <= len(seq) // BLOCK
        assert self.cache.blocks <= before + added

    @rule(seq=tokens, limit=st.integers(0, 16))
    def match(self, seq: list[int], limit: int) -> None:
        found = self.cache.match(seq, limit=limit)
        assert found.tokens % BLOCK == 0 and found.tokens <= min(limit, len(seq))
        if found.tokens:
            assert found.kv is not None
            expected = _kv_of(seq, 0, found.tokens)
            for got, want in zip(
                (*found.kv.keys, *found.kv.values), (*expected.keys, *expected.values), strict=True
            ):
                assert torch.equal(got, want)
        else:
            assert found.kv is None

    @rule(seq=tokens)
    def inserted_then_matched_whole(self, seq: list[int]) -> None:
        """What was just inserted is found whole (the budget holds more than one path)."""
        self.cache.insert(seq, lambda start, stop: _kv_of(seq, start, stop))
        whole = len(seq) // BLOCK * BLOCK
        assert self.cache.match(seq, limit=len(seq)).tokens == whole

    @invariant()
    def within_budget_and_counted(self) -> None:
        assert self.cache.bytes <= self.cache.max_bytes
        assert self.cache.bytes == self.cache.blocks * _block_bytes()


TestPrefixCacheMachine = PrefixCacheMachine.TestCase
TestPrefixCacheMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def test_least_recently_used_goes_first_and_a_zero_budget_keeps_nothing() -> None:
    cache = PrefixCache(block_tokens=BLOCK, max_bytes=2 * _block_bytes())
    a, b = [1] * 8, [2] * 4
    cache.insert(a, lambda s, e: _kv_of(a, s, e))  # two blocks: the budget
    cache.match(a, limit=8)
    cache.insert(b, lambda s, e: _kv_of(b, s, e))  # evicts a's last block, the older leaf
    assert cache.match(a, limit=8).tokens == 4 and cache.match(b, limit=4).tokens == 4
    assert cache.evicted == 1
    none = PrefixCache(block_tokens=BLOCK, max_bytes=0)
    assert none.insert(a, lambda s, e: _kv_of(a, s, e)) == 0 and none.match(a, limit=8).tokens == 0


# ---- in the engine -----------------------------------------------------------------------


def _ids(model: Any, text: str) -> list[int]:
    return list(model.tokenizer.encode(text))


@pytest.fixture(scope="module")
def int8w_model(tiny_model_dir: Any) -> Any:
    return load_model(tiny_model_dir, quantize="int8-weights", progress=False)


def test_a_next_turn_reuses_the_finished_one_and_gets_the_same_answer(int8w_model: Any) -> None:
    """Turn two's prompt is turn one's prompt, its answer and a new question: once turn one
    has finished, its whole blocks come from the prefix cache (prompt and answer), and
    the seeded answer is the same bits as with the cache off (batch-invariant runner)."""
    first = _ids(int8w_model, "A long system prompt about careful answers. " * 6 + "First question?")
    params = SamplingParams(max_tokens=20, temperature=1.0, seed=3)
    with Engine(int8w_model, config=EngineConfig(max_batch=2)) as e:
        assert e.runner is not None and e.runner.batch_invariant
        one = e.submit(GenerationRequest(prompt_ids=first, sampling=params)).wait()
        second = [*first, *one.token_ids, *_ids(int8w_model, " And the next one?")]
        two = e.submit(GenerationRequest(prompt_ids=second, sampling=params)).wait()
        stats = e.stats
    held = len(first) + len(one.token_ids) - 1  # the last answer token was never fed
    assert two.usage.cached_tokens == held // 32 * 32 > 0
    assert stats.prefix_cache_hit_tokens == two.usage.cached_tokens
    assert stats.prefix_cache_blocks >= held // 32 and stats.prefix_cache_bytes > 0
    with Engine(int8w_model, config=EngineConfig(max_batch=2, prefix_cache_bytes=0)) as cold:
        alone = cold.submit(GenerationRequest(prompt_ids=second, sampling=params)).wait()
    assert alone.usage.cached_tokens == 0
    assert two.token_ids == alone.token_ids


def test_the_budget_bounds_the_cache(int8w_model: Any) -> None:
    with Engine(int8w_model, config=EngineConfig(max_batch=2, prefix_cache_bytes=1)) as e:
        for i in range(3):
            e.submit(
                GenerationRequest(
                    prompt_ids=_ids(int8w_model, f"prompt number {i} " * 12),
                    sampling=SamplingParams(max_tokens=2),
                )
            ).wait()
        assert e.stats.prefix_cache_bytes <= 1 and e.stats.prefix_cache_evicted_blocks > 0
