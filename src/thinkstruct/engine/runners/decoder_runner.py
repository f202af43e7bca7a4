"""A lean runner for the decoder architectures of the registry: :class:`DecoderRunner`.

Llama, Mistral, Qwen2, Qwen3, SmolLM3, Phi-3 (:mod:`~thinkstruct.engine.runners.architectures`
says how each lays out its layers: fused or separate projections, biases, per-head q/k
norms, rotary tables, partial and absent rotary, sliding windows); one code path reads
the entry, on the compiled kernels and on torch operations alike.

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
  (as :func:`~thinkstruct.engine.kv.slots.slot_attention` does), so no key or value is
  copied per query head. It stays SDPA: a row's result must not depend on how long the
  other rows of its batch are (softmax over a padded span summed in another order would
  change its last bits, and a seeded request its tokens).

A float32 model (``--dtype float32``, or ``--quantize int8``, whose activations are
float32) runs its norms, rotary positions with the cache write, attention and gated SiLU
on :mod:`~thinkstruct.engine.kernels.cpu_kernels` where they build: four calls a layer instead of
about twenty torch operations, and attention reads each token's own slot directly (no
padding, no mask). Measured on SmolLM2-135M int8, interleaved in one process: a decoding
step 36.0 against 47.8 ms at batch 1, 47.6 against 67.5 ms at batch 8.

Its keys and values live in blocks (:class:`~thinkstruct.engine.kv.blocks.PagedKvCache`,
a block table per slot): a row that moves to another slot, a prompt that starts like a
live row and the prefix cache's blocks are shared by reference, never copied; the kernels
and the torch path read and write through the table. It shares the
:class:`~thinkstruct.engine.runners.runner.ModelRunner` contract with
:class:`~thinkstruct.engine.runners.runner.TransformersRunner`, which stays the runner (on slot
buffers) for every model this one does not recognise (:func:`supports` says which, and why;
:func:`default_runner` picks between the two).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from thinkstruct.engine.kernels.cpu_kernels import (
    INT8,
    POOL_DTYPES,
    CpuKernels,
    LayerPointers,
    Pages,
    RopeLayout,
    cpu_kernels,
)
from thinkstruct.engine.kv.blocks import HeldBlocks, PagedKvCache, block_bytes
from thinkstruct.engine.kv.budget import DEFAULT_KV_BYTES, DEFAULT_PREFIX_BYTES, KvBudget
from thinkstruct.engine.kv.prefix_cache import BLOCK_TOKENS, HeldKv
from thinkstruct.engine.runners.architectures import Architecture, architecture_of, text_config
from thinkstruct.engine.runners.runner import (
    CausalLmRunner,
    ModelRunner,
    PaddedPass,
    TransformersRunner,
    padded_pass,
    tail_positions,
)
from thinkstruct.engine.weights.gguf_weights import GGUFLinear
from thinkstruct.engine.weights.int8_weights import Int8Linear

log = logging.getLogger("thinkstruct.engine")


def supports(model: Any, *, context_length: int | None = None) -> str | None:
    """``None`` when :class:`DecoderRunner` computes ``model`` exactly (rows of up to
    ``context_length`` tokens); otherwise the reason it does not (the engine then uses
    the transformers runner)."""
    entry = architecture_of(model, context_length=context_length)
    return entry if isinstance(entry, str) else None


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
        #: The one int8-weight or GGUF-block layer computing this projection, where it is one.
        self.kernel_layer: Int8Linear | GGUFLinear | None = None
        if all(isinstance(m, Int8Linear) for m in modules):
            self.kernel_layer = modules[0] if len(modules) == 1 else Int8Linear.stacked(modules)
            self._run = self.kernel_layer
        elif all(isinstance(m, GGUFLinear) for m in modules) and GGUFLinear.stack_problem(modules) is None:
            self.kernel_layer = modules[0] if len(modules) == 1 else GGUFLinear.stacked(modules)
            self._run = self.kernel_layer
        elif len(modules) == 1:
            self._run = modules[0]
        elif all(type(m) is torch.nn.Linear for m in modules):
            weight = torch.cat([m.weight.detach() for m in modules])
            offset = 0
            for m, size in zip(modules, self.sizes, strict=True):  # the model's layers become views of it
                m.weight.data = weight[offset : offset + size]
                offset += size
            bias = _stacked_bias(modules, weight.dtype)
            self._run = lambda x: F.linear(x, weight, bias)
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


def _stacked_bias(modules: Sequence[Any], dtype: torch.dtype) -> torch.Tensor | None:
    """The modules' biases end to end (zeros for one without), or ``None`` when none has one."""
    biases = [m.bias for m in modules]
    if all(b is None for b in biases):
        return None
    return torch.cat(
        [
            torch.zeros(m.out_features, dtype=dtype) if b is None else b.detach().to(dtype)
            for m, b in zip(modules, biases, strict=True)
        ]
    )


