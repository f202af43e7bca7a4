"""int8 weights, float32 activations: each layer computes ``x @ (q * scale).T`` exactly (to float32 rounding),
on the compiled kernels and on torch's fallback alike, the rounding is the nearest int8
step of each row, a row's result does not depend on the rows beside it, and a quantized
model stays close to its float self."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from thinkstruct.engine.kernels.cpu_kernels import cpu_kernels
from thinkstruct.engine.weights.int8_weights import BLOCK, Int8Linear, quantize_int8_weights

PATHS = pytest.mark.parametrize("compiled", [True, False], ids=["kernels", "torch"])


def _kernels(compiled: bool):
    if not compiled:
        return None
    kernels = cpu_kernels()
    assert kernels is not None  # this project's machines build them (test_cpu_kernels)
    return kernels


@PATHS
@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 30),  # both of the kernel's tilings: up to 8 rows, and more
    inner=st.integers(1, 200),
    blocks=st.integers(1, 12),  # up to 6 a thread: blocks side by side and one by one
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_a_layer_multiplies_by_its_dequantized_weight(compiled, rows, inner, blocks, bias, seed) -> None:
    """(Plus its float bias, where it has one: Qwen2's q/k/v projections do.)"""
    generator = torch.Generator().manual_seed(seed)
    linear = torch.nn.Linear(inner, blocks * BLOCK, bias=bias)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(linear.weight.shape, generator=generator))
        linear.weight[0] *= 1000  # a row's scale is its own
    layer = Int8Linear.from_linear(linear, kernels=_kernels(compiled))
    weight = layer.dequantized()
    step = layer.scale[:, None]
    assert bool(
        ((weight - linear.weight).abs() <= step * (0.5 + 1e-4)).all()
    )  # nearest step, to float32 rounding
    x = torch.randn(2, rows, inner, generator=generator)
    want = x @ weight.T + (linear.bias.detach() if bias else 0.0)
    torch.testing.assert_close(layer(x), want, rtol=1e-5, atol=1e-4 * float(weight.abs().max()))


@PATHS
def test_a_rows_result_is_the_same_bits_whatever_rows_are_beside_it(compiled) -> None:
    generator = torch.Generator().manual_seed(3)
    # 10 blocks of 16 outputs with a bias: up to 16 rows run four blocks side by side, in
    # tiles of up to 6 rows (the last two blocks one by one), more rows stream.
    linear = torch.nn.Linear(96, 160, bias=True)
    layer = Int8Linear.from_linear(linear, kernels=_kernels(compiled))
    x = torch.randn(20, 96, generator=generator)
    alone = layer(x[5:6])
    for rows in (*range(2, 17), 20):  # every tiling
        start = max(0, 6 - rows)
        assert torch.equal(layer(x[start : start + rows])[5 - start], alone[0]), rows


@settings(max_examples=20, deadline=None)
@given(rows=st.integers(1, 40), inner=st.integers(1, 300), seed=st.integers(0, 2**16))
def test_the_avx512_and_avx2_tiles_give_the_same_bits(rows, inner, seed) -> None:
    """Where the CPU has AVX-512 the multiply runs 8-row tiles on it (the flags in
    /proc/cpuinfo say whether it must); the AVX2 tiles compute the same bits."""
    from thinkstruct.engine.kernels.cpu_kernels import _cpu_flags

    kernels = _kernels(True)
    generator = torch.Generator().manual_seed(seed)
    linear = torch.nn.Linear(inner, 11 * BLOCK, bias=True)  # blocks side by side and one by one
    with torch.no_grad():
        linear.weight.copy_(torch.randn(linear.weight.shape, generator=generator))
    layer = Int8Linear.from_linear(linear, kernels=kernels)
    x = torch.randn(rows, inner, generator=generator)
    try:
        assert kernels.use_avx512(True) == ({"avx512f", "avx512bw", "avx512vl"} <= _cpu_flags())
        wide = layer(x)
        kernels.use_avx512(False)
        assert torch.equal(layer(x), wide)
    finally:
        kernels.use_avx512(True)


def test_stacked_layers_compute_their_parts_side_by_side() -> None:
    parts = [
        Int8Linear.from_linear(torch.nn.Linear(48, n, bias=False), kernels=cpu_kernels())
        for n in (32, 16, 16)
    ]
    x = torch.randn(4, 48)
    torch.testing.assert_close(Int8Linear.stacked(parts)(x), torch.cat([p(x) for p in parts], dim=-1))
    other = Int8Linear.from_linear(torch.nn.Linear(40, 16, bias=False), kernels=cpu_kernels())
    with pytest.raises(ValueError, match="input size"):
        Int8Linear.stacked([parts[0], other])


@PATHS
def test_a_quantized_model_stays_close_to_its_float_self(tiny_model, compiled) -> None:
    model = copy.deepcopy(tiny_model.model)
    result = quantize_int8_weights(model, compiled=compiled)
    assert result.compiled is compiled and result.kept_float == ()
    assert len(result.quantized) == 2 * 7 + 1 and "lm_head" in result.quantized
    assert all(type(m) is not torch.nn.Linear for m in model.modules())
    ids = torch.tensor([[5, 17, 300, 4000, 12, 99, 1000, 7, 8, 9, 2500, 31]])
    with torch.inference_mode():
        want = tiny_model.model(input_ids=ids, use_cache=False).logits[0]
        got = model(input_ids=ids, use_cache=False).logits[0]
    assert float((got - want).norm() / want.norm()) < 0.02
    assert float((got.argmax(-1) == want.argmax(-1)).float().mean()) >= 0.9


def test_layers_int8_cannot_pack_stay_float() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 16, bias=True), torch.nn.Linear(16, 24, bias=False))
    result = quantize_int8_weights(model)
    assert result.quantized == ("0",) and result.kept_float == ("1",)  # a bias is kept, 24 rows are not 16s
    with pytest.raises(ValueError, match="multiple of 16"):
        Int8Linear(torch.zeros(24, 16, dtype=torch.int8), torch.ones(24), kernels=None)
