"""The compiled CPU kernels against the torch operations they replace.

Each kernel must compute what the Llama runner's torch path computes (to float32
rounding), for any sizes the runner hands it, and a token's result must not depend on the
other tokens of the pass: bit for bit, or a seeded request's tokens would change with the
batch it runs in.
"""

from __future__ import annotations

import ctypes

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from thinkstruct.engine.kernels import cpu_kernels as module
from thinkstruct.engine.kernels.cpu_kernels import CpuKernels, RopeLayout, cpu_kernels, unavailable_reason


@pytest.fixture(scope="module")
def kernels() -> CpuKernels:
    built = cpu_kernels()
    # This project's machines are x86-64 with AVX2 and gcc: a missing build is a failure.
    assert built is not None, unavailable_reason()
    return built


def _rotate_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' rotary positions over the first ``2 * cos.shape[-1]`` values of
    ``x``'s heads (the rest pass through)."""
    cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
    width = cos.shape[-1]
    head, tail = x[..., :width], x[..., width:]
    half = width // 2
    return torch.cat(
        (head * cos + torch.cat((-head[..., half:], head[..., :half]), dim=-1) * sin, tail), dim=-1
    )


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 40), eighths=st.integers(1, 12), seed=st.integers(0, 2**16))
def test_rms_norm_and_silu_match_torch(kernels, rows: int, eighths: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    dim = 8 * eighths
    x = torch.randn(rows, dim, generator=generator) * 10
    weight = torch.randn(dim, generator=generator)
    torch.testing.assert_close(
        kernels.rms_norm(x, weight, 1e-5), F.rms_norm(x, (dim,), weight, 1e-5), rtol=1e-5, atol=1e-5
    )
    gate_up = torch.randn(rows, 2 * dim, generator=generator) * 8  # far into both tails of the sigmoid
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(kernels.silu_mul(gate_up), F.silu(gate) * up, rtol=1e-5, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_rope_store_and_attention_match_torch(kernels, data) -> None:
    """With or without per-head q/k norms (Qwen3), full, partial (Phi-3) or no rotary
    (SmolLM3's layers without it), with a sliding window or none, over float32 or float16
    pools (keys and values rounded to nearest when stored)."""
    kv_heads = data.draw(st.integers(1, 3), label="kv_heads")
    heads = kv_heads * data.draw(st.integers(1, 4), label="group")
    dim = 8 * data.draw(st.sampled_from([2, 4, 8]), label="dim / 8")
    rot_half = 8 * data.draw(st.integers(1, dim // 16), label="rotary pairs / 8")
    rotate = data.draw(st.booleans(), label="rotate")
    qk_norm = data.draw(st.booleans(), label="q/k norm")
    window = data.draw(st.sampled_from([0, 1, 3, 9]), label="window")
    block = data.draw(st.sampled_from([1, 4, 8, 32]), label="block tokens")
    kv_dtype = data.draw(st.sampled_from([torch.float32, torch.float16]), label="pool dtype")
    slots, capacity = 3, 24
    # Each token: a slot and a position; a slot's positions are filled without holes.
    lengths = data.draw(st.lists(st.integers(0, 8), min_size=slots, max_size=slots), label="new tokens")
    cached = [data.draw(st.integers(0, capacity - 8 - 1), label=f"cached {s}") for s in range(slots)]
    slot_of = torch.tensor([s for s in range(slots) for _ in range(lengths[s])], dtype=torch.long)
    pos_of = torch.tensor([cached[s] + j for s in range(slots) for j in range(lengths[s])], dtype=torch.long)
    tokens = slot_of.numel()
    if tokens == 0:
        return
    generator = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16), label="seed"))
    keys = torch.randn(slots, kv_heads, capacity, dim, generator=generator)
    values = torch.randn(slots, kv_heads, capacity, dim, generator=generator)
    # The same cache in blocks, each slot's blocks scattered over the pool in random order.
    per_slot = -(-capacity // block)
    order = torch.randperm(slots * per_slot + 2, generator=generator)  # two blocks no slot uses
    table = order[: slots * per_slot].view(slots, per_slot).contiguous()
    pool_keys, pool_values = (_paged(x, table, block, len(order)).to(kv_dtype) for x in (keys, values))
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=generator) * 3
    angles = pos_of[:, None].float() * (1e4 ** (-torch.arange(0, 2 * rot_half, 2).float() / (2 * rot_half)))
    cos, sin = angles.cos().contiguous(), angles.sin().contiguous()
    layout = RopeLayout(rotate=rotate)
    queries = qkv[:, : heads * dim].view(tokens, heads, dim)
    new_keys = qkv[:, heads * dim : (heads + kv_heads) * dim].view(tokens, kv_heads, dim)
    if qk_norm:
        layout = RopeLayout(
            q_norm=torch.randn(dim, generator=generator),
            k_norm=torch.randn(dim, generator=generator),
            eps=1e-6,
            rotate=rotate,
        )
        queries = F.rms_norm(queries, (dim,), layout.q_norm, 1e-6)
        new_keys = F.rms_norm(new_keys, (dim,), layout.k_norm, 1e-6)
    if rotate:
        queries = _rotate_half(queries, cos[:, None], sin[:, None])
        new_keys = _rotate_half(new_keys, cos[:, None], sin[:, None])
    new_values = qkv[:, (heads + kv_heads) * dim :].view(tokens, kv_heads, dim).clone()
    want_keys, want_values = keys.to(kv_dtype), values.to(kv_dtype)
    want_keys[slot_of, :, pos_of] = new_keys.to(kv_dtype)
    want_values[slot_of, :, pos_of] = new_values.to(kv_dtype)

    kernels.rope_store(
        qkv, heads=heads, kv_heads=kv_heads, cos=cos, sin=sin, slot_of=slot_of, pos_of=pos_of,
        keys=pool_keys, values=pool_values, table=table, layout=layout,
    )  # fmt: skip
    torch.testing.assert_close(qkv[:, : heads * dim].view(tokens, heads, dim), queries, rtol=1e-5, atol=1e-5)
    # Keys to float32 rounding, before float16's (a key torch computes one float32 step
    # away may round to the neighbouring float16 value); values are copied: exactly.
    key_bound = 1e-3 if kv_dtype == torch.float16 else 1e-5
    torch.testing.assert_close(
        _unpaged(pool_keys, table, capacity), want_keys, rtol=key_bound, atol=key_bound
    )
    assert torch.equal(_unpaged(pool_values, table, capacity), want_values)
    stored_keys = _unpaged(pool_keys, table, capacity).float()  # attention's reference: what was stored

    span = int(pos_of.max()) + 1
    got = kernels.attention(
        qkv, heads=heads, kv_heads=kv_heads, slot_of=slot_of, pos_of=pos_of, span=span,
        keys=pool_keys, values=pool_values, table=table, scale=dim**-0.5, window=window,
    )  # fmt: skip
    group = heads // kv_heads
    for t in range(tokens):
        s, p = int(slot_of[t]), int(pos_of[t])
        lo = max(0, p + 1 - window) if window else 0  # transformers: key positions > p - window
        k = stored_keys[s, :, lo : p + 1].repeat_interleave(group, dim=0)  # [heads, p + 1 - lo, dim]
        v = want_values[s, :, lo : p + 1].float().repeat_interleave(group, dim=0)
        want = F.scaled_dot_product_attention(queries[t][:, None], k, v, scale=dim**-0.5)[:, 0]
        torch.testing.assert_close(got[t].view(heads, dim), want, rtol=1e-4, atol=1e-4)

    # The first token alone, with the span of its own position: the same bits.
    alone = kernels.attention(
        qkv[:1], heads=heads, kv_heads=kv_heads, slot_of=slot_of[:1], pos_of=pos_of[:1], span=int(pos_of[0]) + 1,
        keys=pool_keys, values=pool_values, table=table, scale=dim**-0.5, window=window,
    )  # fmt: skip
    assert torch.equal(alone[0], got[0])
    # One block for the whole slot (contiguous, as the slot buffers were): the same bits.
    one = torch.arange(slots)[:, None].contiguous()
    whole = _paged(_unpaged(pool_keys, table, capacity), one, capacity, slots)
    whole_values = _paged(_unpaged(pool_values, table, capacity), one, capacity, slots)
    contiguous = kernels.attention(
        qkv, heads=heads, kv_heads=kv_heads, slot_of=slot_of, pos_of=pos_of, span=span,
        keys=whole, values=whole_values, table=one, scale=dim**-0.5, window=window,
    )  # fmt: skip
    assert torch.equal(contiguous, got)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_attention_is_the_same_bits_whatever_is_computed_with_it(kernels, data) -> None:
    """A token's attention is computed by the same float operations whatever else the
    pass holds: the positions of a slot in one call (a verify pass, a prefill: the queries
    of a slot and kv head are computed together) beside other slots' tokens give each
    token the bits it gets alone, on AVX-512 and AVX2, on 1 or 2 threads; GQA groups of
    1, 3 and 4, heads of 8 to 136 (a tail past the 16-lane sums), sliding windows, blocks
    scattered over the pool; float16 pools give the bits of float32 pools holding the same
    values (the conversion is exact); and torch's attention to float32 rounding."""
    kv_heads = data.draw(st.integers(1, 3), label="kv_heads")
    group = data.draw(st.sampled_from([1, 3, 4]), label="group")
    heads = kv_heads * group
    dim = 8 * data.draw(st.sampled_from([1, 3, 8, 17]), label="dim / 8")
    window = data.draw(st.sampled_from([0, 1, 5, 13]), label="window")
    block = data.draw(st.sampled_from([1, 3, 8, 32]), label="block tokens")
    kv_dtype = data.draw(st.sampled_from([torch.float32, torch.float16]), label="pool dtype")
    slots, capacity = 3, 64
    runs = data.draw(st.lists(st.integers(0, 20), min_size=slots, max_size=slots), label="run lengths")
    starts = [data.draw(st.integers(0, capacity - 20), label=f"run start {s}") for s in range(slots)]
    order = data.draw(st.permutations(range(slots)), label="slot order")
    slot_of = torch.tensor([s for s in order for _ in range(runs[s])], dtype=torch.long)
    pos_of = torch.tensor([starts[s] + j for s in order for j in range(runs[s])], dtype=torch.long)
    tokens = slot_of.numel()
    if tokens == 0:
        return
    generator = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16), label="seed"))
    per_slot = -(-capacity // block)
    pool_blocks = slots * per_slot + 1
    table = (
        torch.randperm(pool_blocks, generator=generator)[: slots * per_slot]
        .view(slots, per_slot)
        .contiguous()
    )
    keys = torch.randn(kv_heads, pool_blocks, block, dim, generator=generator).to(kv_dtype)
    values = torch.randn(kv_heads, pool_blocks, block, dim, generator=generator).to(kv_dtype)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=generator) * 3

    def attend(rows: slice, pools: tuple[torch.Tensor, torch.Tensor] = (keys, values)) -> torch.Tensor:
        return kernels.attention(
            qkv[rows], heads=heads, kv_heads=kv_heads, slot_of=slot_of[rows], pos_of=pos_of[rows],
            span=capacity, keys=pools[0], values=pools[1], table=table, scale=dim**-0.5, window=window,
        )  # fmt: skip

    got = attend(slice(None))
    assert torch.equal(attend(slice(None), (keys.float(), values.float())), got), "the same values in float32"
    for t in range(tokens):
        assert torch.equal(attend(slice(t, t + 1))[0], got[t]), f"token {t} alone"
    threads = torch.get_num_threads()
    try:
        kernels.use_avx512(False)
        assert torch.equal(attend(slice(None)), got), "AVX2"
        torch.set_num_threads(1)
        assert torch.equal(attend(slice(None)), got), "AVX2, one thread"
        kernels.use_avx512(True)
        assert torch.equal(attend(slice(None)), got), "one thread"
    finally:
        kernels.use_avx512(True)
        torch.set_num_threads(threads)

    unpaged = [
        _unpaged(pool.float(), table, capacity) for pool in (keys, values)
    ]  # [slots, kv_heads, capacity, dim]
    queries = qkv[:, : heads * dim].view(tokens, heads, dim)
    for t in range(tokens):
        s, p = int(slot_of[t]), int(pos_of[t])
        lo = max(0, p + 1 - window) if window else 0
        k, v = (u[s, :, lo : p + 1].repeat_interleave(group, dim=0) for u in unpaged)
        want = F.scaled_dot_product_attention(queries[t][:, None], k, v, scale=dim**-0.5)[:, 0]
        torch.testing.assert_close(got[t].view(heads, dim), want, rtol=1e-4, atol=1e-4)