def _stacked_int8(modules: Sequence[Any]) -> Any:
    """One packed per-channel qint8 weight holding each module's rows, scales and biases."""
    ints, scales, biases = [], [], []
    for module in modules:
        weight, bias = module._packed_params._weight_bias()
        biases.append(bias)
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
    bias = None
    if any(b is not None for b in biases):
        bias = torch.cat(
            [torch.zeros(i.shape[0]) if b is None else b.float() for i, b in zip(ints, biases, strict=True)]
        )
    return torch.ops.quantized.linear_prepack(stacked, bias)


class _Layer:
    """One decoder layer as its architecture entry lays it out."""

    def __init__(self, layer: Any, entry: Architecture, config: Any) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.attn_norm = layer.input_layernorm.weight.detach()
        self.attn_eps = float(layer.input_layernorm.variance_epsilon)
        self.mlp_norm = layer.post_attention_layernorm.weight.detach()
        self.mlp_eps = float(layer.post_attention_layernorm.variance_epsilon)
        self.qkv = _Projection([getattr(attn, name) for name in entry.qkv])
        self.out = _Projection([attn.o_proj])
        self.gate_up = _Projection([getattr(mlp, name) for name in entry.gate_up])
        self.down = _Projection([mlp.down_proj])
        self.scaling = float(attn.scaling)
        q_norm, k_norm = (attn.q_norm, attn.k_norm) if entry.qk_norm else (None, None)
        eps = 1e-6
        if q_norm is not None and k_norm is not None:
            eps = float(q_norm.variance_epsilon)
            if float(k_norm.variance_epsilon) != eps:
                raise ValueError("the runner takes one epsilon for the q and k norms of a layer")
        #: Per-head q/k norms and whether this layer rotates (what rope_store reads).
        self.rope = RopeLayout(
            q_norm=None if q_norm is None else q_norm.weight.detach(),
            k_norm=None if k_norm is None else k_norm.weight.detach(),
            eps=eps,
            rotate=entry.rotates(attn),
        )
        #: Positions a query sees (itself included), or 0: all before it.
        self.window = entry.sliding_window(config, attn) or 0


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
    """transformers' rotary positions of ``x [..., dim]`` over its first ``cos.shape[-1]``
    values (rotate-half layout; the rest pass through: partial rotary)."""
    width = cos.shape[-1]
    rotated, passed = x[..., :width], x[..., width:]
    half = width // 2
    rotated = rotated * cos + torch.cat((-rotated[..., half:], rotated[..., :half]), dim=-1) * sin
    return rotated if passed.shape[-1] == 0 else torch.cat((rotated, passed), dim=-1)


def _normed_heads(qk: torch.Tensor, heads: int, rope: RopeLayout) -> torch.Tensor:
    """Per-head RMS norm of ``qk [..., heads + kv_heads, dim]``'s query and key heads."""
    if rope.q_norm is None or rope.k_norm is None:
        return qk
    q = _rms_norm(qk[..., :heads, :], rope.q_norm, rope.eps)
    k = _rms_norm(qk[..., heads:, :], rope.k_norm, rope.eps)
    return torch.cat((q, k), dim=-2)


