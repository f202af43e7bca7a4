"""GGUF weights as the file ships them (``--quantize gguf``): :class:`GGUFLinear` and
:func:`quantize_gguf`.

A GGUF's Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K and Q6_K tensors are multiplied by the compiled
kernels block by block (:data:`~thinkstruct.engine.kernels.cpu_kernels.GGUF_FORMATS`, ``gguf_blocks.c``): the model
computes what its file says, where dequantizing to float and re-quantizing to int8
(``--quantize int8-weights``) rounds every weight a second time and reads more bytes a
step (int8 is 1.03 bytes a weight with its scales, Q4_1 0.625, Q5_0 0.6875, Q8_0 1.06;
Q4_K 0.6875 and Q6_K 0.875, their super-blocks regrouped into blocks of 32, exactly). The multiply
is integer: each row's activations are rounded to int16 per block of 32 (1/65534 of the
block's largest magnitude at most), multiplied by the block's quants in int32 lanes
(exact), then scaled by the block's ``d`` (and ``m`` times the block's float sum), so a
result is the file's weights' product up to that rounding and float summation order (on
SmolLM2 the float32 model's top-1 tokens, teacher-forced, 100 %).

The raw blocks are read through the file's tensor table (memory-mapped; ``gguf``'s own
reader parses the whole vocabulary first, 4 s for SmolLM2), mapped to the model's
``nn.Linear`` modules by the ``gguf`` package's tensor name map (as transformers maps
them), and their rows permuted where transformers' tensor processor permutes the
dequantized rows (llama.cpp's conversion interleaves the rotary halves of q and k; whole
rows of blocks move, exactly). Each
tensor's blocks are repacked once (16 output rows side by side, the same bytes) at load.
A Linear whose tensor is of another type (F16, Q5_K...) or of sizes the blocks do not fit
is quantized to int8 rows instead (:class:`~thinkstruct.engine.weights.int8_weights.Int8Linear`).
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from thinkstruct.engine.kernels.cpu_kernels import GGUF_FORMATS, CpuKernels, cpu_kernels
from thinkstruct.engine.weights.int8_weights import Int8Linear
from thinkstruct.parsers.gguf_metadata import GGUFTensorInfo, read_gguf_metadata, read_gguf_tensors


class GGUFLinear(torch.nn.Module):
    """``y = x @ W.T + bias`` for ``W [out, in]`` held as GGUF blocks of format ``fmt``
    (a :data:`GGUF_FORMATS` name), packed for the kernels (``packed``, uint8); float32
    ``x [..., in]`` -> float32 ``[..., out]``. Stacked layers of two formats (a Q4_K_M
    file's Q6_K v beside its Q4_K q and k) hold the last rows' blocks in ``tail``, a layer
    of its own without a bias.

    Args:
        fmt: the blocks' ggml type name.
        packed: the blocks, as :func:`pack_blocks` lays them out (the rows before
            ``tail``'s).
        out_features, in_features: ``W``'s shape (``% 16`` and ``% 32``), ``tail``'s rows
            included.
        kernels: the compiled kernels.
        bias: the float bias added to each output (kept float32), or ``None``.
        tail: the last rows, of another format.
    """

    packed: torch.Tensor
    bias: torch.Tensor | None
    fmt: str
    out_features: int
    in_features: int
    tail: GGUFLinear | None

    def __init__(
        self,
        fmt: str,
        packed: torch.Tensor,
        *,
        out_features: int,
        in_features: int,
        kernels: CpuKernels,
        bias: torch.Tensor | None = None,
        tail: GGUFLinear | None = None,
    ) -> None:
        super().__init__()
        head_rows = out_features - (0 if tail is None else tail.out_features)
        if fmt not in GGUF_FORMATS or packed.numel() != GGUF_FORMATS[fmt].packed_bytes(
            head_rows, in_features
        ):
            raise ValueError(
                f"{fmt} blocks of [{head_rows}, {in_features}] do not fit {packed.numel()} bytes"
            )
        if tail is not None and (
            tail.in_features != in_features or tail.bias is not None or tail.tail is not None
        ):
            raise ValueError("a tail must take the same inputs and have no bias or tail of its own")
        self.fmt = fmt
        self.out_features = out_features
        self.in_features = in_features
        self.tail = tail
        self._kernels = kernels
        self.register_buffer("packed", packed.contiguous(), persistent=False)
        stored_bias = None if bias is None else bias.detach().float().contiguous()
        self.register_buffer("bias", stored_bias, persistent=False)

    @property
    def code(self) -> int:
        """The format's code in ``gguf_blocks.c`` (``LayerPointers.*_format``)."""
        return GGUF_FORMATS[self.fmt].code

    @property
    def head_rows(self) -> int:
        """Rows in ``packed`` (the rest are ``tail``'s)."""
        return self.out_features - (0 if self.tail is None else self.tail.out_features)

    @staticmethod
    def stack_problem(parts: Sequence[GGUFLinear]) -> str | None:
        """Why ``parts`` do not stack (:meth:`stacked`), or ``None`` when they do."""
        first = parts[0]
        if any(p.in_features != first.in_features or p.tail is not None for p in parts):
            return "stacked GGUF layers must share their input size"
        if len(list(itertools.groupby(p.fmt for p in parts))) > 2:
            return "stacked GGUF layers must be at most two runs of one block format"
        return None

    @classmethod
    def stacked(cls, parts: Sequence[GGUFLinear]) -> GGUFLinear:
        """One layer computing ``parts`` over the same input, outputs concatenated in order
        (exact: packed row groups end to end; a second format's run of parts, if any, as
        the tail). Raises ValueError for parts of more than two runs of formats or of
        different input sizes."""
        problem = cls.stack_problem(parts)
        if problem is not None:
            raise ValueError(problem)
        first = parts[0]
        runs = [list(group) for _, group in itertools.groupby(parts, key=lambda p: p.fmt)]
        bias = None
        if any(p.bias is not None for p in parts):
            bias = torch.cat([torch.zeros(p.out_features) if p.bias is None else p.bias for p in parts])
        tail = None
        if len(runs) == 2:
            tail_parts = runs[1]
            tail = cls(
                tail_parts[0].fmt,
                torch.cat([p.packed for p in tail_parts]),
                out_features=sum(p.out_features for p in tail_parts),
                in_features=first.in_features,
                kernels=first._kernels,
            )
        return cls(
            first.fmt,
            torch.cat([p.packed for p in runs[0]]),
            out_features=sum(p.out_features for p in parts),
            in_features=first.in_features,
            kernels=first._kernels,
            bias=bias,
            tail=tail,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if rows.dtype != torch.float32 or rows.stride(-1) != 1:
            rows = rows.float().contiguous()
        if self.tail is None:
            out = self._kernels.gguf_linear(rows, self.fmt, self.packed, self.out_features, self.bias)
        else:
            head = self._kernels.gguf_linear(rows, self.fmt, self.packed, self.head_rows, None)
            out = torch.cat([head, self.tail(rows)], dim=-1)
            if self.bias is not None:
                out += self.bias
        return out.view(*x.shape[:-1], self.out_features)

    def dequantized(self) -> torch.Tensor:
        """The float32 weight ``[out, in]`` the blocks hold (as ggml dequantizes them)."""
        head = self._kernels.gguf_dequantize(self.fmt, self.packed, self.head_rows, self.in_features)
        return head if self.tail is None else torch.cat([head, self.tail.dequantized()])

    def extra_repr(self) -> str:
        bias = self.bias is not None
        formats = self.fmt if self.tail is None else f"{self.fmt} and {self.tail.fmt}"
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={bias}, {formats} blocks"
        )


def pack_blocks(fmt: str, raw: np.ndarray[Any, Any]) -> torch.Tensor:
    """A GGUF tensor's blocks ``raw [out, row bytes]`` (uint8, each row its blocks in
    order, as the file holds them) laid out for the kernels: ``[out / 16][in / 32]``
    groups, each the 16 rows' blocks section by section (:class:`BlockFormat`, as
    ``gguf_blocks.c`` reads them). Q5's fifth bits are regrouped and Q4_K's and Q6_K's
    super-blocks of 256 become blocks of 32 first (:data:`REGROUPED`); the other formats'
    bytes are only reordered."""
    spec = GGUF_FORMATS[fmt]
    if fmt in REGROUPED:
        raw = REGROUPED[fmt](raw)
    rows = raw.shape[0]
    nb = raw.shape[1] // spec.block_bytes
    blocks = np.ascontiguousarray(raw).reshape(rows // 16, 16, nb, spec.block_bytes)
    parts = []
    start = 0
    for size, unit in spec.sections:
        section = blocks[..., start : start + size].reshape(rows // 16, 16, nb, size // unit, unit)
        parts.append(section.transpose(0, 2, 3, 1, 4).reshape(rows // 16, nb, 16 * size))
        start += size
    return torch.from_numpy(np.ascontiguousarray(np.concatenate(parts, axis=-1)).reshape(-1))


#: Bytes of a Q4_K super-block: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128
#: bytes of nibbles for its 256 weights.
Q4_K_BYTES = 144


def q4_k_blocks(raw: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Q4_K super-blocks ``raw [rows, row bytes]`` as blocks of 32 of Q4_1's form: ``[rows,
    in / 32 * 22]``: the super-block's f16 ``d`` and ``dmin``, the 32's 6-bit ``sc`` and
    ``mn`` (ggml's ``get_scale_min_k4``) a byte each, and 16 bytes of nibbles (byte j:
    element j low, j + 16 high). The kernels take ``d sc`` and ``-dmin mn`` as the block's
    ``d`` and ``m``, exactly: an f16 times a 6-bit integer is a float32 number."""
    rows = raw.shape[0]
    sb = np.ascontiguousarray(raw).reshape(rows, -1, Q4_K_BYTES)
    n = sb.shape[1]
    q = sb[..., 4:16].astype(np.uint8)  # the 12 bytes of scales and mins
    sc = np.concatenate([q[..., 0:4] & 63, (q[..., 8:12] & 15) | ((q[..., 0:4] >> 6) << 4)], axis=-1)
    mn = np.concatenate([q[..., 4:8] & 63, (q[..., 8:12] >> 4) | ((q[..., 4:8] >> 6) << 4)], axis=-1)
    nibbles = sb[..., 16:].reshape(rows, n, 4, 1, 32)  # 32 bytes: sub-blocks 2j (low), 2j + 1 (high)
    elements = np.concatenate([nibbles & 15, nibbles >> 4], axis=3).reshape(rows, n, 8, 32)
    packed = (elements[..., :16] | (elements[..., 16:] << 4)).astype(np.uint8)
    heads = np.repeat(sb[..., None, 0:4], 8, axis=2)  # [rows, n, 8, d and dmin]
    return np.concatenate([heads, sc[..., None], mn[..., None], packed], axis=-1).reshape(rows, -1)


#: Bytes of a Q6_K super-block: 128 bytes of low 4 bits, 64 of high 2 bits, 16 int8
#: scales (one a 16 weights), f16 d.
Q6_K_BYTES = 210


def q6_k_blocks(raw: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Q6_K super-blocks ``raw [rows, row bytes]`` as the kernels' blocks of 32: ``[rows,
    in / 32 * 28]``: the super-block's f16 ``d``, the two 16s' int8 scales, 16 bytes of low
    4 bits (byte j: element j low, j + 16 high) and 8 of high 2 bits (byte c: elements 2c,
    2c + 1, 16 + 2c, 16 + 2c + 1). The same numbers, ``d sc (q - 32)``, regrouped."""
    rows = raw.shape[0]
    sb = np.ascontiguousarray(raw).reshape(rows, -1, Q6_K_BYTES)
    n = sb.shape[1]
    ql = sb[..., :128].reshape(rows, n, 2, 2, 32)  # [half, l / 32 block of ql, l]
    qh = sb[..., 128:192].reshape(rows, n, 2, 1, 32)
    # ggml: in each half of 128, element 32 j + l has ql[l + 32 (j % 2)] (low nibble for
    # j < 2, high for j >= 2) and bits 2 j of qh[l].
    low = np.concatenate([ql & 15, ql >> 4], axis=3)  # [rows, n, half, j, l]
    high = np.concatenate([(qh >> (2 * j)) & 3 for j in range(4)], axis=3)
    q = (low | (high << 4)).reshape(rows, n * 8, 32)  # 6-bit, blocks of 32 in order
    nibbles = (q[..., :16] & 15) | ((q[..., 16:] & 15) << 4)
    top = q >> 4
    pairs = top.reshape(rows, n * 8, 2, 8, 2)  # [16s, c, element 2c + i]
    highs = (
        pairs[:, :, 0, :, 0]
        | (pairs[:, :, 0, :, 1] << 2)
        | (pairs[:, :, 1, :, 0] << 4)
        | (pairs[:, :, 1, :, 1] << 6)
    )
    scales = sb[..., 192:208].reshape(rows, n * 8, 2)
    d = np.repeat(sb[..., 208:210], 8, axis=1)  # [rows, n * 8, 2]
    return np.concatenate([d, scales, nibbles.astype(np.uint8), highs.astype(np.uint8)], axis=-1).reshape(
        rows, -1
    )


def q5_blocks(raw: np.ndarray[Any, Any], *, mins: bool) -> np.ndarray[Any, Any]:
    """Q5_0 (``mins=False``: f16 d, 4 bytes of fifth bits, 16 of nibbles) or Q5_1 blocks
    (f16 d and m first) ``raw [rows, row bytes]`` with their fifth bits regrouped: ``[rows,
    in / 32 * (22 or 24)]``, the fields, the nibbles as they are, then 4 bytes: byte k's
    low nibble the bits of elements 4k, 4k + 1, 16 + 4k, 16 + 4k + 1, its high nibble
    those of 4k + 2, 4k + 3, 16 + 4k + 2, 16 + 4k + 3 (``gguf_blocks.c``)."""
    head = 4 if mins else 2
    rows = raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(rows, -1, head + 20)
    bits = np.unpackbits(blocks[..., head : head + 4], axis=-1, bitorder="little")  # bit j: element j
    e = bits.reshape(rows, -1, 2, 4, 4)  # [16s, k, t]: element 16 h + 4 k + t
    order = [e[:, :, 0, :, 0], e[:, :, 0, :, 1], e[:, :, 1, :, 0], e[:, :, 1, :, 1]]
    order += [e[:, :, 0, :, 2], e[:, :, 0, :, 3], e[:, :, 1, :, 2], e[:, :, 1, :, 3]]
    highs = np.packbits(np.stack(order, axis=-1), axis=-1, bitorder="little").reshape(rows, -1, 4)
    return np.concatenate([blocks[..., :head], blocks[..., head + 4 :], highs], axis=-1).reshape(rows, -1)


#: Formats whose blocks :func:`pack_blocks` regroups first (the others it only reorders).
REGROUPED: dict[str, Callable[[np.ndarray[Any, Any]], np.ndarray[Any, Any]]] = {
    "Q5_0": functools.partial(q5_blocks, mins=False),
    "Q5_1": functools.partial(q5_blocks, mins=True),
    "Q4_K": q4_k_blocks,
    "Q6_K": q6_k_blocks,
}


@dataclass(frozen=True)
class GGUFResult:
    """What :func:`quantize_gguf` did.

    Attributes:
        blocks: Linear layers now on the file's blocks (module name -> ggml type name).
        int8: Linear layers whose tensor the kernels do not run (another type, sizes the
            blocks do not fit), now int8 rows.
        seconds: wall time.
    """

    blocks: dict[str, str]
    int8: tuple[str, ...]
    seconds: float


def runs_blocks(path: Path) -> bool:
    """Whether the GGUF at ``path`` has quantized tensors of a block format the kernels
    run (and the kernels build here): ``--quantize``'s default then is ``gguf`` (a tensor
    of another type becomes int8 rows, as :func:`quantize_gguf` says)."""
    if cpu_kernels() is None:
        return False
    from gguf.constants import GGMLQuantizationType as T

    return any(T(t.type_id).name in GGUF_FORMATS for t in read_gguf_tensors(path))


def quantize_gguf(model: torch.nn.Module, path: Path) -> GGUFResult:
    """Replace every ``nn.Linear`` of the float32 ``model`` (loaded from the GGUF at
    ``path``) by a :class:`GGUFLinear` over the file's own blocks where the kernels run
    its type, otherwise by an int8-row :class:`Int8Linear`, in place.

    Raises:
        ValueError: the compiled kernels do not build here (the blocks run on them only).
    """
    started = time.perf_counter()
    kernels = cpu_kernels()
    if kernels is None:
        from thinkstruct.engine.kernels.cpu_kernels import unavailable_reason

        raise ValueError(
            f"--quantize gguf runs on the compiled kernels, which are off here ({unavailable_reason()})"
        )
    tensors = {t.name: t for t in read_gguf_tensors(path)}
    architecture = str(read_gguf_metadata(path, ["general.architecture"])["general.architecture"])
    names, processor = _name_map(model, architecture)
    data = np.memmap(path, dtype=np.uint8, mode="r")
    blocks: dict[str, str] = {}
    int8: list[str] = []
    for name, module in list(model.named_modules()):
        if type(module) is not torch.nn.Linear:
            continue
        gguf_name = names.get(name)
        tensor = tensors.get(f"{gguf_name}.weight") if gguf_name is not None else None
        replacement: torch.nn.Module | None = None
        if tensor is not None:
            replacement = _block_linear(module, tensor, data, processor, kernels)
        if isinstance(replacement, GGUFLinear):
            blocks[name] = replacement.fmt
        else:
            replacement = Int8Linear.from_linear(module, kernels=kernels)
            int8.append(name)
        parent_name, _, attribute = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attribute, replacement)
    return GGUFResult(blocks, tuple(int8), time.perf_counter() - started)


def _name_map(model: Any, architecture: str) -> tuple[dict[str, str], Any]:
    """``{model module name: GGUF tensor name without .weight}`` for the ``model``'s Linear
    layers (a tied output layer maps to the token embeddings, the file holding no output
    tensor) and the tensor processor transformers dequantizes ``architecture``'s tensors
    with."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    config = model.config
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(
        config={
            "num_attention_heads": config.num_attention_heads,
            "num_key_value_heads": getattr(config, "num_key_value_heads", config.num_attention_heads),
        }
    )
    arch = next((key for key, value in MODEL_ARCH_NAMES.items() if value == architecture), None)
    if arch is None:
        return {}, processor
    name_map = get_tensor_name_map(arch, int(config.num_hidden_layers))
    names = {}
    output, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
    for name, module in model.named_modules():
        if type(module) is torch.nn.Linear:
            gguf_name = name_map.get_name(name)
            if module is output and output.weight is embeddings.weight:
                gguf_name = name_map.get_name(next(n for n, m in model.named_modules() if m is embeddings))
            if gguf_name is not None:
                names[name] = gguf_name
    return names, processor


def _block_linear(
    linear: torch.nn.Linear,
    tensor: GGUFTensorInfo,
    data: np.ndarray[Any, Any],
    processor: Any,
    kernels: CpuKernels,
) -> GGUFLinear | None:
    """The GGUF tensor's blocks as a layer computing ``linear``, its rows in the model's
    order; ``None`` where its type is not one the kernels run, its sizes do not fit the
    blocks or transformers' processing of it is not a row permutation."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    fmt = GGMLQuantizationType(tensor.type_id).name
    rows, inputs = int(linear.out_features), int(linear.in_features)
    if fmt not in GGUF_FORMATS or rows % 16 or tensor.dims != (inputs, rows):
        return None
    block_size, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(tensor.type_id)]
    if inputs % block_size:
        return None
    row_bytes = inputs // block_size * block_bytes
    raw = data[tensor.offset : tensor.offset + rows * row_bytes].reshape(rows, row_bytes)
    order = processor.process(
        weights=np.arange(rows, dtype=np.float64).reshape(rows, 1),
        name=tensor.name,
        tensor_key_mapping={},
        parsed_parameters={"config": processor.config, "tensors": {}},
    ).weights
    order = np.asarray(order).reshape(-1)
    if order.shape != (rows,) or not np.array_equal(np.sort(order), np.arange(rows)):
        return None
    bias = None if linear.bias is None else linear.bias.detach()
    packed = pack_blocks(fmt, raw[order.astype(np.int64)])
    return GGUFLinear(fmt, packed, out_features=rows, in_features=inputs, kernels=kernels, bias=bias)
