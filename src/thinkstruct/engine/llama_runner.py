"""A lean runner for Llama-shaped models: :class:`LlamaRunner`.

Decoding a small model on a CPU is bound by reading the weights once per step, and, after
that, by the number of separate operations a step makes: transformers' modules make about
fifty per layer (each with its Python call, dispatch and, with two threads, an OpenMP
wake-up). This runner computes the same function from the same weights with fewer:

- the query, key and value projections run as one matrix multiply, and so do the gate
  and up projections (their weights concatenated once, at construction). For torch's
  dynamic int8 layers the concatenation is exact: the integer weights are stacked and each
  output row keeps its own scale (per-channel), and the input is quantized once instead of
  three times with the same scale;
- the rotary angles are computed once per pass, not once per layer;
- attention folds the query heads that share a key/value head into the query length
  (as :func:`~thinkstruct.engine.kv_slots.slot_attention` does), so no key or value is
  copied per query head. It stays SDPA: a row's result must not depend on how long the
  other rows of its batch are (softmax over a padded span summed in another order would
  change its last bits, and a seeded request its tokens).

It shares :class:`~thinkstruct.engine.kv_slots.SlotCache`'s buffers and the
:class:`~thinkstruct.engine.runner.ModelRunner` contract with
:class:`~thinkstruct.engine.runner.TransformersRunner`, which stays the runner for every
model this one does not recognise (:func:`supports` says which).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from thinkstruct.engine.kv_slots import SlotCache
from thinkstruct.engine.runner import INITIAL_CAPACITY, ModelRunner, activation_dtype, padded_pass

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

    Float layers are concatenated into one weight; torch's dynamic int8 layers into one
    per-channel int8 weight (each part keeps its scales, so the result is the parts').
    Anything else runs part by part.
    """

    def __init__(self, modules: Sequence[Any]) -> None:
        self.sizes = [int(m.out_features) for m in modules]
        self._run: Callable[[torch.Tensor], torch.Tensor]
        if all(type(m) is torch.nn.Linear for m in modules):
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


class LlamaRunner(ModelRunner):
    """A Llama-shaped transformers causal LM (see :func:`supports`) on a :class:`SlotCache`,
    computed by this module from the model's own weights (float or torch dynamic int8).

    Args:
        model: the ``LlamaForCausalLM`` (eval mode); its weights are shared, not copied
            (the fused projections are new tensors: about the size of the layers' weights).
        slots: rows of the KV cache.
        context_length: most tokens per row.
        vocab_size: logits width to return (default: the output layer's).

    Raises:
        ValueError: a model :func:`supports` refuses (names why).
    """

    def __init__(self, model: Any, *, slots: int, context_length: int, vocab_size: int | None = None) -> None:
        reason = supports(model)
        if reason is not None:
            raise ValueError(f"LlamaRunner cannot run this model: {reason}")
        base = model.base_model
        text = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.slots = slots
        self.context_length = context_length
        self._embed = base.embed_tokens
        self._layers = [_Layer(layer) for layer in base.layers[: text.num_hidden_layers]]
        self._norm = base.norm.weight.detach()
        self._norm_eps = float(base.norm.variance_epsilon)
        self._head = model.get_output_embeddings()
        self._inv_freq = base.rotary_emb.inv_freq.detach().float()
        self._rope_scale = float(base.rotary_emb.attention_scaling)
        self.vocab_size = vocab_size or self._head.out_features
        self._heads = text.num_attention_heads
        self._kv_heads = getattr(text, "num_key_value_heads", None) or self._heads
        self._head_dim = getattr(text, "head_dim", None) or text.hidden_size // self._heads
        self._dtype = activation_dtype(model)
        self.cache = SlotCache(
            layers=len(self._layers),
            slots=slots,
            kv_heads=self._kv_heads,
            head_dim=self._head_dim,
            capacity=min(INITIAL_CAPACITY, context_length),
            dtype=self._dtype,
        )

    @property
    def cache_bytes(self) -> int:
        return self.cache.nbytes

    def copy_slot(self, src: int, dst: int, length: int) -> None:
        self.cache.copy_slot(src, dst, length)

    def forward(
        self, first_slot: int, tokens: Sequence[Sequence[int]], starts: Sequence[int]
    ) -> torch.Tensor:
        plan = padded_pass(
            tokens, starts, slots=self.slots, first_slot=first_slot, context=self.context_length
        )
        self.cache.ensure_capacity(plan.written, limit=self.context_length)
        rows, width = plan.ids.shape
        lo, hi = first_slot, first_slot + rows
        heads, kv_heads, dim = self._heads, self._kv_heads, self._head_dim
        group = heads // kv_heads
        dtype = self._dtype

        angles = plan.positions[..., None].float() * self._inv_freq
        angles = torch.cat((angles, angles), dim=-1)
        # [rows, 1 (heads), width, dim], broadcast over heads.
        cos = (angles.cos() * self._rope_scale).to(dtype)[:, None]
        sin = (angles.sin() * self._rope_scale).to(dtype)[:, None]
        # Query j of row i sees its slot's positions 0..start_i + j.
        allowed = torch.arange(plan.span)[None, None, :] <= plan.positions[:, :, None]  # [rows, width, span]
        # The query heads sharing a key/value head are folded into the query length
        # (index g * width + j), so the mask repeats once per head of the group.
        mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, float("-inf"))[:, None]
        if group > 1 and width > 1:
            mask = mask.repeat(1, 1, group, 1)
        index = plan.positions[:, None, :, None].expand(rows, kv_heads, width, dim)

        h = self._embed(plan.ids)
        q_end, k_end = heads * dim, (heads + kv_heads) * dim
        for i, layer in enumerate(self._layers):
            x = _rms_norm(h, layer.attn_norm, layer.attn_eps)
            qkv = layer.qkv(x)
            q = qkv[..., :q_end].view(rows, width, heads, dim).transpose(1, 2)
            k = qkv[..., q_end:k_end].view(rows, width, kv_heads, dim).transpose(1, 2)
            v = qkv[..., k_end:].view(rows, width, kv_heads, dim).transpose(1, 2)
            q = _rotate(q, cos, sin)
            k = _rotate(k, cos, sin)
            keys = self.cache.keys[i][lo:hi]
            values = self.cache.values[i][lo:hi]
            keys.scatter_(2, index, k.to(keys.dtype))
            values.scatter_(2, index, v.to(values.dtype))
            keys, values = keys[:, :, : plan.span], values[:, :, : plan.span]
            folded = q.reshape(rows, kv_heads, group * width, dim)
            attended = F.scaled_dot_product_attention(
                folded, keys, values, attn_mask=mask, scale=layer.scaling
            )
            attended = (
                attended.reshape(rows, heads, width, dim).transpose(1, 2).reshape(rows, width, heads * dim)
            )
            h = h + layer.out(attended)
            x = _rms_norm(h, layer.mlp_norm, layer.mlp_eps)
            gate, up = layer.gate_up(x).chunk(2, dim=-1)
            h = h + layer.down(F.silu(gate) * up)
        last = h[torch.arange(rows), plan.lengths - 1]
        logits: torch.Tensor = self._head(_rms_norm(last, self._norm, self._norm_eps))
        return logits[:, : self.vocab_size].float()