class DecoderRunner(CausalLmRunner):
    """A transformers causal LM of a registered architecture (see :func:`supports`) on a
    :class:`PagedKvCache`, computed by this module from the model's own weights (float,
    :class:`Int8Linear` or torch dynamic int8).

    Args:
        model: the ``*ForCausalLM`` (eval mode); its float weights are shared (its
            separate q/k/v and gate/up layers become views of the fused weights), its int8
            q/k/v and gate/up weights are stacked into new ones.
        slots, context_length, vocab_size: as for
            :class:`~thinkstruct.engine.runners.runner.CausalLmRunner`.
        kernels: run passes on the compiled kernels (:func:`cpu_kernels`) where they
            can: a float32 model whose sizes are multiples of 8, on a machine where they
            build. ``False`` computes with torch operations only.
        kv_cache_bytes: most bytes of blocks the running requests reserve.
        prefix_cache_bytes: most bytes of blocks the prefix cache keeps; the pools hold
            at most both budgets' blocks and one for a copy on write.
        kv_cache_dtype: what the pools hold: ``float16`` or ``float32``; ``None``:
            float16 where the compiled kernels run the passes (half the bytes that
            attention reads and the budgets hold twice the positions; measured: a
            32-row step's attention at positions 40-140 in 57 % of the time), else the
            model's own dtype. Keys and values are rounded to it when written and
            computed with in the activations' dtype.

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
        kv_cache_bytes: int = DEFAULT_KV_BYTES,
        prefix_cache_bytes: int = DEFAULT_PREFIX_BYTES,
        kv_cache_dtype: torch.dtype | None = None,
    ) -> None:
        entry = architecture_of(model, context_length=context_length)
        if isinstance(entry, str):
            raise ValueError(f"DecoderRunner cannot run this model: {entry}")
        if kv_cache_dtype not in (None, *POOL_DTYPES):
            raise ValueError(f"kv_cache_dtype must be float16, float32 or None (auto), got {kv_cache_dtype}")
        super().__init__(model, slots=slots, context_length=context_length, vocab_size=vocab_size)
        base = model.base_model
        self._norm = base.norm.weight.detach()
        self._norm_eps = float(base.norm.variance_epsilon)
        rotary = base.rotary_emb
        # Its frequencies at construction: a longrope model's short factors (the only ones
        # used within its original context, which architecture_of checked).
        self._inv_freq = getattr(rotary, "original_inv_freq", rotary.inv_freq).detach().float()
        self._rope_scale = float(rotary.attention_scaling)
        self._layers = [
            _Layer(layer, entry, config=text_config(model)) for layer in base.layers[: self._layer_count]
        ]
        self._inter = sum(self._layers[0].gate_up.sizes) // 2  # the MLP's width
        self._kernels = cpu_kernels() if kernels and self._fits_kernels() else None
        if kv_cache_dtype is None:
            kv_cache_dtype = torch.float16 if self._kernels is not None else self._dtype
        size = block_bytes(
            layers=self._layer_count, kv_heads=self._kv_heads, head_dim=self._head_dim, dtype=kv_cache_dtype
        )
        kv_blocks, prefix_blocks = kv_cache_bytes // size, prefix_cache_bytes // size
        self.kv_budget = KvBudget(
            kv_bytes=kv_blocks * size,
            prefix_bytes=prefix_cache_bytes,
            unit_tokens=BLOCK_TOKENS,
            unit_bytes=size,
            max_positions=min(context_length, kv_blocks * BLOCK_TOKENS),
        )
        self.cache = PagedKvCache(
            layers=self._layer_count, slots=slots, kv_heads=self._kv_heads, head_dim=self._head_dim,
            context_length=context_length, dtype=kv_cache_dtype,
            capacity_blocks=kv_blocks + prefix_blocks + 1,
        )  # fmt: skip
        #: The registry entry this runner computes.
        self.architecture = entry
        self._embed = base.embed_tokens
        self._stack = self._stack_pointers() if self._kernels is not None else None
        # One kernel call computes each token from its own inputs and slot, in a fixed
        # order (tested bit for bit); torch's matrix multiplies pick kernels by shape.
        self.batch_invariant = self._stack is not None

    def _fits_kernels(self) -> bool:
        sizes = (
            self._norm.numel(),  # hidden size: the norms' rows
            self._head_dim,
            self._inv_freq.numel(),  # rotary pairs a head
            self._heads * self._head_dim,
            self._inter,
        )
        return self._dtype == torch.float32 and self._head_dim <= 256 and all(n % 8 == 0 for n in sizes)

    def _stack_pointers(self) -> ctypes.Array[LayerPointers] | None:
        """Every layer's parameters for :meth:`CpuKernels.decoder_layers`, where every
        projection is an int8-weight or GGUF-block layer on the kernels, each with its
        format (the cache buffers are filled in before each pass: they move when the cache
        grows)."""
        table = (LayerPointers * len(self._layers))()
        for entry, layer in zip(table, self._layers, strict=True):
            projections = {
                "qkv": layer.qkv.kernel_layer, "out": layer.out.kernel_layer,
                "gate_up": layer.gate_up.kernel_layer, "down": layer.down.kernel_layer,
            }  # fmt: skip
            for name, linear in projections.items():
                if isinstance(linear, GGUFLinear):
                    setattr(entry, name, linear.packed.data_ptr())
                    setattr(entry, f"{name}_format", linear.code)
                    if linear.tail is not None:  # the kernels take a second format for q/k/v only
                        if name != "qkv":
                            return None
                        entry.qkv_tail, entry.qkv_tail_format = (
                            linear.tail.packed.data_ptr(),
                            linear.tail.code,
                        )
                        entry.qkv_split = linear.head_rows // 16
                elif isinstance(linear, Int8Linear) and linear.packed:
                    setattr(entry, name, linear.weight_int8.data_ptr())
                    setattr(entry, f"{name}_scale", linear.scale.data_ptr())
                    setattr(entry, f"{name}_format", INT8)
                else:
                    return None
                setattr(entry, f"{name}_bias", None if linear.bias is None else linear.bias.data_ptr())
            entry.attn_norm, entry.mlp_norm = layer.attn_norm.data_ptr(), layer.mlp_norm.data_ptr()
            rope = layer.rope
            entry.q_norm = None if rope.q_norm is None else rope.q_norm.data_ptr()
            entry.k_norm = None if rope.k_norm is None else rope.k_norm.data_ptr()
            entry.rotate, entry.window = int(rope.rotate), layer.window
            entry.attn_eps, entry.mlp_eps, entry.qk_eps = layer.attn_eps, layer.mlp_eps, rope.eps
            entry.scaling = layer.scaling
        return table

    @property
    def compiled(self) -> bool:
        """Whether passes run on the compiled kernels."""
        return self._kernels is not None

    @property
    def stacked(self) -> bool:
        """Whether a pass runs every layer in one call of the compiled kernels (int8 or
        GGUF-block weights on the kernels)."""
        return self._stack is not None

    # ---- the paged cache -------------------------------------------------------------

    @property
    def cache_bytes(self) -> int:
        return self.cache.nbytes

    def copy_slot(self, src: int, dst: int, length: int) -> None:
        """Make ``dst`` share ``src``'s blocks of its first ``length`` positions (no keys or
        values copied; a partial last block is copied only when one of them writes into it)."""
        self.cache.share(src, dst, length)

    def read_kv(self, slot: int, start: int, stop: int) -> HeldBlocks:
        """References to ``slot``'s whole blocks of ``[start, stop)`` (block boundaries)."""
        return self.cache.hold(slot, start, stop)

    def write_kv(self, slot: int, start: int, kv: HeldKv) -> None:
        """Map the blocks of ``kv`` (:meth:`read_kv`'s, of this runner) into ``slot``'s
        table after its first ``start`` positions (a block boundary)."""
        if not isinstance(kv, HeldBlocks):
            raise TypeError(f"the paged cache takes its own blocks (HeldBlocks), not {type(kv).__name__}")
        self.cache.adopt(slot, start, kv)

    def release_slots(self, first: int) -> None:
        for slot in range(max(0, first), self.slots):
            self.cache.free(slot)

    def _begin(self, first_slot: int, tokens: Sequence[Sequence[int]], starts: Sequence[int]) -> PaddedPass:
        """Check and lay out one pass and give each row blocks it alone holds for the
        positions it writes (its real tokens': padding is never written)."""
        plan = padded_pass(
            tokens, starts, slots=self.slots, first_slot=first_slot, context=self.context_length
        )
        for i, (start, row) in enumerate(zip(starts, tokens, strict=True)):
            self.cache.prepare(first_slot + i, start, start + len(row))
        return plan

    def forward(
        self,
        first_slot: int,
        tokens: Sequence[Sequence[int]],
        starts: Sequence[int],
        *,
        tail: Sequence[int] | None = None,
    ) -> torch.Tensor:
        plan = self._begin(first_slot, tokens, starts)
        if self._kernels is not None:
            if self._stack is not None:
                return self._stacked_forward(self._kernels, self._stack, first_slot, plan, tail)
            return self._compiled_forward(self._kernels, first_slot, plan, tail)
        rows, width = plan.ids.shape
        heads, kv_heads, dim = self._heads, self._kv_heads, self._head_dim
        group = heads // kv_heads
        dtype = self._dtype

        angles = plan.positions[..., None].float() * self._inv_freq
        angles = torch.cat((angles, angles), dim=-1)
        # [rows, 1 (heads), width, rotary width], broadcast over heads.
        cos = (angles.cos() * self._rope_scale).to(dtype)[:, None]
        sin = (angles.sin() * self._rope_scale).to(dtype)[:, None]
        masks: dict[int, torch.Tensor] = {}

        # Per-token work runs on h [tokens, hidden]: the real tokens only, row after row.
        real = _real_tokens(plan.lengths, width)
        slot_of = torch.arange(first_slot, first_slot + rows).repeat_interleave(width)
        pos_of = plan.positions.flatten()
        if real is not None:
            slot_of, pos_of = slot_of[real], pos_of[real]
        ids = plan.ids.flatten()
        h = self._embed(ids if real is None else ids[real])
        k_end = (heads + kv_heads) * dim
        for i, layer in enumerate(self._layers):
            if layer.window not in masks:
                masks[layer.window] = _attention_mask(plan, layer.window, group, dtype)
            x = _rms_norm(h, layer.attn_norm, layer.attn_eps)
            qkv = _padded(layer.qkv(x), real, rows, width)
            # Queries and keys together: [rows, heads + kv_heads, width, dim].
            qk = _normed_heads(qkv[..., :k_end].view(rows, width, heads + kv_heads, dim), heads, layer.rope)
            qk = qk.transpose(1, 2)
            if layer.rope.rotate:
                qk = _rotate(qk, cos, sin)
            v = qkv[..., k_end:].view(rows, width, kv_heads, dim)
            new_keys = qk[:, heads:].transpose(1, 2).reshape(rows * width, kv_heads, dim)
            new_values = v.reshape(rows * width, kv_heads, dim)
            if real is not None:
                new_keys, new_values = new_keys[real], new_values[real]
            self.cache.write_tokens(i, slot_of, pos_of, new_keys, new_values)
            keys, values = (pool.to(dtype) for pool in self.cache.read_rows(i, first_slot, rows, plan.span))
            folded = qk[:, :heads].reshape(rows, kv_heads, group * width, dim)
            attended = F.scaled_dot_product_attention(
                folded, keys, values, attn_mask=masks[layer.window], scale=layer.scaling
            )
            attended = (
                attended.reshape(rows, heads, width, dim).transpose(1, 2).reshape(rows * width, heads * dim)
            )
            h = h + layer.out(attended if real is None else attended[real])
            x = _rms_norm(h, layer.mlp_norm, layer.mlp_eps)
            gate, up = layer.gate_up(x).chunk(2, dim=-1)
            h = h + layer.down(F.silu(gate) * up)
        last = tail_positions(plan.lengths, tail, width=width if real is None else None)
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
        self,
        kernels: CpuKernels,
        stack: ctypes.Array[LayerPointers],
        first_slot: int,
        plan: PaddedPass,
        tail: Sequence[int] | None,
    ) -> torch.Tensor:
        """The pass with every layer in one kernel call (int8 weights on the kernels)."""
        if stack[0].keys != self.cache.keys[0].data_ptr():  # the pools grew: new buffers
            for entry, keys, values in zip(stack, self.cache.keys, self.cache.values, strict=True):
                entry.keys, entry.values = keys.data_ptr(), values.data_ptr()
        packed = self._packed_tokens(first_slot, plan)
        h = self._embed(packed.ids).contiguous()
        kernels.decoder_layers(
            h, stack, heads=self._heads, kv_heads=self._kv_heads, dim=self._head_dim,
            inter=self._inter, rot_half=self._inv_freq.numel(),
            cos=packed.cos, sin=packed.sin, slot_of=packed.slot_of, pos_of=packed.pos_of,
            pages=Pages(self.cache.table, self.cache.block_tokens, self.cache.num_blocks, self.cache.dtype),
            span=plan.span,
        )  # fmt: skip
        last = tail_positions(plan.lengths, tail, width=None)
        return self._logits(kernels.rms_norm(h[last], self._norm, self._norm_eps))

    def _compiled_forward(
        self, kernels: CpuKernels, first_slot: int, plan: PaddedPass, tail: Sequence[int] | None
    ) -> torch.Tensor:
        """The same pass on the compiled kernels: every step on the real tokens, packed."""
        packed = self._packed_tokens(first_slot, plan)
        ids, slot_of, pos_of, cos, sin = packed.ids, packed.slot_of, packed.pos_of, packed.cos, packed.sin
        heads, kv_heads = self._heads, self._kv_heads
        h = self._embed(ids)
        for i, layer in enumerate(self._layers):
            keys, values = self.cache.keys[i], self.cache.values[i]
            qkv = layer.qkv(kernels.rms_norm(h, layer.attn_norm, layer.attn_eps))
            table = self.cache.table
            kernels.rope_store(
                qkv, heads=heads, kv_heads=kv_heads, cos=cos, sin=sin, slot_of=slot_of, pos_of=pos_of,
                keys=keys, values=values, table=table, layout=layer.rope,
            )  # fmt: skip
            attended = kernels.attention(
                qkv, heads=heads, kv_heads=kv_heads, slot_of=slot_of, pos_of=pos_of, span=plan.span,
                keys=keys, values=values, table=table, scale=layer.scaling, window=layer.window,
            )  # fmt: skip
            h = h + layer.out(attended)
            x = kernels.rms_norm(h, layer.mlp_norm, layer.mlp_eps)
            h = h + layer.down(kernels.silu_mul(layer.gate_up(x)))
        last = tail_positions(plan.lengths, tail, width=None)
        return self._logits(kernels.rms_norm(h[last], self._norm, self._norm_eps))