def _paged(slotted: torch.Tensor, table: torch.Tensor, block: int, blocks: int) -> torch.Tensor:
    """``slotted [slots, kv_heads, capacity, dim]`` laid out as a pool ``[kv_heads, blocks,
    block, dim]`` where ``table[slot, i]`` holds positions ``i * block...`` of ``slot``
    (zeros past the capacity and in blocks no slot uses)."""
    slots, kv_heads, _, dim = slotted.shape
    pool = torch.zeros(kv_heads, blocks, block, dim)
    for s in range(slots):
        for i, b in enumerate(table[s].tolist()):
            part = slotted[s, :, i * block : (i + 1) * block]
            pool[:, b, : part.shape[1]] = part
    return pool


def _unpaged(pool: torch.Tensor, table: torch.Tensor, capacity: int) -> torch.Tensor:
    """The pool's blocks back in slot order: ``[slots, kv_heads, capacity, dim]``."""
    slots = table.shape[0]
    rows = pool[:, table].transpose(0, 1).reshape(slots, pool.shape[0], -1, pool.shape[3])
    return rows[:, :, :capacity]


def test_a_block_table_that_misses_a_position_is_refused(kernels) -> None:
    """A table entry missing (-1) or outside the pool below a token's position: a
    ValueError, nothing written."""
    keys, values = torch.zeros(1, 4, 8, 8), torch.zeros(1, 4, 8, 8)
    qkv = torch.ones(1, 3 * 8)
    cos, sin = torch.ones(1, 0), torch.zeros(1, 0)
    pos = torch.tensor([9])  # the second block
    for bad in ([0, -1], [0, 4], [-1, 1]):
        table = torch.tensor([bad])
        with pytest.raises(ValueError, match="block table"):
            kernels.rope_store(
                qkv, heads=1, kv_heads=1, cos=cos, sin=sin, slot_of=torch.tensor([0]), pos_of=pos,
                keys=keys, values=values, table=table, layout=RopeLayout(rotate=False),
            )  # fmt: skip
        with pytest.raises(ValueError, match="block table"):
            kernels.attention(
                qkv, heads=1, kv_heads=1, slot_of=torch.tensor([0]), pos_of=pos, span=10,
                keys=keys, values=values, table=table, scale=1.0,
            )  # fmt: skip
    assert not keys.any() and not values.any()


