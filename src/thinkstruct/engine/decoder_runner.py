"""A lean runner for Llama-shaped models: :class:`LlamaRunner`.

Decoding a small model on a CPU is bound by reading the weights once per step, and, after
that, by the number of separate operations a step makes: transformers' modules make about
fifty per layer (each with its Python call, dispatch and, with two threads, an OpenMP
wake-up). This runner computes the same function from the same weights with fewer:

- the query, key and value projections run as one matrix multiply, and so do the gate
  and up projections (their weights concatenated once, at construction; for int8 layers
  the integer rows and their scales are stacked, exactly, and torch's dynamic int8
  quantizes the input once instead of three times with the same scale);
- the rotary angles are computed once per pass, not once per layer, and a layer's
  queries and keys are rotated in one go;
- a pass whose rows feed different numbers of tokens (prompts of different lengths, a
  row with forced tokens beside rows with one) runs its per-token work (norms,
  projections, MLP) on the real tokens only, packed; only attention sees the rows padded
  to the longest. Padding was up to 40 % of a prefill pass's positions under load
  (measured), all of it paid in the matrix multiplies;
- attention folds the query heads that share a key/value head into the query length
  (as :func:`~thinkstruct.engine.kv_slots.slot_attention` does), so no key or value is
  copied per query head. It stays SDPA: a row's result must not depend on how long the
  other rows of its batch are (softmax over a padded span summed in another order would
  change its last bits, and a seeded request its tokens).

A float32 model (``--dtype float32``, or ``--quantize int8``, whose activations are
float32) runs its norms, rotary positions with the cache write, attention and gated SiLU
on :mod:`~thinkstruct.engine.cpu_kernels` where they build: four calls a layer instead of
about twenty torch operations, and attention reads each token's own slot directly (no
padding, no mask). Measured on SmolLM2-135M int8, interleaved in one process: a decoding
step 36.0 against 47.8 ms at batch 1, 47.6 against 67.5 ms at batch 8.

It shares :class:`~thinkstruct.engine.kv_slots.SlotCache`'s buffers and the
:class:`~thinkstruct.engine.runner.ModelRunner` contract with
:class:`~thinkstruct.engine.runner.TransformersRunner`, which stays the runner for every
model this one does not recognise (:func:`supports` says which).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from thinkstruct.engine.cpu_kernels import CpuKernels, LayerPointers, cpu_kernels
from thinkstruct.engine.int8_weights import Int8Linear
from thinkstruct.engine.runner import PaddedPass, SlotRunner

#: Architectures whose layers are exactly: RMSNorm, q/k/v/o attention with rotary
#: positions and grouped key/value heads, RMSNorm, gated SiLU MLP.
_ARCHITECTURES = frozenset({"llama"})


def supports(model: Any) -> str | None:
    """``None`` when :class:`LlamaRunner` computes ``model`` exactly; otherwise the reason
    it does not (the engine then uses the transformers runner)."""
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if getattr(text, "model_type", None) not in _ARCHITECTURES:
        return f"model type {getattr(text, 'model_type', None)!r}"
    rope = getattr(text, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        return f"rope type {rope.get('rope_type')!r}"
    if getattr(text, "attention_bias", False) or getattr(text, "mlp_bias", False):
        return "biased projections"
    if getattr(text, "hidden_act", "silu") != "silu":
        return f"activation {text.hidden_act!r}"
    if getattr(text, "pretraining_tp", 1) != 1:
        return "tensor-parallel pretraining layout"
    return None


class _Projection:
    """Several linear layers over the same input, run as one: ``x [..., in] -> [..., sum out]``.

    One layer runs as itself. Float layers are concatenated into one weight (the layers
    become views of it: no second copy); int8 layers (:class:`Int8Linear`, or torch's
    dynamic int8 with per-channel weights) into one int8 layer (each output row keeps its
    weights and scale, so the result is the parts'; the model's own layers keep theirs, so
    these are a second copy). Anything else runs part by part.
    """

    def __init__(self, modules: Sequence[Any]) -> None:
        self.sizes = [int(m.out_features) for m in modules]
        self._run: Callable[[torch.Tensor], torch.Tensor]
        #: The one int8-weight layer computing this projection, where it is one.
        self.int8: Int8Linear | None = None
        if all(isinstance(m, Int8Linear) for m in modules):
            self.int8 = modules[0] if len(modules) == 1 else Int8Linear.stacked(modules)
            self._run = self.int8
        elif len(modules) == 1:
            self._run = modules[0]
        elif all(type(m) is torch.nn.Linear for m in modules):
            weight = torch.cat([m.weight.detach() for m in modules])
            offset = 0
            for m, size in zip(modules, self.sizes, strict=True):  # the model's layers become views of it
                m.weight.data = weight[offset : offset + size]
                offset += size
            self._run = lambda x: F.linear(x, weight)
        elif all(_is_dynamic_int8(m) for m in modules):
            packed = _stacked_int8(modules)
            self._run = lambda x: torch.ops.quantized.linear_dynamic(x, packed, reduce_range=True)
        else:
            parts = list(modules)
            self._run = lambda x: torch.cat([m(x) for m in parts], dim=-1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(x)


def _is_dynamic_int8(module: Any) -> bool:
    packed = getattr(module, "_packed_params", None)
    return type(module).__name__ == "Linear" and getattr(packed, "dtype", None) == torch.qint8


def _stacked_int8(modules: Sequence[Any]) -> Any:
    """One packed per-channel qint8 weight holding each module's rows and scales."""
    ints, scales = [], []
    for module in modules:
        weight, bias = module._packed_params._weight_bias()
        if bias is not None:
            raise ValueError("biased int8 projections are not supported")
        if weight.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
            if weight.q_zero_point() != 0:
                raise ValueError("asymmetric int8 weights are not supported")
            row_scales = torch.full((weight.shape[0],), weight.q_scale(), dtype=torch.double)
        else:
            if bool((weight.q_per_channel_zero_points() != 0).any()) or weight.q_per_channel_axis() != 0:
                raise ValueError("asymmetric or column-wise int8 weights are not supported")
            row_scales = weight.q_per_channel_scales().double()
        ints.append(weight.int_repr())
        scales.append(row_scales)
    scale = torch.cat(scales)
    stacked = torch._make_per_channel_quantized_tensor(
        torch.cat(ints), scale, torch.zeros_like(scale, dtype=torch.long), 0
    )
    return torch.ops.quantized.linear_prepack(stacked, None)


