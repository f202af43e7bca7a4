"""int8 weights for CPU decoding: :func:`quantize_int8`.

torch's dynamic int8 (``quantize_dynamic``) stores each ``nn.Linear`` weight as int8 with
one scale per output row and quantizes each input on the fly with one scale per tensor.
Decoding reads every weight once per step, so a quarter of the bytes is most of the
speed. One scale per input tensor is also its weakness: a layer whose input has a few
huge channels (the "massive activations" of small Llamas, fed to ``down_proj``) loses
everything else below one quantization step.

Two things keep quality:

1. **Smoothing** (SmoothQuant): a Linear whose input comes straight from a
   per-channel scale the model already applies (an RMSNorm's weight, or the ``up_proj``
   output that multiplies into ``down_proj``'s input) gets its input channel ``j``
   divided by ``s_j = max|x_j|^a / max|W[:, j]|^(1-a)`` (``a`` =
   :data:`SMOOTHING_ALPHA`) and its weight column multiplied by it. The division folds
   into that earlier scale, so the float model computes exactly the same function; the
   input's outliers shrink and the weight absorbs them.
2. **Outlier layers stay float**: a Linear whose input peak is still more than
   :data:`OUTLIER_RATIO` times its mean magnitude after smoothing is not quantized.

Both are measured on one calibration forward of a short chat (about a second): the
smoothed layers' statistics after smoothing follow from their input's, divided by ``s``.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

#: Peak over mean input magnitude above which a Linear stays float32. Measured on
#: SmolLM2-135M (teacher-forced on 6 chat answers against float32): quantizing every
#: Linear without smoothing gives top-1 agreement 50 %, mean KL 1.53 (bf16: 97.6 %,
#: 0.001), the damage nearly all in the down_proj layers fed by massive activations
#: (peak/mean 17,000 in layer 11, 4,900 in layer 28); keeping the layers above 100 in
#: float32 gives 81 %, KL 0.22.
OUTLIER_RATIO = 100.0

#: SmoothQuant's migration strength: the share of an input channel's range moved into
#: the weight. Measured on SmolLM2-135M against float32, greedy with a KV cache (12 chat
#: prompts x 32 tokens: mean tokens before the first divergence) and teacher-forced (6
#: chat answers: top-1 agreement, mean KL): no smoothing, per-tensor weights (the
#: previous scheme) 6.2, 72.3 %, 0.32, 21 layers float; 0.4: 7.6, 77.3 %, 0.24, 9 float;
#: 0.5: 7.1, 75.9 %, 0.21, 8 float; 0.65: 6.3, 76.6 %, 0.27, 2 float.
SMOOTHING_ALPHA = 0.4

CALIBRATION_CHAT = [
    {"role": "system", "content": "You are a careful assistant. Answer briefly."},
    {
        "role": "user",
        "content": "Give a JSON object with a name, an age and two hobbies, then explain "
        "why the sky is blue in one sentence. Also: what is 17 * 23? def f(x): return x ** 2",
    },
    {
        "role": "assistant",
        "content": '{"name": "Ada", "age": 36, "hobbies": ["chess", "rowing"]} '
        "Sunlight scatters off air molecules, blue most of all. 17 * 23 = 391.",
    },
]


@dataclass(frozen=True)
class Smoothing:
    """Linear layers fed by one per-channel scale that the division can fold into.

    Attributes:
        scale: the weight that multiplies the layers' input channel-wise (an RMSNorm's
            ``weight``, ``[in]``) or a Linear whose output rows are those channels.
        layers: the Linear layers reading that input.
    """

    scale: Any
    layers: tuple[torch.nn.Linear, ...]


@dataclass(frozen=True)
class Int8Result:
    """What :func:`quantize_int8` did.

    Attributes:
        float_modules: Linear layers kept float32 (module names, in model order).
        smoothed: Linear layers whose input was smoothed.
        seconds: wall time.
    """

    float_modules: tuple[str, ...]
    smoothed: int
    seconds: float


def smoothings(model: torch.nn.Module) -> list[Smoothing]:
    """The foldable pairs of a decoder stack in the Llama layout (by module names:
    ``input_layernorm`` -> ``self_attn.{q,k,v}_proj``, ``post_attention_layernorm`` ->
    ``mlp.{gate,up}_proj``, ``mlp.up_proj`` -> ``mlp.down_proj``). Layers of other shapes
    get none, and are quantized (or kept float) as they are."""
    found: list[Smoothing] = []
    for module in model.modules():
        attn = getattr(module, "self_attn", None)
        mlp = getattr(module, "mlp", None)
        norm = getattr(module, "input_layernorm", None)
        if attn is not None and _is_norm(norm):
            layers = _linears(attn, ("q_proj", "k_proj", "v_proj"))
            if layers:
                found.append(Smoothing(norm, layers))
        norm = getattr(module, "post_attention_layernorm", None)
        if mlp is not None and _is_norm(norm):
            layers = _linears(mlp, ("gate_proj", "up_proj"))
            if layers:
                found.append(Smoothing(norm, layers))
        if mlp is not None:
            up = _linears(mlp, ("up_proj",))
            down = _linears(mlp, ("down_proj",))
            if up and down and up[0].bias is None:
                found.append(Smoothing(up[0], down))
    return found


def _is_norm(module: Any) -> bool:
    weight = getattr(module, "weight", None)
    return isinstance(weight, torch.Tensor) and weight.dim() == 1 and getattr(module, "bias", None) is None


def _linears(parent: Any, names: Sequence[str]) -> tuple[torch.nn.Linear, ...]:
    layers = tuple(getattr(parent, name, None) for name in names)
    if all(type(layer) is torch.nn.Linear for layer in layers):
        return layers  # type: ignore[return-value]
    return ()


def quantize_int8(model: torch.nn.Module, calibration_ids: list[int], *, smooth: bool = True) -> Int8Result:
    """Smooth, then apply torch's dynamic int8 (per-channel weights) to every ``nn.Linear``
    whose input has no outliers left, in place, from float32 weights.

    Args:
        model: a float32 causal LM taking ``input_ids``.
        calibration_ids: token ids of one calibration text (:data:`CALIBRATION_CHAT`
            rendered with the model's chat template).
        smooth: migrate input outliers into the weights first (see the module docstring).
    """
    started = time.perf_counter()
    pairs = smoothings(model) if smooth else []
    stats = _input_statistics(model, calibration_ids, _all_linears(model))
    for pair in pairs:
        s = _smooth(pair, [stats[id(layer)].channel_max for layer in pair.layers if id(layer) in stats])
        if s is not None:  # what these layers read from now on: the same input divided by s
            for layer in pair.layers:
                stats[id(layer)] = stats[id(layer)].divided(s)
    names = {id(module): name for name, module in model.named_modules()}
    kept = tuple(names[key] for key, s in stats.items() if s.outlier_ratio > OUTLIER_RATIO)
    with warnings.catch_warnings():
        # torch.ao's dynamic quantization is deprecated in favour of torchao, which is
        # not a dependency; it is the int8 CPU path that exists today.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*")
        warnings.filterwarnings("ignore", message=".*quantize_per_channel.*")
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        plan = {names[key]: per_channel_dynamic_qconfig for key in stats if names[key] not in kept}
        quantize_dynamic(model, plan, dtype=torch.qint8, inplace=True)
    return Int8Result(
        float_modules=kept,
        smoothed=sum(len(p.layers) for p in pairs),
        seconds=time.perf_counter() - started,
    )


@dataclass(frozen=True)
class _InputStats:
    """Per input channel: peak and summed magnitude over ``rows`` calibration rows."""

    channel_max: torch.Tensor
    channel_sum: torch.Tensor
    rows: int

    @property
    def outlier_ratio(self) -> float:
        """Peak over mean input magnitude."""
        mean = float(self.channel_sum.sum()) / max(self.rows * self.channel_sum.numel(), 1)
        return float(self.channel_max.max()) / max(mean, 1e-12)

    def divided(self, s: torch.Tensor) -> _InputStats:
        """The statistics of the same input with channel ``j`` divided by ``s[j]``."""
        return _InputStats(self.channel_max / s, self.channel_sum / s, self.rows)


def _all_linears(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)]


def _input_statistics(
    model: torch.nn.Module, ids: list[int], layers: Iterable[torch.nn.Module]
) -> dict[int, _InputStats]:
    """Per layer (by ``id``): per-channel peak and summed input magnitude over one forward
    of ``ids``."""
    stats: dict[int, _InputStats] = {}

    def recorder(key: int) -> Any:
        def record(_module: Any, args: tuple[Any, ...], _output: Any) -> None:
            x = args[0].detach().abs().float().reshape(-1, args[0].shape[-1])
            seen = stats.get(key)
            peak, total = x.amax(0), x.sum(0)
            if seen is not None:
                peak, total = torch.maximum(seen.channel_max, peak), seen.channel_sum + total
            stats[key] = _InputStats(peak, total, x.shape[0] + (seen.rows if seen else 0))

        return record

    hooks = [layer.register_forward_hook(recorder(id(layer))) for layer in layers]
    try:
        with torch.inference_mode():
            model(input_ids=torch.tensor([ids]), use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    return stats


def _smooth(pair: Smoothing, channel_maxima: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """Divide the pair's input channels by ``s`` (folded into its scale) and multiply the
    layers' weight columns by it: the float function is unchanged. Returns ``s``, or
    ``None`` (nothing done) when a layer of the pair was not seen in calibration."""
    if len(channel_maxima) != len(pair.layers):
        return None
    activation = torch.stack(list(channel_maxima)).amax(0)
    weight = torch.cat([layer.weight.detach().abs() for layer in pair.layers]).amax(0)
    s = (
        activation.clamp(min=1e-5) ** SMOOTHING_ALPHA / weight.clamp(min=1e-5) ** (1 - SMOOTHING_ALPHA)
    ).clamp(min=1e-5)
    with torch.no_grad():
        for layer in pair.layers:
            layer.weight.mul_(s.to(layer.weight.dtype)[None, :])
        scale = pair.scale.weight
        if scale.dim() == 1:  # an RMSNorm: its weight scales the channels
            scale.div_(s.to(scale.dtype))
        else:  # a Linear whose output rows are the channels
            scale.div_(s.to(scale.dtype)[:, None])
    return s