def _attention_mask(plan: PaddedPass, window: int, group: int, dtype: torch.dtype) -> torch.Tensor:
    """The additive SDPA mask of a pass ``[rows, 1, group * width, span]``: each query sees
    its slot's positions up to its own, the last ``window`` of them where ``window > 0``.
    The query heads sharing a key/value head are folded into the query length (index
    ``g * width + j``), so the mask repeats once per head of the group."""
    visible = plan.visible()
    if window > 0:
        visible = visible & (torch.arange(plan.span)[None, None, :] > plan.positions[:, :, None] - window)
    mask = torch.zeros(visible.shape, dtype=dtype).masked_fill_(~visible, float("-inf"))[:, None]
    if group > 1 and plan.ids.shape[1] > 1:
        mask = mask.repeat(1, 1, group, 1)
    return mask


class _PackedTokens(NamedTuple):
    """A pass's real tokens, packed row after row: ids, cache slot and position ``[T]``,
    rotary ``cos``/``sin [T, rotary pairs]``."""

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


def default_runner(
    model: Any,
    *,
    slots: int,
    context_length: int,
    vocab_size: int,
    kv_cache_bytes: int = DEFAULT_KV_BYTES,
    prefix_cache_bytes: int = DEFAULT_PREFIX_BYTES,
    kv_cache_dtype: torch.dtype | None = None,
) -> ModelRunner:
    """:class:`DecoderRunner` for the models its architecture registry computes exactly
    (fewer operations per step), the transformers runner for any other (logging why;
    at most :attr:`TransformersRunner.most_slots` of the ``slots``); either within the
    budgets given (:class:`~thinkstruct.engine.kv.budget.KvBudget`).

    Raises:
        ValueError: a ``kv_cache_dtype`` for a model the decoder runner cannot run (the
            transformers runner keeps the model's dtype), naming why.
    """
    reason = supports(model, context_length=context_length)
    if reason is None:
        return DecoderRunner(
            model, slots=slots, context_length=context_length, vocab_size=vocab_size,
            kv_cache_bytes=kv_cache_bytes, prefix_cache_bytes=prefix_cache_bytes, kv_cache_dtype=kv_cache_dtype,
        )  # fmt: skip
    if kv_cache_dtype is not None:
        raise ValueError(f"a KV cache dtype needs the decoder runner, which cannot run this model: {reason}")
    log.info("transformers runner (not the decoder runner: %s)", reason)
    return TransformersRunner(
        model,
        slots=min(slots, TransformersRunner.most_slots),
        context_length=context_length,
        vocab_size=vocab_size,
        kv_cache_bytes=kv_cache_bytes,
        prefix_cache_bytes=prefix_cache_bytes,
    )
