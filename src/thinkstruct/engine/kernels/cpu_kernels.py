"""Compiled CPU kernels for the decoder runner's float32 passes: :func:`cpu_kernels`.

A decoding step of a small model makes hundreds of small torch operations, and on two
cores each costs more in dispatch and OpenMP wake-ups than in arithmetic (measured on
SmolLM2-135M at batch 8: SDPA 406 µs a layer for one query token a row, an RMS norm
79 µs). ``cpu_kernels.c`` does a layer's glue in four calls: RMS norm, per-head q/k norm
and rotary positions (any rotary table, partial or none) plus the KV cache write,
attention over each token's own slot (or its sliding window), and the gated SiLU; the
matrix multiply of :class:`~thinkstruct.engine.weights.int8_weights.Int8Linear` (int8 weights,
float32 activations, an optional bias; 8-row AVX-512 tiles where the CPU has them, the
same bits); :meth:`CpuKernels.decoder_layers`, a whole decoder stack of int8-weight layers
in one parallel region; and the engine's sampling and grammar-mask application.

The C file is compiled once per machine (:data:`FLAGS`, about a second) into ``cache_dir()/kernels``, under a name that hashes the source, the flags and
the compiler, written to a temporary name and renamed, so a killed build leaves no
half-written library. It is loaded after torch, so its OpenMP is torch's runtime and
threads. Without an x86-64 CPU with AVX2 and FMA, without a C compiler, or with
``THINKSTRUCT_CPU_KERNELS=0``, :func:`cpu_kernels` is ``None`` and the runner keeps its
torch operations (:func:`unavailable_reason` says why).

Every kernel computes a token's result from that token's inputs and its own slot's cache,
in an order that does not depend on the other tokens of the pass: a seeded request gets
the same tokens whatever else is batched with it.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import NamedTuple

import torch

from thinkstruct.tokenizer import cache_dir

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu_kernels.c")
#: The files ``cpu_kernels.c`` includes (part of the build's hash).
INCLUDED = (Path(__file__).with_name("gguf_blocks.c"),)
#: ``-ffp-contract=off``: a multiply and an add stay two roundings (never fused into one
#: FMA by the compiler), so the AVX2 and AVX-512 tiles give the same bits. Functions and
#: loops 64-byte aligned: the GGUF tiles' unrolled loops ran 10-12 % slower for 4-8 rows
#: when code added elsewhere in the library moved them (the same instructions; measured
#: with ``benchmarks/gguf_matvec.py --other``), and at parity again aligned.
FLAGS = (
    "-O3", "-mavx2", "-mfma", "-mf16c", "-ffp-contract=off", "-falign-functions=64", "-falign-loops=64",
    "-fopenmp", "-shared", "-fPIC",
)  # fmt: skip
#: Set to ``0`` to run the decoder runner on torch operations only.
DISABLE_ENV = "THINKSTRUCT_CPU_KERNELS"

#: The weight format code of int8 rows with per-row scales (``TS_INT8``).
INT8 = 0


class BlockFormat(NamedTuple):
    """A GGUF block format the kernels run: its code in ``gguf_blocks.c`` and the sections
    of a packed block of 32 weights of one row, in order: ``(bytes, unit)`` each, a group
    of 16 rows holding each section as ``[bytes / unit][16 rows][unit]`` (a float16 ``d``
    is ``(2, 2)``, Q4's nibbles ``(16, 2)``: two bytes of each row side by side)."""

    code: int
    sections: tuple[tuple[int, int], ...]

    @property
    def block_bytes(self) -> int:
        """Bytes of one packed block of 32 weights of one row."""
        return sum(size for size, _ in self.sections)

    @property
    def group_bytes(self) -> int:
        """Bytes of one packed group of 16 output rows x 32 inputs."""
        return 16 * self.block_bytes

    def packed_bytes(self, outputs: int, inputs: int) -> int:
        """Bytes of a packed ``[outputs, inputs]`` weight."""
        return outputs // 16 * (inputs // 32) * self.group_bytes


#: The GGUF block formats the kernels run, by ggml type name: the one list (``--quantize
#: gguf`` and its default follow it). Q5, Q4_K and Q6_K blocks are regrouped first
#: (:func:`~thinkstruct.engine.weights.gguf_weights.pack_blocks`).
GGUF_FORMATS = {
    "Q4_0": BlockFormat(1, ((2, 2), (16, 2))),  # f16 d, nibbles
    "Q4_1": BlockFormat(2, ((2, 2), (2, 2), (16, 2))),  # f16 d, f16 m, nibbles
    "Q8_0": BlockFormat(3, ((2, 2), (32, 2))),  # f16 d, int8
    "Q4_K": BlockFormat(4, ((2, 2), (2, 2), (1, 1), (1, 1), (16, 2))),  # f16 d, f16 dmin, sc, mn, nibbles
    "Q6_K": BlockFormat(5, ((2, 2), (1, 1), (1, 1), (16, 2), (8, 1))),  # f16 d, 2 x int8 sc, ql, qh
    "Q5_0": BlockFormat(6, ((2, 2), (16, 2), (4, 1))),  # f16 d, nibbles, fifth bits
    "Q5_1": BlockFormat(7, ((2, 2), (2, 2), (16, 2), (4, 1))),  # f16 d, f16 m, nibbles, fifth bits
}

_i64 = ctypes.c_int64
_ptr = ctypes.c_void_p
_f32 = ctypes.c_float


class LayerPointers(ctypes.Structure):
    """``ts_layer`` of ``cpu_kernels.c``: one decoder layer's parameters, by address (the
    tensors must outlive every call that reads them; 0 for an absent bias or q/k norm),
    ``rotate`` (0: no rotary positions), ``window`` (a sliding window; 0: none), each
    projection's weight format (``*_format``: :data:`INT8` or a :data:`GGUF_FORMATS`
    code) and, for GGUF q/k/v of two formats, the second one's blocks (``qkv_tail``, of
    ``qkv_tail_format``, from output block ``qkv_split`` of 16 on; 0: one format)."""

    _fields_ = [
        *((name, _ptr) for name in ("attn_norm", "mlp_norm", "qkv", "out", "gate_up", "down")),
        *((name, _ptr) for name in ("qkv_scale", "out_scale", "gate_up_scale", "down_scale")),
        *((name, _ptr) for name in ("qkv_bias", "out_bias", "gate_up_bias", "down_bias")),
        ("q_norm", _ptr),
        ("k_norm", _ptr),
        ("keys", _ptr),
        ("values", _ptr),
        ("rotate", _i64),
        ("window", _i64),
        *((f"{name}_format", _i64) for name in ("qkv", "out", "gate_up", "down")),
        ("attn_eps", _f32),
        ("mlp_eps", _f32),
        ("qk_eps", _f32),
        ("scaling", _f32),
        ("qkv_tail", _ptr),
        ("qkv_tail_format", _i64),
        ("qkv_split", _i64),
    ]


#: The element types a KV pool may hold on the kernels (float16: half the bytes attention
#: reads; each value rounded to nearest even when written, converted exactly when read).
POOL_DTYPES = (torch.float32, torch.float16)


class Pages(NamedTuple):
    """The block table of a paged KV cache, as the kernels read it: ``table`` (int64
    ``[slots, max_blocks]``, contiguous) holds the block of position ``p`` of slot ``s`` at
    ``[s, p // block_tokens]``; every layer's pools are ``[kv_heads, num_blocks,
    block_tokens, dim]`` of ``dtype`` (one of :data:`POOL_DTYPES`)."""

    table: torch.Tensor
    block_tokens: int
    num_blocks: int
    dtype: torch.dtype

    @staticmethod
    def of(keys: torch.Tensor, values: torch.Tensor, table: torch.Tensor) -> Pages:
        """The table over one layer's pools ``keys``/``values``.

        Raises:
            ValueError: pools that are not contiguous float32 or float16 of one shape and
                dtype.
        """
        if (
            keys.dim() != 4
            or keys.shape != values.shape
            or keys.dtype not in POOL_DTYPES
            or values.dtype != keys.dtype
            or not keys.is_contiguous()
            or not values.is_contiguous()
        ):
            raise ValueError(
                "the key/value pools must be contiguous float32 or float16 [kv_heads, num_blocks, block_tokens, "
                f"dim] of one dtype, got {keys.dtype} {list(keys.shape)} and {values.dtype} {list(values.shape)}"
            )
        return Pages(table, int(keys.shape[2]), int(keys.shape[1]), keys.dtype)

    def arguments(self) -> tuple[int, int, int, int, int]:
        """``table, max_blocks, block_tokens, num_blocks, half`` for a kernel call."""
        half = int(self.dtype == torch.float16)
        return self.table.data_ptr(), int(self.table.shape[1]), self.block_tokens, self.num_blocks, half


class RopeLayout(NamedTuple):
    """What a layer does to its query and key heads before attention: ``q_norm`` /
    ``k_norm`` (``[dim]``, an RMS norm of every head; ``None``: none) with ``eps``, and
    ``rotate`` (``False``: no rotary positions)."""

    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None
    eps: float = 1e-6
    rotate: bool = True


_SIGNATURES: dict[str, list[type]] = {
    "ts_rms_norm": [_ptr, _i64, _i64, _i64, _ptr, _f32, _ptr, _i64],
    "ts_silu_mul": [_ptr, _i64, _i64, _ptr],
    "ts_rope_store": [
        *(_ptr, _i64, _i64, _i64, _i64, _i64),  # qkv, tokens, ld, heads, kv_heads, dim
        *(_ptr, _ptr, _f32, _i64, _i64),  # q_norm, k_norm, qk_eps, rot_half, rotate
        *(_ptr, _ptr, _ptr, _ptr, _ptr, _ptr),  # cos, sin, slot_of, pos_of, keys, values
        *(_ptr, _i64, _i64, _i64, _i64),  # table, max_blocks, block_tokens, num_blocks, half
    ],
    "ts_w8_linear": [_ptr, _i64, _i64, _i64, _ptr, _ptr, _ptr, _i64, _ptr, _i64],
    "ts_sample": [_ptr, _i64, _i64, _i64, _ptr, _ptr, _ptr],
    "ts_apply_bitmask": [_ptr, _i64, _i64, _ptr, _i64, _i64, _ptr, _i64],
    "ts_attention": [
        *(_ptr, _i64, _i64, _i64, _i64, _i64),  # qkv, tokens, ld, heads, kv_heads, dim
        *(_ptr, _ptr, _ptr, _ptr),  # slot_of, pos_of, keys, values
        *(_ptr, _i64, _i64, _i64, _i64),  # table, max_blocks, block_tokens, num_blocks, half
        *(_i64, _i64, _f32, _ptr, _i64),  # span, window, scale, out, ld_out
    ],
}


class CpuKernels:
    """The compiled kernels, on float32 tensors whose last dimension is contiguous.

    Token layouts as in ``cpu_kernels.c``: a pass's ``T`` tokens packed; ``slot_of`` and
    ``pos_of`` (int64 ``[T]``) say which cache slot and position each token is.
    """

    def __init__(self, library: ctypes.CDLL) -> None:
        for name, argtypes in _SIGNATURES.items():
            function = getattr(library, name)
            function.argtypes = argtypes
            function.restype = None
        # These check their sizes (and block tables, allocations) and return a status.
        for name in ("ts_rms_norm", "ts_w8_linear", "ts_rope_store", "ts_attention"):
            getattr(library, name).restype = ctypes.c_int
        library.ts_gguf_linear.argtypes = [_i64, _ptr, _i64, _i64, _i64, _ptr, _ptr, _i64, _ptr, _i64]
        library.ts_gguf_dequantize.argtypes = [_i64, _ptr, _i64, _i64, _ptr]
        library.ts_gguf_linear.restype = library.ts_gguf_dequantize.restype = ctypes.c_int
        library.ts_use_avx512.argtypes = [ctypes.c_int]
        library.ts_use_avx512.restype = ctypes.c_int
        library.ts_decoder_layers.argtypes = [
            *(
                _ptr,
                _i64,
                _i64,
                _i64,
                _i64,
                _i64,
                _i64,
                _i64,
            ),  # h, T, hidden, heads, kv_heads, dim, inter, rot_half
            *(ctypes.POINTER(LayerPointers), _i64),  # layers, n_layers
            *(_ptr, _ptr, _ptr, _ptr),  # cos, sin, slot_of, pos_of
            *(_ptr, _i64, _i64, _i64, _i64, _i64),  # table, max_blocks, block_tokens, num_blocks, half, span
        ]
        library.ts_decoder_layers.restype = ctypes.c_int
        self._lib = library

    def use_avx512(self, on: bool) -> bool:
        """Run the AVX-512 code where the CPU has it — the default: the int8-weight
        multiply's tiles (up to 8 rows in one pass over the weights), the GGUF blocks'
        and attention's — or the AVX2 code only; the same bits either way. Returns whether
        the AVX-512 code now runs."""
        return bool(self._lib.ts_use_avx512(int(on)))

    def __deepcopy__(self, memo: dict[int, object]) -> CpuKernels:
        # One loaded library per process: a copied model (copy.deepcopy of a model with
        # int8-weight layers) shares it.
        return self

    def w8_linear(
        self, x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``x [M, K] @ W.T (+ bias [N])`` for int8 ``W [N, K]`` with row scales ``scale
        [N]``, given as ``packed [N / 16, K, 16]`` (see
        :class:`~thinkstruct.engine.weights.int8_weights.Int8Linear`): ``[M, N]``.

        Raises:
            ValueError: shapes, dtypes or layouts that do not fit together (named).
            MemoryError: the kernel's scratch could not be allocated.
        """
        rows, inner = _float_rows("x", x)
        outputs = scale.shape[0]
        if (
            packed.dtype != torch.int8
            or tuple(packed.shape) != (outputs // 16, inner, 16)
            or not packed.is_contiguous()
        ):
            raise ValueError(
                f"w8_linear: packed must be contiguous int8 [{outputs} / 16, {inner}, 16] for {outputs} "
                f"outputs over {inner} inputs, got {packed.dtype} {list(packed.shape)}"
            )
        for name, vector in (("scale", scale), ("bias", bias)):
            if vector is not None and (
                vector.dtype != torch.float32 or vector.shape != (outputs,) or not vector.is_contiguous()
            ):
                raise ValueError(
                    f"w8_linear: {name} must be contiguous float32 [{outputs}], got {list(vector.shape)}"
                )
        out = torch.empty((rows, outputs), dtype=torch.float32)
        status = self._lib.ts_w8_linear(
            x.data_ptr(),
            rows,
            inner,
            x.stride(0),
            packed.data_ptr(),
            scale.data_ptr(),
            None if bias is None else bias.data_ptr(),
            outputs,
            out.data_ptr(),
            outputs,
        )
        _check_status("w8_linear", status, f"{outputs} outputs (a multiple of 16) over {inner} inputs")
        return out

    def gguf_linear(
        self, x: torch.Tensor, fmt: str, packed: torch.Tensor, outputs: int, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``x [M, K] @ W.T (+ bias [outputs])`` for the GGUF blocks of format ``fmt`` (a
        :data:`GGUF_FORMATS` name) holding ``W [outputs, K]``, packed as ``gguf_blocks.c``
        says (uint8, contiguous): ``[M, outputs]``.

        Raises:
            ValueError: sizes or a format the kernel does not take (outputs % 16, K % 32).
            MemoryError: the kernel's scratch could not be allocated.
        """
        rows, inner = _float_rows("x", x)
        _check_packed("gguf_linear", fmt, packed, outputs, inner)
        if bias is not None and (
            bias.dtype != torch.float32 or bias.shape != (outputs,) or not bias.is_contiguous()
        ):
            raise ValueError(
                f"gguf_linear: bias must be contiguous float32 [{outputs}], got {list(bias.shape)}"
            )
        out = torch.empty((rows, outputs), dtype=torch.float32)
        status = self._lib.ts_gguf_linear(
            GGUF_FORMATS[fmt].code, x.data_ptr(), rows, inner, x.stride(0), packed.data_ptr(),
            None if bias is None else bias.data_ptr(), outputs, out.data_ptr(), outputs,
        )  # fmt: skip
        _check_status(
            "gguf_linear", status, f"format {fmt}, {outputs} outputs (% 16) over {inner} inputs (% 32)"
        )
        return out

    def gguf_dequantize(self, fmt: str, packed: torch.Tensor, outputs: int, inputs: int) -> torch.Tensor:
        """The float32 weights ``[outputs, inputs]`` that packed GGUF blocks of format
        ``fmt`` (a :data:`GGUF_FORMATS` name) hold, as ggml dequantizes them.

        Raises:
            ValueError: sizes or a format the kernel does not take.
        """
        _check_packed("gguf_dequantize", fmt, packed, outputs, inputs)
        out = torch.empty((outputs, inputs), dtype=torch.float32)
        status = self._lib.ts_gguf_dequantize(
            GGUF_FORMATS[fmt].code, packed.data_ptr(), outputs, inputs, out.data_ptr()
        )
        _check_status("gguf_dequantize", status, f"format {fmt}, {outputs} rows (% 16) of {inputs} (% 32)")
        return out

    def decoder_layers(
        self,
        h: torch.Tensor,
        layers: ctypes.Array[LayerPointers],
        *,
        heads: int,
        kv_heads: int,
        dim: int,
        inter: int,
        rot_half: int,
        cos: torch.Tensor,
        sin: torch.Tensor,
        slot_of: torch.Tensor,
        pos_of: torch.Tensor,
        pages: Pages,
        span: int,
    ) -> None:
        """Run ``h [T, hidden]`` (the residual stream, updated in place) through every
        layer of ``layers`` in one call: norms, int8-weight projections with their biases,
        q/k norms and rotary positions with the cache write, attention and gated SiLU, as
        the separate kernels compute them. ``cos``/``sin [T, rot_half]``, ``slot_of``/
        ``pos_of [T]`` and the cache's block table ``pages`` (every layer's pools of
        ``pages.num_blocks`` blocks) as for :meth:`rope_store` and :meth:`attention`.

        Raises:
            ValueError: sizes the kernel does not take (``cpu_kernels.c`` lists them), or a
                block table that does not cover every token's positions.
            MemoryError: its buffers could not be allocated (``h`` is unchanged).
        """
        for name, tensor in {"h": h, "cos": cos, "sin": sin}.items():
            if tensor.dtype != torch.float32 or not tensor.is_contiguous():
                raise ValueError(f"decoder_layers takes a contiguous float32 {name}")
        tokens = h.shape[0]
        if cos.shape != (tokens, rot_half) or sin.shape != (tokens, rot_half):
            raise ValueError(f"cos/sin must be [{tokens}, {rot_half}], got {tuple(cos.shape)}")
        _check_tokens(tokens, slot_of, pos_of, pages)
        status = self._lib.ts_decoder_layers(
            h.data_ptr(), tokens, h.shape[1], heads, kv_heads, dim, inter, rot_half,
            layers, len(layers), cos.data_ptr(), sin.data_ptr(), slot_of.data_ptr(),
            pos_of.data_ptr(), *pages.arguments(), span,
        )  # fmt: skip
        if status == -2:
            raise ValueError(
                f"decoder_layers cannot take hidden {h.shape[1]}, {heads} heads over {kv_heads} of "
                f"{dim} (rotary {2 * rot_half}), MLP {inter}, span {span}"
            )
        if status == -3:
            raise ValueError(_UNCOVERED)
        if status != 0:
            raise MemoryError(f"decoder_layers could not allocate its buffers for {tokens} tokens")

    def sample(self, logits: torch.Tensor, inv_temperature: list[float], draws: list[float]) -> list[int]:
        """One token per row of float32 ``logits [rows, vocab]``: row ``r`` greedy (its
        first largest logit) where ``inv_temperature[r]`` is 0, otherwise drawn from
        ``softmax(logits[r] * inv_temperature[r])`` by the uniform ``draws[r]`` in [0, 1)
        (the first token whose cumulative mass passes it; a ``-inf`` logit is never
        picked). ``-1`` for a row whose logits are all ``-inf``."""
        rows, vocab = logits.shape
        scales = torch.tensor(inv_temperature, dtype=torch.float32)
        uniforms = torch.tensor(draws, dtype=torch.float32)
        out = torch.empty(rows, dtype=torch.int64)
        self._lib.ts_sample(
            logits.data_ptr(),
            rows,
            vocab,
            logits.stride(0),
            scales.data_ptr(),
            uniforms.data_ptr(),
            out.data_ptr(),
        )
        picks: list[int] = out.tolist()
        return picks

    def apply_bitmask(self, logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
        """Set ``logits [batch, vocab]`` (float32) to ``-inf`` in place where ``bitmask
        [batch, words]`` (int32, bit ``j % 32`` of word ``j / 32``, 1 = allowed) disallows,
        in the listed ``rows`` (the same row of both); columns past ``32 * words`` are
        disallowed. What :func:`thinkstruct.grammar.runtime.bitmask.apply_bitmask_inplace` does."""
        if logits.dtype != torch.float32 or logits.stride(-1) != 1:
            raise ValueError("apply_bitmask takes float32 logits with contiguous rows")
        if bitmask.dtype != torch.int32 or bitmask.stride(-1) != 1:
            raise ValueError("apply_bitmask takes an int32 bitmask with contiguous rows")
        if rows and not (min(rows) >= 0 and max(rows) < min(logits.shape[0], bitmask.shape[0])):
            raise ValueError(f"rows {rows} outside the batch")
        index = torch.tensor(rows, dtype=torch.int64)
        self._lib.ts_apply_bitmask(
            logits.data_ptr(), logits.shape[1], logits.stride(0), bitmask.data_ptr(),
            bitmask.shape[1], bitmask.stride(0), index.data_ptr(), len(rows),
        )  # fmt: skip

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """``x [rows, dim]`` normalized by its root mean square, times ``weight [dim]``.

        Raises:
            ValueError: ``dim`` not a multiple of 8, or shapes, dtypes or layouts that do
                not fit together (named).
        """
        rows, dim = _float_rows("x", x)
        if weight.dtype != torch.float32 or weight.shape != (dim,) or not weight.is_contiguous():
            raise ValueError(f"rms_norm: weight must be contiguous float32 [{dim}], got {list(weight.shape)}")
        out = torch.empty((rows, dim), dtype=torch.float32)
        status = self._lib.ts_rms_norm(
            x.data_ptr(), rows, dim, x.stride(0), weight.data_ptr(), eps, out.data_ptr(), dim
        )
        _check_status("rms_norm", status, f"rows of {dim} (a multiple of 8)")
        return out

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` of ``gate_up [T, 2 * inter]`` (gate first): ``[T, inter]``."""
        tokens, width = gate_up.shape
        out = torch.empty((tokens, width // 2), dtype=torch.float32)
        self._lib.ts_silu_mul(gate_up.data_ptr(), tokens, width // 2, out.data_ptr())
        return out

    def rope_store(
        self,
        qkv: torch.Tensor,
        *,
        heads: int,
        kv_heads: int,
        cos: torch.Tensor,
        sin: torch.Tensor,
        slot_of: torch.Tensor,
        pos_of: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        table: torch.Tensor,
        layout: RopeLayout | None = None,
    ) -> None:
        """Normalize (``layout.q_norm``/``k_norm``) and rotate ``qkv [T, (heads + 2
        kv_heads) * dim]``'s query and key heads in place, the first ``2 * rot_half`` values
        of each by ``cos``/``sin [T, rot_half]`` (unless ``layout.rotate`` is off), and
        store the keys and values in the pools ``[kv_heads, num_blocks, block_tokens,
        dim]`` at each token's slot and position: block ``table[slot, pos //
        block_tokens]`` (int64 ``[slots, max_blocks]``), offset ``pos % block_tokens``.
        ``layout=None``: rotary only (Llama).

        Raises:
            ValueError: sizes it cannot take, or a table that does not cover every token's
                position (nothing written).
        """
        dim = keys.shape[-1]
        layout = layout or RopeLayout()
        pages = Pages.of(keys, values, table)
        _check_tokens(qkv.shape[0], slot_of, pos_of, pages)
        q_norm, k_norm = (None if n is None else n.data_ptr() for n in (layout.q_norm, layout.k_norm))
        status = self._lib.ts_rope_store(
            qkv.data_ptr(), qkv.shape[0], qkv.stride(0), heads, kv_heads, dim,
            q_norm, k_norm, layout.eps, cos.shape[-1], int(layout.rotate),
            cos.data_ptr(), sin.data_ptr(), slot_of.data_ptr(), pos_of.data_ptr(),
            keys.data_ptr(), values.data_ptr(), *pages.arguments(),
        )  # fmt: skip
        if status == -3:
            raise ValueError(_UNCOVERED)
        _check_status(
            "rope_store", status, f"heads of {dim} (a multiple of 8) and rotary pairs a multiple of 8"
        )

    def attention(
        self,
        qkv: torch.Tensor,
        *,
        heads: int,
        kv_heads: int,
        slot_of: torch.Tensor,
        pos_of: torch.Tensor,
        span: int,
        keys: torch.Tensor,
        values: torch.Tensor,
        table: torch.Tensor,
        scale: float,
        window: int = 0,
    ) -> torch.Tensor:
        """Each token's queries (in ``qkv``) attend to its slot's positions ``0..pos``, or
        with a sliding ``window`` (> 0) the positions after ``pos - window``, read from
        the pools through ``table`` (as for :meth:`rope_store`): ``[T, heads * dim]``.
        ``span``: more than every ``pos_of``.

        Raises:
            ValueError: sizes it cannot take, or a table that does not cover every token's
                positions.
            MemoryError: its scratch could not be allocated.
        """
        dim = keys.shape[-1]
        tokens = qkv.shape[0]
        pages = Pages.of(keys, values, table)
        _check_tokens(tokens, slot_of, pos_of, pages)
        out = torch.empty((tokens, heads * dim), dtype=torch.float32)
        status = self._lib.ts_attention(
            qkv.data_ptr(), tokens, qkv.stride(0), heads, kv_heads, dim,
            slot_of.data_ptr(), pos_of.data_ptr(), keys.data_ptr(), values.data_ptr(),
            *pages.arguments(), span, window, scale, out.data_ptr(), heads * dim,
        )  # fmt: skip
        if status == -3:
            raise ValueError(_UNCOVERED)
        _check_status(
            "attention", status, f"heads of {dim} (a multiple of 8, at most 256), positions below {span}"
        )
        return out


def unavailable_reason() -> str | None:
    """Why :func:`cpu_kernels` is ``None`` on this machine, or ``None`` when it is not."""
    if os.environ.get(DISABLE_ENV, "1") == "0":
        return f"{DISABLE_ENV}=0"
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"CPU architecture {platform.machine()}"
    flags = _cpu_flags()
    missing = [f for f in ("avx2", "fma", "f16c") if f not in flags]
    if missing:
        return f"the CPU lacks {', '.join(missing)}"
    if _compiler() is None:
        return "no C compiler (cc or gcc) on PATH"
    return None


@functools.cache
def cpu_kernels() -> CpuKernels | None:
    """The kernels, built on first use and cached; ``None`` where they cannot run (logged
    once, with the reason)."""
    reason = unavailable_reason()
    if reason is None:
        try:
            return CpuKernels(ctypes.CDLL(str(_built_library())))
        except subprocess.CalledProcessError as exc:
            reason = f"build failed: {exc}: {(exc.stderr or '').strip()[-2000:]}"
        except OSError as exc:
            reason = f"build or load failed: {exc}"
    log.info("CPU kernels off (%s): the decoder runner uses torch operations", reason)
    return None


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


def _built_library() -> Path:
    compiler = _compiler()
    assert compiler is not None  # unavailable_reason() checked it
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
    digest = hashlib.sha256()
    for part in (
        SOURCE.read_bytes(),
        *(p.read_bytes() for p in INCLUDED),
        " ".join(FLAGS).encode(),
        version.encode(),
    ):
        digest.update(part)
    target = cache_dir() / "kernels" / f"cpu_kernels-{digest.hexdigest()[:16]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=target.parent, suffix=".so.partial")
    os.close(fd)
    try:
        subprocess.run(
            [compiler, *FLAGS, "-o", partial, str(SOURCE)], capture_output=True, text=True, check=True
        )
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


def _float_rows(name: str, x: torch.Tensor) -> tuple[int, int]:
    """``(rows, width)`` of a 2-D float32 tensor whose rows are contiguous, else a
    ValueError naming it."""
    if x.dim() != 2 or x.dtype != torch.float32 or (x.shape[1] > 1 and x.stride(1) != 1):
        raise ValueError(f"{name} must be 2-D float32 with contiguous rows, got {x.dtype} {list(x.shape)}")
    return int(x.shape[0]), int(x.shape[1])


_UNCOVERED = "the block table does not give every position of these tokens a block of the pool"


def _check_tokens(tokens: int, slot_of: torch.Tensor, pos_of: torch.Tensor, pages: Pages) -> None:
    """Raise ValueError unless ``slot_of``/``pos_of`` are int64 ``[tokens]`` and the
    table is contiguous int64 ``[slots, max_blocks]`` with every token's slot in it (the
    kernel checks the entries themselves)."""
    for name, tensor in (("slot_of", slot_of), ("pos_of", pos_of)):
        if tensor.dtype != torch.int64 or tensor.shape != (tokens,) or not tensor.is_contiguous():
            raise ValueError(
                f"{name} must be contiguous int64 [{tokens}], got {tensor.dtype} {list(tensor.shape)}"
            )
    table = pages.table
    if table.dtype != torch.int64 or table.dim() != 2 or not table.is_contiguous():
        raise ValueError(
            f"the block table must be contiguous int64 [slots, max_blocks], got {list(table.shape)}"
        )
    if tokens and not (int(slot_of.min()) >= 0 and int(slot_of.max()) < table.shape[0]):
        raise ValueError(f"a token's slot is outside the block table's {table.shape[0]} slots")


def _check_packed(kernel: str, fmt: str, packed: torch.Tensor, outputs: int, inputs: int) -> None:
    """A ValueError unless ``packed`` is contiguous uint8 holding ``[outputs, inputs]`` in
    the GGUF block format ``fmt`` (outputs % 16 == 0, inputs % 32 == 0)."""
    if fmt not in GGUF_FORMATS:
        raise ValueError(f"{kernel}: the kernels run {', '.join(GGUF_FORMATS)} blocks, not {fmt}")
    if outputs % 16 or inputs % 32 or outputs < 16 or inputs < 32:
        raise ValueError(f"{kernel}: {outputs} outputs (a multiple of 16) over {inputs} inputs (of 32)")
    expected = GGUF_FORMATS[fmt].packed_bytes(outputs, inputs)
    if packed.dtype != torch.uint8 or not packed.is_contiguous() or packed.numel() != expected:
        raise ValueError(
            f"{kernel}: packed {fmt} [{outputs}, {inputs}] is {expected} contiguous uint8, "
            f"got {packed.numel()} {packed.dtype}"
        )


def _check_status(kernel: str, status: int, sizes: str) -> None:
    """Raise for a kernel's status: -2 sizes it cannot take, -1 an allocation failed."""
    if status == -2:
        raise ValueError(f"{kernel} cannot take these sizes: it needs {sizes}")
    if status == -1:
        raise MemoryError(f"{kernel} could not allocate its scratch")
    if status != 0:
        raise RuntimeError(f"{kernel} returned {status}")