@settings(max_examples=40, deadline=None)
@given(
    vocab=st.integers(1, 700),  # partial vectors and chunks at the end
    masked=st.floats(0.0, 0.9),
    temperature=st.sampled_from([0.0, 0.2, 1.0, 7.0]),
    draw=st.floats(0.0, 0.999999),
    seed=st.integers(0, 2**16),
)
def test_sample_inverts_the_softmax_cdf(kernels, vocab, masked, temperature, draw, seed) -> None:
    """The picked token's slice of the cumulative softmax (torch, float64) holds the draw,
    to float32 rounding; masked tokens are never picked; temperature 0 is the argmax."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, vocab, generator=generator) * 4
    logits[torch.rand(2, vocab, generator=generator) < masked] = float("-inf")
    logits[:, int(torch.randint(vocab, (1,), generator=generator))] = 1.0  # one token always allowed
    inverse = 0.0 if temperature == 0 else 1 / temperature
    picks = kernels.sample(logits, [inverse, inverse], [draw, draw])
    for row, pick in enumerate(picks):
        assert logits[row, pick] != float("-inf")
        if temperature == 0:
            assert pick == int(logits[row].argmax())
            continue
        probs = torch.softmax(logits[row].double() / temperature, -1)
        cdf = torch.cumsum(probs, 0)
        before = float(cdf[pick - 1]) if pick else 0.0
        assert before - 1e-5 <= draw <= float(cdf[pick]) + 1e-5


def test_sample_names_a_row_with_nothing_allowed(kernels) -> None:
    logits = torch.zeros(3, 100)
    logits[1] = float("-inf")
    assert kernels.sample(logits, [1.0, 1.0, 0.0], [0.5, 0.5, 0.0]) == [50, -1, 0]  # uniform: the middle


@settings(max_examples=40, deadline=None)
@given(
    vocab=st.integers(1, 300),
    words=st.integers(1, 10),  # fewer words than the vocabulary needs: the rest disallowed
    rows=st.sets(st.integers(0, 3)),
    seed=st.integers(0, 2**16),
)
def test_apply_bitmask_matches_the_grammar_layers(kernels, vocab, words, rows, seed) -> None:
    from thinkstruct.grammar.runtime.bitmask import apply_bitmask_inplace

    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(4, vocab, generator=generator)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (4, words), generator=generator, dtype=torch.int32)
    bitmask[0] = 0  # nothing allowed
    bitmask[1, ::2] = -1  # every token of a word allowed
    listed = sorted(rows)
    want = logits.clone()
    if listed:
        apply_bitmask_inplace(want, bitmask[listed], indices=listed)
    kernels.apply_bitmask(logits, bitmask, listed)
    assert torch.equal(logits, want)


def test_a_killed_build_leaves_nothing_half_written(tmp_path, monkeypatch) -> None:
    """The library is compiled under a temporary name and renamed: a build that fails
    leaves no library (and no partial file) behind, and the next call builds again.
    The build is of a one-function C file with the library's own flags: the kernels' own
    source takes about 29 CPU-s to build on a quiet 2-core EPYC, and the ``kernels``
    fixture builds it (once per cache)."""
    source = tmp_path / "one.c"
    source.write_text("int one(void) { return 1; }\n")
    cache = tmp_path / "cache"
    monkeypatch.setenv("THINKSTRUCT_CACHE", str(cache))
    monkeypatch.setattr(module, "SOURCE", source)
    monkeypatch.setattr(module, "INCLUDED", ())
    monkeypatch.setattr(module, "FLAGS", (*module.FLAGS, "-include", "/nonexistent.h"))
    with pytest.raises(Exception):  # noqa: B017 - whatever the compiler's failure is
        module._built_library()
    assert list((cache / "kernels").iterdir()) == []
    monkeypatch.setattr(module, "FLAGS", module.FLAGS[:-2])
    built = module._built_library()
    assert built.parent == cache / "kernels" and built.suffix == ".so"
    assert ctypes.CDLL(str(built)).one() == 1
    assert [p.name for p in built.parent.iterdir()] == [built.name]


def test_the_switch_turns_them_off(monkeypatch) -> None:
    monkeypatch.setenv(module.DISABLE_ENV, "0")
    assert unavailable_reason() == f"{module.DISABLE_ENV}=0"


def test_the_stacked_pass_refuses_sizes_it_cannot_take(kernels) -> None:
    """Hidden 24 (the o and down projections' outputs are not multiples of 16): an error
    naming the sizes, nothing computed."""
    from thinkstruct.engine.kernels.cpu_kernels import LayerPointers, Pages

    h = torch.ones(2, 24)
    cos = torch.zeros(2, 8)
    positions = torch.arange(2)
    pages = Pages(torch.zeros(1, 1, dtype=torch.long), block_tokens=8, num_blocks=1, dtype=torch.float32)
    with pytest.raises(ValueError, match="hidden 24"):
        kernels.decoder_layers(
            h, (LayerPointers * 1)(), heads=2, kv_heads=1, dim=16, inter=32, rot_half=8, cos=cos, sin=cos,
            slot_of=torch.zeros(2, dtype=torch.long), pos_of=positions, pages=pages, span=2,
        )  # fmt: skip
    assert torch.equal(h, torch.ones(2, 24))
    with pytest.raises(ValueError, match="cos/sin"):
        kernels.decoder_layers(
            h, (LayerPointers * 1)(), heads=2, kv_heads=1, dim=16, inter=32, rot_half=4, cos=cos, sin=cos,
            slot_of=torch.zeros(2, dtype=torch.long), pos_of=positions, pages=pages, span=2,
        )  # fmt: skip
    # Sizes it takes, a block table whose entry lies outside the pool: refused before any layer.
    h = torch.ones(2, 32)
    outside = Pages(
        torch.full((1, 1), 5, dtype=torch.long), block_tokens=8, num_blocks=1, dtype=torch.float32
    )
    with pytest.raises(ValueError, match="block table"):
        kernels.decoder_layers(
            h, (LayerPointers * 1)(), heads=2, kv_heads=1, dim=16, inter=32, rot_half=8, cos=cos, sin=cos,
            slot_of=torch.zeros(2, dtype=torch.long), pos_of=positions, pages=outside, span=2,
        )  # fmt: skip
    assert torch.equal(h, torch.ones(2, 32))


def test_a_key_past_float16s_range_is_stored_as_its_largest_value(kernels) -> None:
    """Keys and values beyond float16's range saturate at +-65504 when a float16 pool
    stores them (rounding would give infinities, and attention NaN); a NaN stays NaN."""
    kv_heads, heads, dim = 1, 1, 16
    qkv = torch.zeros(2, (heads + 2 * kv_heads) * dim)
    qkv[0, dim:] = torch.tensor([1e6, -1e6, 7e4, -7e4, 65504.0, 3.0, float("nan")] + [0.5] * 25)
    qkv[1, dim:] = 1.0
    table = torch.tensor([[0]])
    keys, values = (torch.zeros(kv_heads, 1, 4, dim, dtype=torch.float16) for _ in range(2))
    pos = torch.tensor([0, 1])
    no_rotary = torch.zeros(2, 0)
    kernels.rope_store(
        qkv, heads=heads, kv_heads=kv_heads, cos=no_rotary, sin=no_rotary, slot_of=torch.tensor([0, 0]),
        pos_of=pos, keys=keys, values=values, table=table, layout=RopeLayout(rotate=False),
    )  # fmt: skip
    stored = keys[0, 0, 0].float()
    assert stored[:6].tolist() == [65504.0, -65504.0, 65504.0, -65504.0, 65504.0, 3.0]
    assert stored[6].isnan()
    assert values[0, 0, 0].float().tolist() == [0.5] * dim
    assert torch.equal(keys[0, 0, 1].float(), torch.ones(dim))


def test_the_single_kernels_refuse_what_they_cannot_take(kernels) -> None:
    """rms_norm and w8_linear check sizes, dtypes and layouts on both sides (Python names
    the argument; the C entry points return a status the wrapper raises)."""
    with pytest.raises(ValueError, match="multiple of 8"):
        kernels.rms_norm(torch.ones(2, 12), torch.ones(12), 1e-6)
    with pytest.raises(ValueError, match="weight must be contiguous float32 \\[16\\]"):
        kernels.rms_norm(torch.ones(2, 16), torch.ones(8), 1e-6)
    with pytest.raises(ValueError, match="x must be 2-D float32"):
        kernels.rms_norm(torch.ones(2, 16, dtype=torch.float64), torch.ones(16), 1e-6)
    x = torch.ones(3, 32)
    scale = torch.ones(16)
    with pytest.raises(ValueError, match="packed must be contiguous int8"):
        kernels.w8_linear(x, torch.zeros(1, 24, 16, dtype=torch.int8), scale)
    with pytest.raises(ValueError, match="multiple of 16"):
        kernels.w8_linear(x, torch.zeros(0, 32, 16, dtype=torch.int8), torch.ones(8))
    with pytest.raises(ValueError, match="bias must be contiguous float32 \\[16\\]"):
        kernels.w8_linear(x, torch.zeros(1, 32, 16, dtype=torch.int8), scale, torch.ones(4))
    out = kernels.w8_linear(x, torch.ones(1, 32, 16, dtype=torch.int8), scale)
    assert torch.equal(out, torch.full((3, 16), 32.0))  # each output: 32 inputs of 1 x weight 1
