"""The paged KV cache: reference counts and copy-on-write against a plain model of what each
slot and each held span should read (a hypothesis state machine), then the decoder runner
on it: shared and cached blocks are the bits a fresh computation gives, and moving a row
copies no whole block."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from thinkstruct.engine.kv.blocks import HeldBlocks, PagedKvCache
from thinkstruct.engine.kv.prefix_cache import BLOCK_TOKENS, PrefixCache
from thinkstruct.engine.runners.decoder_runner import DecoderRunner
from thinkstruct.engine.weights.int8_weights import quantize_int8_weights

SLOTS = 3
CONTEXT = 4 * BLOCK_TOKENS
DIM = 8


class PagedCacheMachine(RuleBasedStateMachine):
    """Slots join, extend, rewind (a refused draft), share a prefix, move, leave; spans of
    whole blocks are held (the prefix cache) and adopted by other slots, then released.
    Every write stores a fresh number, so a write into a block another holder reads shows
    as a changed value there."""

    def __init__(self) -> None:
        super().__init__()
        # Two blocks at first: the pools grow while the machine runs.
        self.cache = PagedKvCache(
            layers=1, slots=SLOTS, kv_heads=1, head_dim=DIM, context_length=CONTEXT,
            dtype=torch.float32, initial_blocks=2,
        )  # fmt: skip
        self.values: list[list[float]] = [[] for _ in range(SLOTS)]  # what each slot holds
        self.held: list[tuple[HeldBlocks, list[float]]] = []
        self.counter = 0.0

    def _write(self, slot: int, start: int, count: int) -> None:
        self.cache.prepare(slot, start, start + count)
        fresh = [self.counter + 1 + i for i in range(count)]
        self.counter += count
        keys = torch.tensor(fresh)[:, None, None].expand(count, 1, DIM)
        positions = torch.arange(start, start + count)
        self.cache.write_tokens(0, torch.full((count,), slot), positions, keys, -keys)
        self.values[slot] = self.values[slot][:start] + fresh

    @rule(slot=st.integers(0, SLOTS - 1), count=st.integers(1, 40))
    def extend(self, slot: int, count: int) -> None:
        start = len(self.values[slot])
        if start + count <= CONTEXT:
            self._write(slot, start, count)

    @rule(slot=st.integers(0, SLOTS - 1), back=st.integers(0, 40), count=st.integers(1, 10))
    def rewind_and_write(self, slot: int, back: int, count: int) -> None:
        """A speculative draft refused: the row goes on from an earlier length."""
        start = max(0, len(self.values[slot]) - back)
        if start < CONTEXT:
            self._write(slot, start, min(count, CONTEXT - start))

    @rule(src=st.integers(0, SLOTS - 1), dst=st.integers(0, SLOTS - 1), data=st.data())
    def share(self, src: int, dst: int, data: st.DataObject) -> None:
        """A move (compaction) or a prompt starting with a live row's prefix."""
        length = data.draw(st.integers(0, len(self.values[src])), label="length")
        self.cache.share(src, dst, length)
        self.values[dst] = self.values[src][:length]

    @rule(slot=st.integers(0, SLOTS - 1))
    def leave(self, slot: int) -> None:
        self.cache.free(slot)
        self.values[slot] = []

    @rule(first=st.integers(0, SLOTS))
    def release_slots(self, first: int) -> None:
        for slot in range(first, SLOTS):
            self.cache.free(slot)
            self.values[slot] = []

    @rule(slot=st.integers(0, SLOTS - 1), data=st.data())
    def hold(self, slot: int, data: st.DataObject) -> None:
        whole = len(self.values[slot]) // BLOCK_TOKENS
        if whole:
            first = data.draw(st.integers(0, whole - 1), label="first block")
            last = data.draw(st.integers(first + 1, whole), label="end block")
            span = self.cache.hold(slot, first * BLOCK_TOKENS, last * BLOCK_TOKENS)
            self.held.append((span, self.values[slot][first * BLOCK_TOKENS : last * BLOCK_TOKENS]))

    @precondition(lambda self: self.held)
    @rule(slot=st.integers(0, SLOTS - 1), data=st.data())
    def adopt(self, slot: int, data: st.DataObject) -> None:
        span, values = data.draw(st.sampled_from(self.held), label="held")
        start = (
            data.draw(st.integers(0, len(self.values[slot]) // BLOCK_TOKENS), label="at block") * BLOCK_TOKENS
        )
        if start + len(values) <= CONTEXT:
            self.cache.adopt(slot, start, span)
            self.values[slot] = self.values[slot][:start] + values

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release_held(self, data: st.DataObject) -> None:
        index = data.draw(st.integers(0, len(self.held) - 1), label="evicted")
        span, _ = self.held.pop(index)
        span.release()
        span.release()  # a second release gives nothing back twice

    @invariant()
    def every_holder_reads_what_it_was_given(self) -> None:
        for slot, values in enumerate(self.values):
            if values:
                keys, vals = self.cache.read_rows(0, slot, 1, len(values))
                assert keys[0, 0, :, 0].tolist() == values
                assert vals[0, 0, :, 0].tolist() == [-v for v in values]
        for span, values in self.held:
            got = self.cache.keys[0][0, list(span.blocks), :, 0].flatten().tolist()
            assert got == values

    @invariant()
    def references_are_counted_exactly(self) -> None:
        counts = [0] * self.cache.num_blocks
        for slot in range(SLOTS):
            blocks = self.cache.blocks_of(slot)
            assert len(blocks) == -(-len(self.values[slot]) // BLOCK_TOKENS)
            assert self.cache.table[slot, : len(blocks)].tolist() == list(blocks)
            assert bool((self.cache.table[slot, len(blocks) :] == -1).all())
            for block in blocks:
                counts[block] += 1
        for span, _ in self.held:
            for block in span.blocks:
                counts[block] += 1
        assert [self.cache.refs(b) for b in range(self.cache.num_blocks)] == counts
        assert self.cache.free_blocks == counts.count(0)

    def teardown(self) -> None:
        """Every row gone and every held span released: every block is free again."""
        for slot in range(SLOTS):
            self.cache.free(slot)
        for span, _ in self.held:
            span.release()
        assert self.cache.free_blocks == self.cache.num_blocks


TestPagedCacheMachine = PagedCacheMachine.TestCase
TestPagedCacheMachine.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)


def test_a_write_never_lands_in_a_shared_block() -> None:
    """A prefix of 40 positions shared mid-block: the first of the two that writes after
    it gets its own copy of that block (one copy, counted); the other writes in place."""
    cache = PagedKvCache(
        layers=1, slots=2, kv_heads=1, head_dim=DIM, context_length=CONTEXT, dtype=torch.float32
    )
    cache.prepare(0, 0, 48)
    cache.share(0, 1, 40)
    assert cache.blocks_of(1) == cache.blocks_of(0)  # both blocks shared, nothing copied
    assert cache.copies == 0
    cache.prepare(1, 40, 41)
    assert cache.copies == 1
    assert cache.blocks_of(1)[0] == cache.blocks_of(0)[0] and cache.blocks_of(1)[1] != cache.blocks_of(0)[1]
    cache.prepare(0, 48, 49)  # now alone in its block: no copy
    assert cache.copies == 1
    with pytest.raises(ValueError, match="holds 64 positions, not the 80"):
        cache.prepare(0, 80, 81)


def test_grown_pools_keep_their_blocks_and_start_the_new_ones_at_zero() -> None:
    """New blocks are zeros (the torch path's attention reads a padded span: garbage past a
    row's length, NaN say, would reach its sum through a zero weight)."""
    cache = PagedKvCache(
        layers=2, slots=1, kv_heads=1, head_dim=DIM, context_length=CONTEXT, dtype=torch.float32,
        initial_blocks=2,
    )  # fmt: skip
    for pool in (*cache.keys, *cache.values):
        pool.normal_()
    before = [pool.clone() for pool in (*cache.keys, *cache.values)]
    cache.prepare(0, 0, 3 * BLOCK_TOKENS)  # a third block: the pools double to four
    assert cache.num_blocks == 4
    for pool, old in zip((*cache.keys, *cache.values), before, strict=True):
        assert torch.equal(pool[:, :2], old)
        assert torch.count_nonzero(pool[:, 2:]) == 0


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_reserved_blocks_take_memory_only_once_used() -> None:
    """By default the pools reserve every slot's whole context and as much again (1 GiB
    here) as untouched zero pages: building them takes almost no memory, the slots fill
    their contexts without a doubling (which stalls every row), and ``nbytes`` counts the
    blocks used, not the reservation."""
    shape = {"layers": 4, "slots": 2, "kv_heads": 2, "head_dim": 64, "context_length": 4096 * BLOCK_TOKENS}
    before = _resident_bytes()
    cache = PagedKvCache(**shape, dtype=torch.float32)  # type: ignore[arg-type]
    assert cache.block_bytes == 2 * 4 * 2 * BLOCK_TOKENS * 64 * 4
    assert cache.num_blocks == 2 * 2 * 4096  # 1 GiB of blocks
    assert _resident_bytes() - before < 64 << 20
    assert cache.nbytes == 0
    for slot in range(2):
        cache.prepare(slot, 0, 4096 * BLOCK_TOKENS)
    assert cache.num_blocks == 2 * 2 * 4096  # no doubling
    assert cache.nbytes == 2 * 4096 * cache.block_bytes
    cache.free(0)
    assert cache.nbytes == 2 * 4096 * cache.block_bytes  # touched blocks stay counted
    # Within a small reservation the pools start smaller and double past it.
    small = PagedKvCache(**shape, dtype=torch.float32, reserve_bytes=100 * cache.block_bytes)  # type: ignore[arg-type]
    assert small.num_blocks == 100
    small.prepare(0, 0, 101 * BLOCK_TOKENS)
    assert small.num_blocks == 200 and small.nbytes == 101 * cache.block_bytes


# ---- the decoder runner on it ------------------------------------------------------------


@pytest.fixture(scope="module")
def int8_model(tiny_model):
    """The tiny model with int8 weights: the stacked, batch-invariant pass."""
    import copy

    model = copy.deepcopy(tiny_model.model)
    quantize_int8_weights(model)
    return model


def _prompt(n: int, salt: int = 0) -> list[int]:
    return [(i * 7919 + salt) % 5000 + 10 for i in range(n)]


def _runner(model, slots: int = SLOTS) -> DecoderRunner:
    runner = DecoderRunner(model, slots=slots, context_length=4 * CONTEXT)
    assert runner.stacked and runner.batch_invariant
    return runner


def _kv(runner: DecoderRunner, slot: int, length: int) -> list[torch.Tensor]:
    return [
        t for layer in range(len(runner.cache.keys)) for t in runner.cache.read_rows(layer, slot, 1, length)
    ]


def test_a_cached_prefix_is_the_bits_of_computing_it(int8_model) -> None:
    """Blocks kept by the prefix cache (by reference) and mapped into another slot give
    that slot the keys, values and next logits a fresh runner computes for the whole
    prompt, bit for bit; the cache copied nothing."""
    prompt = _prompt(3 * BLOCK_TOKENS + 5)
    runner = _runner(int8_model)
    cache = PrefixCache(max_bytes=1 << 30)
    with torch.inference_mode():
        runner.forward(0, [prompt[:70]], [0])
        cache.insert(prompt[:70], lambda start, stop: runner.read_kv(0, start, stop))
        runner.release_slots(0)  # the row left
        found = cache.match(prompt, limit=len(prompt) - 1)
        assert found.tokens == 2 * BLOCK_TOKENS and found.kv is not None
        runner.write_kv(1, 0, found.kv)
        reused = runner.forward(1, [prompt[found.tokens :]], [found.tokens])
        fresh_runner = _runner(int8_model)
        fresh = fresh_runner.forward(1, [prompt], [0])
    assert torch.equal(reused, fresh)
    for got, want in zip(_kv(runner, 1, len(prompt)), _kv(fresh_runner, 1, len(prompt)), strict=True):
        assert torch.equal(got, want)
    assert runner.cache.copies == 0


def test_a_moved_or_sharing_row_copies_no_whole_block(int8_model) -> None:
    """A row moved to a hole (compaction) takes the very blocks it had; a prompt sharing a
    live row's 40-token prefix shares its whole block and copies only the partial one;
    and both go on to the logits of computing everything fresh."""
    runner = _runner(int8_model)
    a, b = _prompt(3 * BLOCK_TOKENS), [*_prompt(40), *_prompt(9, salt=3)]
    with torch.inference_mode():
        runner.forward(2, [a], [0])
        before = runner.cache.blocks_of(2)
        runner.copy_slot(2, 0, len(a))  # the row in slot 2 moves down into a hole
        runner.release_slots(1)  # slots above the live rows hold nothing
        assert runner.cache.blocks_of(0) == before
        runner.copy_slot(0, 1, 40)  # b starts with a's first 40 tokens
        assert runner.cache.blocks_of(1) == before[:2]
        got = runner.forward(0, [[5], b[40:]], [len(a), 40])
        fresh = _runner(int8_model).forward(0, [[*a, 5], b], [0, 0])
    assert torch.equal(got, fresh)
    assert runner.cache.blocks_of(0)[:3] == before  # written in place: a row alone in its blocks
    assert runner.cache.copies == 1  # b's partial second block, nothing else
    assert runner.cache.blocks_of(1)[0] == before[0]


def test_every_block_comes_back_when_every_row_and_cached_span_is_gone(int8_model) -> None:
    runner = _runner(int8_model)
    cache = PrefixCache(max_bytes=3 * runner.cache.block_bytes)
    with torch.inference_mode():
        for i in range(4):
            prompt = _prompt(2 * BLOCK_TOKENS + i, salt=i % 2)
            found = cache.match(prompt, limit=len(prompt) - 1)
            if found.kv is not None:
                runner.write_kv(i % SLOTS, 0, found.kv)
            runner.forward(i % SLOTS, [prompt[found.tokens :]], [found.tokens])
            cache.insert(prompt, lambda start, stop, slot=i % SLOTS: runner.read_kv(slot, start, stop))
            assert cache.bytes <= cache.max_bytes
    assert cache.evicted > 0
    runner.release_slots(0)
    cache.clear()
    assert runner.cache.free_blocks == runner.cache.num_blocks


def test_a_slot_takes_the_block_after_its_last_else_the_lowest_free() -> None:
    cache = PagedKvCache(
        layers=1, slots=2, kv_heads=1, head_dim=DIM, context_length=CONTEXT, dtype=torch.float32
    )
    cache.prepare(0, 0, 2 * BLOCK_TOKENS)
    cache.prepare(1, 0, BLOCK_TOKENS)
    cache.prepare(0, 2 * BLOCK_TOKENS, 3 * BLOCK_TOKENS)  # block 2 is slot 1's: the lowest free
    assert cache.blocks_of(0) == (0, 1, 3) and cache.blocks_of(1) == (2,)
    cache.free(0)
    cache.prepare(1, BLOCK_TOKENS, 4 * BLOCK_TOKENS)  # block 3 after its 2, then 4 after 3
    assert cache.blocks_of(1) == (2, 3, 4, 5)
    cache.prepare(0, 0, 2 * BLOCK_TOKENS)  # the freed 0 and 1, in one run again
    assert cache.blocks_of(0) == (0, 1)


def test_after_the_engine_serves_shared_and_cached_prompts_only_the_prefix_cache_holds_blocks(
    tiny_model_dir,
) -> None:
    """Six requests over one long system prompt, four at a time (donor sharing, prefix
    cache hits, rows leaving and moving): once all are done (the engine released the slots),
    every block in use is one the prefix cache holds."""
    from test_engine import wait_until

    from thinkstruct.engine import Engine, EngineConfig, GenerationRequest, SamplingParams, load_model

    model = load_model(tiny_model_dir, quantize="int8-weights", progress=False)
    system = list(model.tokenizer.encode("A long system prompt about careful answers. " * 8))
    with Engine(model, config=EngineConfig(max_batch=4)) as e:
        handles = [
            e.submit(
                GenerationRequest(
                    prompt_ids=[*system, *[10 + i] * i],
                    sampling=SamplingParams(max_tokens=20 + 7 * i, temperature=1.0, seed=i),
                )
            )
            for i in range(6)
        ]
        outs = [h.wait() for h in handles]
        wait_until(lambda: e.stats.slots_used == 0, "the engine laying the last rows out")
        runner = e.runner
        assert isinstance(runner, DecoderRunner)
        cache = runner.cache
        assert cache.num_blocks - cache.free_blocks == e.stats.prefix_cache_blocks > 0
    assert sum(o.usage.cached_tokens for o in outs) > 0
