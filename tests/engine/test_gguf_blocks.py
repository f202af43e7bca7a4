"""GGUF blocks on the compiled kernels (``gguf_blocks.c``) against the ``gguf`` package.

The packed blocks must hold exactly the weights ``gguf.quants`` dequantizes from the same
bytes; the multiply must be that float32 matrix's product with the activations rounded to
int16 per block of 32, up to summation order; and a
row's result must not depend on the other rows of the call or on the AVX2 / AVX-512 path,
bit for bit (a seeded request's tokens would otherwise change with its batch).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize, quantize
from hypothesis import given, settings
from hypothesis import strategies as st

from thinkstruct.engine.kernels.cpu_kernels import GGUF_FORMATS, CpuKernels, cpu_kernels, unavailable_reason
from thinkstruct.engine.weights.gguf_weights import (
    Q4_K_BYTES,
    Q6_K_BYTES,
    GGUFLinear,
    pack_blocks,
    q4_k_blocks,
)

FORMATS = sorted(GGUF_FORMATS)
#: Formats whose weights are d q + m (a float m a block).
WITH_MINS = ("Q4_1", "Q5_1", "Q4_K")


def unit(fmt: str) -> int:
    """Weights of one of the file's blocks (K formats: a super-block of 256)."""
    return 256 if fmt.endswith("_K") else 32


@pytest.fixture(scope="module")
def kernels() -> CpuKernels:
    built = cpu_kernels()
    assert built is not None, unavailable_reason()
    return built