class _Layer:
    def __init__(self, layer: Any) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.attn_norm = layer.input_layernorm.weight.detach()
        self.attn_eps = float(layer.input_layernorm.variance_epsilon)
        self.mlp_norm = layer.post_attention_layernorm.weight.detach()
        self.mlp_eps = float(layer.post_attention_layernorm.variance_epsilon)
        self.qkv = _Projection([attn.q_proj, attn.k_proj, attn.v_proj])
        self.out = _Projection([attn.o_proj])
        self.gate_up = _Projection([mlp.gate_proj, mlp.up_proj])
        self.down = _Projection([mlp.down_proj])
        self.scaling = float(attn.scaling)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm (normalized in float32, scaled in the input's dtype), in
    torch's fused kernel where the input is float32 (the same bits, measured)."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class LlamaRunner(SlotRunner):
    """A Llama-shaped transformers causal LM (see :func:`supports`) on a :class:`SlotCache`,
    computed by this module from the model's own weights (float, :class:`Int8Linear` or
    torch dynamic int8).

    Args:
        model: the ``LlamaForCausalLM`` (eval mode); its float weights are shared (its
            q/k/v and gate/up layers become views of the fused weights), its int8 q/k/v
            and gate/up weights are stacked into new ones.
        slots, context_length, vocab_size: as for
            :class:`~thinkstruct.engine.runner.SlotRunner`.
        kernels: run passes on the compiled kernels (:func:`cpu_kernels`) where they
            can: a float32 model whose sizes are multiples of 8, on a machine where they
            build. ``False`` computes with torch operations only.

    Raises:
        ValueError: a model :func:`supports` refuses (names why).
    """

    packs_tokens = True

    def __init__(
        self,
        model: Any,
        *,
        slots: int,
        context_length: int,
        vocab_size: int | None = None,
        kernels: bool = True,
    ) -> None:
        reason = supports(model)
        if reason is not None:
            raise ValueError(f"LlamaRunner cannot run this model: {reason}")
        super().__init__(model, slots=slots, context_length=context_length, vocab_size=vocab_size)
        base = model.base_model
        self._embed = base.embed_tokens
        self._layers = [_Layer(layer) for layer in base.layers[: len(self.cache.keys)]]
        self._norm = base.norm.weight.detach()
        self._norm_eps = float(base.norm.variance_epsilon)
        self._inv_freq = base.rotary_emb.inv_freq.detach().float()
        self._rope_scale = float(base.rotary_emb.attention_scaling)
        self._kernels = cpu_kernels() if kernels and self._fits_kernels() else None
        self._stack = self._stack_pointers() if self._kernels is not None else None
        # One kernel call computes each token from its own inputs and slot, in a fixed
        # order (tested bit for bit); torch's matrix multiplies pick kernels by shape.
        self.batch_invariant = self._stack is not None

    def _fits_kernels(self) -> bool:
        sizes = (
            self._norm.numel(),  # hidden size: the norms' rows
            self._head_dim // 2,
            self._heads * self._head_dim,
            self._layers[0].gate_up.sizes[0],  # intermediate size
        )
        return self._dtype == torch.float32 and self._head_dim <= 256 and all(n % 8 == 0 for n in sizes)

    def _stack_pointers(self) -> ctypes.Array[LayerPointers] | None:
        """Every layer's parameters for :meth:`CpuKernels.llama_layers`, where every
        projection is an int8-weight layer on the kernels (the cache buffers are filled in
        before each pass: they move when the cache grows)."""
        table = (LayerPointers * len(self._layers))()
        for entry, layer in zip(table, self._layers, strict=True):
            projections = {
                "qkv": layer.qkv.int8, "out": layer.out.int8,
                "gate_up": layer.gate_up.int8, "down": layer.down.int8,
            }  # fmt: skip
            for name, linear in projections.items():
                if linear is None or not linear.packed:
                    return None
                setattr(entry, name, linear.weight_int8.data_ptr())
                setattr(entry, f"{name}_scale", linear.scale.data_ptr())
            entry.attn_norm, entry.mlp_norm = layer.attn_norm.data_ptr(), layer.mlp_norm.data_ptr()
            entry.attn_eps, entry.mlp_eps, entry.scaling = layer.attn_eps, layer.mlp_eps, layer.scaling
        return table

    @property
    def compiled(self) -> bool:
        """Whether passes run on the compiled kernels."""
        return self._kernels is not None

    @property
    def stacked(self) -> bool:
        """Whether a pass runs every layer in one call of the compiled kernels (int8
        weights on the kernels)."""
        return self._stack is not None

    def forward(
        self, first_slot: int, tokens: Sequence[Sequence[int]], starts: Sequence[int]
    ) -> torch.Tensor:
        plan = self._begin(first_slot, tokens, starts)
        if self._kernels is not None:
            if self._stack is not None:
                return self._stacked_forward(self._kernels, self._stack, first_slot, plan)
            return self._compiled_forward(self._kernels, first_slot, plan)
        rows, width = plan.ids.shape
        heads, kv_heads, dim = self._heads, self._kv_heads, self._head_dim
        group = heads // kv_heads
        dtype = self._dtype

        angles = plan.positions[..., None].float() * self._inv_freq
        angles = torch.cat((angles, angles), dim=-1)
        # [rows, 1 (heads), width, dim], broadcast over heads.
        cos = (angles.cos() * self._rope_scale).to(dtype)[:, None]
        sin = (angles.sin() * self._rope_scale).to(dtype)[:, None]
        visible = plan.visible()
        # The query heads sharing a key/value head are folded into the query length
        # (index g * width + j), so the mask repeats once per head of the group.
        mask = torch.zeros(visible.shape, dtype=dtype).masked_fill_(~visible, float("-inf"))[:, None]
        if group > 1 and width > 1:
            mask = mask.repeat(1, 1, group, 1)

        # Per-token work runs on h [tokens, hidden]: the real tokens only, row after row.
        real = _real_tokens(plan.lengths, width)
        ids = plan.ids.flatten()
        h = self._embed(ids if real is None else ids[real])
        k_end = (heads + kv_heads) * dim
        for i, layer in enumerate(self._layers):
            x = _rms_norm(h, layer.attn_norm, layer.attn_eps)
            qkv = _padded(layer.qkv(x), real, rows, width)
            # Queries and keys rotate together: [rows, heads + kv_heads, width, dim].
            qk = _rotate(qkv[..., :k_end].view(rows, width, heads + kv_heads, dim).transpose(1, 2), cos, sin)
            v = qkv[..., k_end:].view(rows, width, kv_heads, dim).transpose(1, 2)
            keys, values = self.cache.write(i, qk[:, heads:], v)  # where _begin planned
            folded = qk[:, :heads].reshape(rows, kv_heads, group * width, dim)
            attended = F.scaled_dot_product_attention(
                folded, keys, values, attn_mask=mask, scale=layer.scaling
            )
            attended = (
                attended.reshape(rows, heads, width, dim).transpose(1, 2).reshape(rows * width, heads * dim)
            )
            h = h + layer.out(attended if real is None else attended[real])
            x = _rms_norm(h, layer.mlp_norm, layer.mlp_eps)
            gate, up = layer.gate_up(x).chunk(2, dim=-1)
            h = h + layer.down(F.silu(gate) * up)
        if real is None:
            last = torch.arange(rows) * width + plan.lengths - 1
        else:
            last = plan.lengths.cumsum(0) - 1
        return self._logits(_rms_norm(h[last], self._norm, self._norm_eps))

    def _packed_tokens(self, first_slot: int, plan: PaddedPass) -> _PackedTokens:
        rows, width = plan.ids.shape
        real = _real_tokens(plan.lengths, width)
        ids, pos_of = plan.ids.flatten(), plan.positions.flatten()
        slot_of = torch.arange(first_slot, first_slot + rows).repeat_interleave(width)
        if real is not None:
            ids, pos_of, slot_of = ids[real], pos_of[real], slot_of[real]
        angles = pos_of[:, None].float() * self._inv_freq
        cos = (angles.cos() * self._rope_scale).contiguous()
        sin = (angles.sin() * self._rope_scale).contiguous()
        return _PackedTokens(ids, slot_of, pos_of, cos, sin)

    def _stacked_forward(
        self, kernels: CpuKernels, stack: ctypes.Array[LayerPointers], first_slot: int, plan: PaddedPass
    ) -> torch.Tensor:
        """The pass with every layer in one kernel call (int8 weights on the kernels)."""
        if stack[0].keys != self.cache.keys[0].data_ptr():  # the cache grew: new buffers
            for entry, keys, values in zip(stack, self.cache.keys, self.cache.values, strict=True):
                entry.keys, entry.values = keys.data_ptr(), values.data_ptr()
        packed = self._packed_tokens(first_slot, plan)
        h = self._embed(packed.ids).contiguous()
        kernels.llama_layers(
            h, stack, heads=self._heads, kv_heads=self._kv_heads, dim=self._head_dim,
            inter=self._layers[0].gate_up.sizes[0], cos=packed.cos, sin=packed.sin,
            slot_of=packed.slot_of, pos_of=packed.pos_of, capacity=self.cache.capacity, span=plan.span,
        )  # fmt: skip
        last = plan.lengths.cumsum(0) - 1
        return self._logits(kernels.rms_norm(h[last], self._norm, self._norm_eps))

    def _compiled_forward(self, kernels: CpuKernels, first_slot: int, plan: PaddedPass) -> torch.Tensor:
        """The same pass on the compiled kernels: every step on the real tokens, packed."""
        packed = self._packed_tokens(first_slot, plan)
        ids, slot_of, pos_of, cos, sin = packed.ids, packed.slot_of, packed.pos_of, packed.cos, packed.sin
        heads, kv_heads = self._heads, self._kv_heads
        h = self._embed(ids)
        for i, layer in enumerate(self._layers):
            keys, values = self.cache.keys[i], self.cache.values[i]
            qkv = layer.qkv(kernels.rms_norm(h, layer.attn_norm, layer.attn_eps))
            kernels.rope_store(
                qkv, heads=heads, kv_heads=kv_heads, cos=cos, sin=sin,
                slot_of=slot_of, pos_of=pos_of, keys=keys, values=values,
            )  # fmt: skip
            attended = kernels.attention(
                qkv, heads=heads, kv_heads=kv_heads, slot_of=slot_of, pos_of=pos_of,
                span=plan.span, keys=keys, values=values, scale=layer.scaling,
            )  # fmt: skip
            h = h + layer.out(attended)
            x = kernels.rms_norm(h, layer.mlp_norm, layer.mlp_eps)
            h = h + layer.down(kernels.silu_mul(layer.gate_up(x)))
        last = plan.lengths.cumsum(0) - 1
        return self._logits(kernels.rms_norm(h[last], self._norm, self._norm_eps))


class _PackedTokens(NamedTuple):
    """A pass's real tokens, packed row after row: ids, cache slot and position ``[T]``,
    rotary ``cos``/``sin [T, head_dim / 2]``."""

    ids: torch.Tensor
    slot_of: torch.Tensor
    pos_of: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor


def _real_tokens(lengths: torch.Tensor, width: int) -> torch.Tensor | None:
    """Indices into the flattened ``[rows * width]`` pass of the tokens rows really feed
    (``lengths [rows]``), in row order; ``None`` when no row is padded."""
    rows = lengths.shape[0]
    if int(lengths.sum()) == rows * width:
        return None
    return (torch.arange(width)[None, :] < lengths[:, None]).flatten().nonzero().squeeze(1)


def _padded(packed: torch.Tensor, real: torch.Tensor | None, rows: int, width: int) -> torch.Tensor:
    """``packed [tokens, features]`` laid out as ``[rows, width, features]``, zeros where a
    row is padded (those positions' keys land past the row's end and are never attended;
    their queries' results are dropped)."""
    if real is None:
        return packed.view(rows, width, packed.shape[-1])
    out = packed.new_zeros((rows * width, packed.shape[-1]))
    out.index_copy_(0, real, packed)
    return out.view(rows, width, packed.shape[-1])
