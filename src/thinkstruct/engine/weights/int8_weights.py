"""int8 weights with float32 activations (``--quantize int8-weights``): :class:`Int8Linear`
and :func:`quantize_int8_weights`.

Decoding reads every weight once per step, so a quarter of float32's bytes is most of the
speed. Here only the weights are quantized: each ``nn.Linear`` weight row (one output)
becomes int8 with its own float32 scale (its largest magnitude / 127, symmetric), and the
layer computes ``x @ (q * scale).T`` with ``x`` left in float32. Nothing depends on the
inputs: no calibration, and the huge channels small Llamas feed their ``down_proj`` layers
("massive activations", peak/mean 17,000 in SmolLM2) cost nothing, where quantizing the
activations too (:mod:`thinkstruct.engine.weights.int8`, ``--quantize int8``) has to smooth them,
keeps 9 of SmolLM2's layers in float32, and moves a row's result with the other rows of its
batch (one activation scale per tensor). Measured on SmolLM2-135M against float32,
teacher-forced over 16 chat answers: top-1 agreement 97.2 %, mean KL 0.0044 (an earlier
measurement over 6 answers: ``int8`` 77 %, 0.24; bfloat16 97.6 %, 0.001). The price is
prefill: float32 multiply-adds do half the work per instruction of ``int8``'s integer ones
(30 layers of SmolLM2's projection shapes, cold caches: 128 against 79 ms for 64 rows), while
decoding is as fast or faster (12 against 17 ms for one row, even at 8).

The matrix multiply is :mod:`~thinkstruct.engine.kernels.cpu_kernels`' ``w8_linear`` (AVX2, or
AVX-512 where the CPU has it: the weights widen to float32 in registers as they stream;
the same bits either way). Where those kernels cannot build,
torch's ``_weight_int8pack_mm`` computes the same function (far slower on AVX2).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from thinkstruct.engine.kernels.cpu_kernels import CpuKernels, cpu_kernels

#: Output rows the packed layout interleaves (``cpu_kernels.c``): a layer whose output
#: count is not a multiple of it stays float32.
BLOCK = 16


class Int8Linear(torch.nn.Module):
    """``y = x @ (weight * scale[:, None]).T + bias``: int8 ``weight [out, in]``, float32
    ``scale [out]`` and ``bias [out]`` (or none), float32 ``x [..., in]`` -> float32
    ``[..., out]``.

    Args:
        weight: the int8 weight rows.
        scale: each row's float32 scale.
        kernels: the compiled kernels (the weight is then kept packed for them), or
            ``None`` (kept as it is, for torch's ``_weight_int8pack_mm``).
        bias: the float bias added to each output (kept float32), or ``None``.
    """

    weight_int8: torch.Tensor
    scale: torch.Tensor
    bias: torch.Tensor | None

    def __init__(
        self,
        weight: torch.Tensor,
        scale: torch.Tensor,
        *,
        kernels: CpuKernels | None,
        bias: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        out_features, in_features = weight.shape
        if weight.dtype != torch.int8 or out_features % BLOCK:
            raise ValueError(f"int8 weight rows must be a multiple of {BLOCK}, got {tuple(weight.shape)}")
        self.in_features = in_features
        self.out_features = out_features
        self._kernels = kernels
        stored = weight if kernels is None else _packed(weight)
        self.register_buffer("weight_int8", stored.contiguous(), persistent=False)
        self.register_buffer("scale", scale.float().contiguous(), persistent=False)
        stored_bias = None if bias is None else bias.detach().float().contiguous()
        self.register_buffer("bias", stored_bias, persistent=False)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, *, kernels: CpuKernels | None) -> Int8Linear:
        """The int8 version of a float ``linear`` (per-row absmax scales; its bias kept
        float32)."""
        weight = linear.weight.detach().float()
        scale = (weight.abs().amax(dim=1) / 127).clamp(min=torch.finfo(torch.float32).tiny)
        quantized = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)
        return cls(quantized, scale, kernels=kernels, bias=linear.bias)

    @classmethod
    def stacked(cls, parts: Sequence[Int8Linear]) -> Int8Linear:
        """One layer computing ``parts`` over the same input, outputs concatenated in order
        (exact: each output row keeps its weights, scale and bias; a part without a bias
        beside one with adds zeros)."""
        kernels = parts[0]._kernels
        if any(p._kernels is not kernels or p.in_features != parts[0].in_features for p in parts):
            raise ValueError("stacked int8 layers must share their input size and kernels")
        rows = torch.cat([p._rows() for p in parts])
        bias = None
        if any(p.bias is not None for p in parts):
            bias = torch.cat([p.scale.new_zeros(p.out_features) if p.bias is None else p.bias for p in parts])
        return cls(rows, torch.cat([p.scale for p in parts]), kernels=kernels, bias=bias)

    @property
    def packed(self) -> bool:
        """Whether the weight is kept packed for the compiled kernels (``weight_int8``
        ``[out / 16, in, 16]``)."""
        return self._kernels is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if rows.dtype != torch.float32 or rows.stride(-1) != 1:
            rows = rows.float().contiguous()
        if self._kernels is not None:
            out = self._kernels.w8_linear(rows, self.weight_int8, self.scale, self.bias)
        else:
            out = torch._weight_int8pack_mm(rows, self.weight_int8, self.scale)
            if self.bias is not None:
                out = out + self.bias
        return out.view(*x.shape[:-1], self.out_features)

    def dequantized(self) -> torch.Tensor:
        """The float32 weight ``[out, in]`` this layer multiplies by."""
        return self._rows().float() * self.scale[:, None]

    def _rows(self) -> torch.Tensor:
        """The int8 weight ``[out, in]`` (a copy when it is stored packed)."""
        if self._kernels is None:
            return self.weight_int8
        # [out / BLOCK, in, BLOCK] -> [out, in]
        return self.weight_int8.transpose(1, 2).reshape(self.out_features, self.in_features)

    def extra_repr(self) -> str:
        bias = self.bias is not None
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={bias}, int8 weights"


def _packed(weight: torch.Tensor) -> torch.Tensor:
    """``[out, in]`` -> ``[out / BLOCK, in, BLOCK]``: each k's BLOCK output rows adjacent."""
    out_features, in_features = weight.shape
    return weight.view(out_features // BLOCK, BLOCK, in_features).transpose(1, 2).contiguous()


@dataclass(frozen=True)
class Int8WeightsResult:
    """What :func:`quantize_int8_weights` did.

    Attributes:
        quantized: Linear layers now int8 (module names, in model order).
        kept_float: Linear layers left float32 (an output size that is not a multiple of
            :data:`BLOCK`).
        compiled: whether the layers run on the compiled kernels.
        seconds: wall time.
    """

    quantized: tuple[str, ...]
    kept_float: tuple[str, ...]
    compiled: bool
    seconds: float


def quantize_int8_weights(model: torch.nn.Module, *, compiled: bool = True) -> Int8WeightsResult:
    """Replace every ``nn.Linear`` of a float32 ``model`` by an :class:`Int8Linear` (its
    bias, where it has one, kept float32), in place.

    Args:
        model: a float32 model.
        compiled: run on :func:`cpu_kernels` where they build; ``False``: on torch's
            int8 matrix multiply.
    """
    started = time.perf_counter()
    kernels = cpu_kernels() if compiled else None
    quantized: list[str] = []
    kept: list[str] = []
    for name, module in list(model.named_modules()):
        if type(module) is not torch.nn.Linear:
            continue
        if module.out_features % BLOCK:
            kept.append(name)
            continue
        parent_name, _, attribute = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attribute, Int8Linear.from_linear(module, kernels=kernels))
        quantized.append(name)
    return Int8WeightsResult(
        tuple(quantized), tuple(kept), kernels is not None, time.perf_counter() - started
    )