def _blocks(fmt: str, rows: int, inputs: int, seed: int) -> tuple[np.ndarray, torch.Tensor]:
    """Random weights quantized by the ``gguf`` package to ``fmt`` (K formats, which it does
    not quantize: random super-blocks, every byte pattern a valid one but for the float16
    fields, set to scales): the file's bytes ``[rows, row bytes]`` and what
    ``gguf.quants`` dequantizes them to."""
    generator = np.random.default_rng(seed)
    if fmt == "Q4_K":
        raw = generator.integers(0, 256, (rows, inputs // 256, Q4_K_BYTES), dtype=np.uint8)
        scales = generator.uniform(1e-3, 2e-2, (rows, inputs // 256, 2)).astype(np.float16)  # d, dmin
        raw[..., :4] = scales.view(np.uint8).reshape(rows, inputs // 256, 4)
        raw = raw.reshape(rows, -1)
    elif fmt == "Q6_K":
        raw = generator.integers(0, 256, (rows, inputs // 256, Q6_K_BYTES), dtype=np.uint8)
        d = generator.uniform(1e-4, 2e-3, (rows, inputs // 256, 1)).astype(np.float16)  # d, last
        raw[..., 208:] = d.view(np.uint8).reshape(rows, inputs // 256, 2)
        raw = raw.reshape(rows, -1)
    else:
        weights = generator.standard_normal((rows, inputs)).astype(np.float32)
        weights += generator.standard_normal((rows, 1)).astype(np.float32)  # rows with an offset (Q4_1's m)
        raw = quantize(weights, GGMLQuantizationType[fmt])
    return raw, torch.from_numpy(dequantize(raw, GGMLQuantizationType[fmt]).astype(np.float32))


@pytest.mark.parametrize("fmt", FORMATS)
def test_packed_blocks_hold_what_gguf_dequantizes(kernels, fmt: str) -> None:
    inputs = 3 * unit(fmt)
    raw, reference = _blocks(fmt, 48, inputs, seed=1)
    packed = pack_blocks(fmt, raw)
    if fmt == "Q4_K":  # regrouped: 22 bytes a block of 32 where the file has 18
        assert packed.numel() == raw.size * 22 // 18
    elif fmt == "Q6_K":  # regrouped: 28 bytes a block of 32 where the file has 26.25
        assert packed.numel() == raw.size * 28 * 8 // Q6_K_BYTES
    else:  # the file's bytes, reordered (Q5's fifth bits regrouped too)
        assert packed.numel() == raw.size
    assert torch.equal(kernels.gguf_dequantize(fmt, packed, 48, inputs), reference)


def _quantized_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What the kernels multiply for float32 ``x [M, K]``: each block of 32 rounded to int16
    against its largest magnitude (``gq_quantize``), as values ``dx * xq``, and the
    blocks' float sums ``[M, K / 32]``."""
    blocks = x.reshape(x.shape[0], -1, 32)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, torch.tensor(32767.0) / amax, torch.zeros_like(amax))
    xq = (blocks * scale).round()  # ties to even, as the kernels' conversion
    return (xq.double() * (amax / 32767).double()).reshape(x.shape), blocks.sum(dim=-1)


def _mins(fmt: str, raw: np.ndarray, rows: int, inputs: int) -> torch.Tensor:
    """Q4_1 and Q5_1 blocks' m ``[rows, inputs / 32]`` (float16 after d), or
    Q4_K's (-dmin times a sub-block's 6-bit min)."""
    if fmt == "Q4_K":  # -dmin mn, from the regrouped blocks: f16 dmin at 2, the byte mn at 5
        blocks = q4_k_blocks(raw).reshape(rows, inputs // 32, 22)
        dmin = blocks[..., 2:4].copy().view(np.float16).astype(np.float32)[..., 0]
        return torch.from_numpy(-(dmin * blocks[..., 5].astype(np.float32)))
    block = 24 if fmt == "Q5_1" else 20
    fields = np.ascontiguousarray(raw).reshape(rows, inputs // 32, block)[..., 2:4].copy()
    return torch.from_numpy(fields.view(np.float16).reshape(rows, inputs // 32).astype(np.float32))


@settings(max_examples=40, deadline=None)
@given(
    fmt=st.sampled_from(FORMATS),
    rows=st.integers(1, 40),
    groups=st.integers(1, 9),
    blocks=st.integers(1, 6),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_multiply_matches_the_dequantized_weights(kernels, fmt, rows, groups, blocks, bias, seed) -> None:
    """Any number of rows (the 1-2 row wide tiles, 2- and 8-row tiles and their
    remainders) and of 16-output groups (whole and partial runs of four): the dequantized
    weights times the activations as rounded to int16 a block, Q4_1's m times the exact
    float sums of the blocks."""
    outputs, inputs = 16 * groups, unit(fmt) * blocks
    raw, weight = _blocks(fmt, outputs, inputs, seed)
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, inputs, generator=generator) * 3
    b = torch.randn(outputs, generator=generator) if bias else None
    got = kernels.gguf_linear(x, fmt, pack_blocks(fmt, raw), outputs, b)
    xr, sums = _quantized_activations(x)
    expected = xr.double() @ weight.double().T + (0 if b is None else b.double())
    bound = 1e-5 * (xr.double().abs() @ weight.double().abs().T) + 1e-5
    scaled = weight.double()  # what multiplies the rounded activations: d q (Q4_1: w - m)
    if fmt in WITH_MINS:  # m times the exact block sums, where the rounded activations had it
        mins = _mins(fmt, raw, outputs, inputs).double()
        expected += (sums.double() - xr.double().reshape(rows, -1, 32).sum(-1)) @ mins.T
        bound += 1e-5 * (sums.double().abs() @ mins.abs().T)
        scaled = scaled - mins.repeat_interleave(32, dim=1)
    # Float32 summation in another order: bounded by a few ulps of sum |x| |w| per output.
    assert bool(((got.double() - expected).abs() <= bound).all())
    # And within the activations' rounding of the float32 product: half a step a block.
    exact = x.double() @ weight.double().T + (0 if b is None else b.double())
    step = (x.abs().reshape(rows, -1, 32).amax(-1) / 32767).double()
    limit = 0.5 * step @ scaled.abs().reshape(outputs, -1, 32).sum(-1).T * 1.001 + 1e-4
    assert bool(((got.double() - exact).abs() <= limit + bound).all())


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_row_gets_the_same_bits_in_any_batch_and_on_both_paths(kernels, fmt: str) -> None:
    raw, _ = _blocks(fmt, 16 * 7, unit(fmt) * 5, seed=3)
    packed = pack_blocks(fmt, raw)
    x = torch.randn(41, unit(fmt) * 5, generator=torch.Generator().manual_seed(4))
    bias = torch.randn(112, generator=torch.Generator().manual_seed(5))
    alone = torch.cat([kernels.gguf_linear(x[i : i + 1], fmt, packed, 112, bias) for i in range(41)])
    # 1-2 rows: four groups side by side; more: two, 8 rows at a time, then 4, then the rest.
    for width in (2, 3, 4, 8, 9, 21, 33, 41):
        batched = torch.cat(
            [kernels.gguf_linear(x[i : i + width], fmt, packed, 112, bias) for i in range(0, 41, width)]
        )
        assert torch.equal(batched, alone), width
    try:
        kernels.use_avx512(False)
        assert torch.equal(kernels.gguf_linear(x, fmt, packed, 112, bias), alone)
        assert torch.equal(kernels.gguf_linear(x[:1], fmt, packed, 112, bias), alone[:1])
    finally:
        kernels.use_avx512(True)


@pytest.mark.parametrize("fmt", FORMATS)
def test_blocks_of_zeros_and_of_one_outlier_round_as_they_should(kernels, fmt: str) -> None:
    """A block of zero activations (no scale to divide by) contributes nothing; a block
    whose one large value sets the scale still carries its small ones to 1/65534 of it."""
    inputs = 3 * unit(fmt)
    raw, weight = _blocks(fmt, 32, inputs, seed=7)
    x = torch.randn(2, inputs, generator=torch.Generator().manual_seed(8))
    x[0, :32] = 0
    x[1, 40] = 1e4
    got = kernels.gguf_linear(x, fmt, pack_blocks(fmt, raw), 32)
    assert bool(torch.isfinite(got).all())
    exact = x.double() @ weight.double().T
    step = (x.abs().reshape(2, -1, 32).amax(-1) / 32767).double()
    scaled = weight.double().abs()
    if fmt in WITH_MINS:
        scaled = (weight.double() - _mins(fmt, raw, 32, inputs).double().repeat_interleave(32, dim=1)).abs()
    limit = 0.5 * step @ scaled.reshape(32, -1, 32).sum(-1).T + 1e-5 * (
        x.double().abs() @ weight.double().abs().T
    )
    assert bool(((got.double() - exact).abs() <= limit * 1.01 + 1e-4).all())


def _layer(kernels, fmt: str, outputs: int, inputs: int, seed: int, bias: bool = False) -> GGUFLinear:
    raw, _ = _blocks(fmt, outputs, inputs, seed)
    b = torch.randn(outputs, generator=torch.Generator().manual_seed(seed)) if bias else None
    return GGUFLinear(
        fmt, pack_blocks(fmt, raw), out_features=outputs, in_features=inputs, kernels=kernels, bias=b
    )


def test_stacked_layers_compute_their_parts(kernels) -> None:
    parts = [_layer(kernels, "Q4_1", outputs, 256, seed) for seed, outputs in enumerate((64, 32, 32))]
    x = torch.randn(3, 256)
    stacked = GGUFLinear.stacked(parts)
    assert stacked.tail is None
    assert torch.equal(stacked(x), torch.cat([p(x) for p in parts], dim=-1))
    # Two runs of formats (q and k Q4_K, v Q6_K, as in a Q4_K_M file), biases: the second
    # run is the tail; the same bits as the parts, the weights theirs.
    mixed = [
        _layer(kernels, "Q4_K", 64, 256, 1, bias=True),
        _layer(kernels, "Q4_K", 32, 256, 2),
        _layer(kernels, "Q6_K", 32, 256, 3, bias=True),
    ]
    two = GGUFLinear.stacked(mixed)
    assert two.fmt == "Q4_K" and two.tail is not None and two.tail.fmt == "Q6_K" and two.head_rows == 96
    assert torch.equal(two(x), torch.cat([p(x) for p in mixed], dim=-1))
    assert torch.equal(two.dequantized(), torch.cat([p.dequantized() for p in mixed]))
    with pytest.raises(ValueError, match="at most two runs"):
        GGUFLinear.stacked([mixed[0], mixed[2], _layer(kernels, "Q4_K", 16, 256, 4)])
    with pytest.raises(ValueError, match="share their input size"):
        GGUFLinear.stacked([parts[0], _layer(kernels, "Q8_0", 16, 64, 9)])


def test_sizes_and_formats_it_cannot_take_are_refused(kernels) -> None:
    raw, _ = _blocks("Q4_0", 32, 64, seed=0)
    packed = pack_blocks("Q4_0", raw)
    x = torch.randn(2, 64)
    with pytest.raises(ValueError, match="not Q5_K"):
        kernels.gguf_linear(x, "Q5_K", packed, 32)
    with pytest.raises(ValueError, match="a multiple of 16"):
        kernels.gguf_linear(x, "Q4_0", packed, 24)
    with pytest.raises(ValueError, match="is 1280 contiguous uint8"):
        kernels.gguf_linear(x, "Q4_1", packed, 32)  # Q4_1 blocks are longer
    with pytest.raises(ValueError, match="of 32"):
        kernels.gguf_linear(torch.randn(2, 48), "Q4_0", packed, 32)
