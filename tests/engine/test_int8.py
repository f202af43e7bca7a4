"""int8 quantization: smoothing keeps the float function, shrinks input outliers, and the
quantized layers are the ones left without outliers."""

from __future__ import annotations

import copy

import torch

from thinkstruct.engine.weights.int8 import _input_statistics, _smooth, quantize_int8, smoothings


def _logits(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()


def _with_massive_activation(tiny_model) -> torch.nn.Module:
    """The tiny model with one channel of each MLP input norm 2,000x larger: the kind of
    channel that dominates a small Llama's down_proj inputs."""
    model = copy.deepcopy(tiny_model.model)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.post_attention_layernorm.weight[7] *= 2000.0
    return model


def _mlp_output(model, ids: list[int]) -> torch.Tensor:
    seen: list[torch.Tensor] = []
    hook = model.model.layers[0].mlp.register_forward_hook(lambda _m, _a, out: seen.append(out.detach()))
    try:
        _logits(model, ids)
    finally:
        hook.remove()
    return seen[0].float()


IDS = [5, 17, 300, 4000, 12, 99, 1000, 7, 8, 9, 2500, 31]


def test_smoothed_int8_is_closer_to_float_than_plain_int8(tiny_model, monkeypatch) -> None:
    """With every layer quantized, migrating the outlier channel into the weights first
    leaves the first MLP's output (which reads the outlier channel) nearer the float
    model's."""
    import thinkstruct.engine.weights.int8 as int8

    monkeypatch.setattr(int8, "OUTLIER_RATIO", float("inf"))  # quantize every layer
    float_model = _with_massive_activation(tiny_model)
    expected = _mlp_output(float_model, IDS)
    errors = {}
    for smooth in (False, True):
        model = copy.deepcopy(float_model)
        result = quantize_int8(model, IDS, smooth=smooth)
        assert result.float_modules == () and result.smoothed == (12 if smooth else 0)
        errors[smooth] = float((_mlp_output(model, IDS) - expected).norm() / expected.norm())
    assert errors[True] < 0.7 * errors[False], errors


def test_smoothing_alone_is_exact_in_float(tiny_model) -> None:
    model = _with_massive_activation(tiny_model)
    before = _logits(model, IDS)
    pairs = smoothings(model)
    # per layer: norm -> q/k/v, norm -> gate/up, up_proj -> down_proj
    assert [len(p.layers) for p in pairs] == [3, 2, 1] * 2
    stats = _input_statistics(model, IDS, [layer for p in pairs for layer in p.layers])
    for pair in pairs:
        _smooth(pair, [stats[id(layer)].channel_max for layer in pair.layers])
    torch.testing.assert_close(_logits(model, IDS), before, rtol=1e-4, atol=1e-4)
    gate = model.model.layers[0].mlp.gate_proj
    assert _input_statistics(model, IDS, [gate])[id(gate)].outlier_ratio < 100


def test_without_smoothing_the_outlier_layers_stay_float(tiny_model) -> None:
    model = _with_massive_activation(tiny_model)
    result = quantize_int8(model, IDS, smooth=False)
    assert result.smoothed == 0
    assert {"model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"} <= set(result.float_modules)
    assert type(model.model.layers[0].mlp.gate_proj) is torch.nn.Linear
    assert type(model.model.layers[0].self_attn.q_proj) is not torch.nn.Linear
