"""Read a few metadata values, and the tensors' table, from a GGUF file's header.

The chat template and the special-token ids sit in the key/value header at the start of
the file. ``gguf.GGUFReader`` maps and indexes the whole file, tensors and the full
vocabulary included (several seconds for SmolLM2's 49k tokens); this reads the header
once, sequentially, and decodes only the values asked for.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Collection
from typing import Any, BinaryIO, NamedTuple

_MAGIC = b"GGUF"
# GGUF value types: id -> struct format of one item (strings and arrays are handled apart).
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9


class GGUFFormatError(ValueError):
    """The file is not a GGUF file this reader understands (the message says where)."""


def read_gguf_metadata(path: str | os.PathLike[str], keys: Collection[str]) -> dict[str, Any]:
    """The values of ``keys`` present in the GGUF header at ``path``.

    Strings are decoded as UTF-8; arrays come back as lists. Keys not in the file are
    absent from the result.

    Raises:
        GGUFFormatError: not a GGUF file, or a header that ends early.
        OSError: the file cannot be read.
    """
    wanted = set(keys)
    found: dict[str, Any] = {}
    with open(path, "rb") as f:
        _tensors, n_kv = _header(f, path)
        for _ in range(n_kv):
            key = _read_string(f, path)
            (value_type,) = _unpack(f, "<I", path)
            if key in wanted:
                found[key] = _read_value(f, value_type, path)
                if len(found) == len(wanted):
                    break
            else:
                _skip_value(f, value_type, path)
    return found


def _header(f: BinaryIO, path: str | os.PathLike[str]) -> tuple[int, int]:
    """Check the magic and version at the start of ``f``; the counts of tensors and of
    key/values that follow.

    Raises:
        GGUFFormatError: not a GGUF file, a version before 2, or a header that ends early.
    """
    if f.read(4) != _MAGIC:
        raise GGUFFormatError(f"{path}: not a GGUF file (bad magic)")
    (version,) = _unpack(f, "<I", path)
    if version < 2:
        raise GGUFFormatError(f"{path}: GGUF version {version} is not supported")
    tensors, kv = _unpack(f, "<QQ", path)
    return int(tensors), int(kv)


class GGUFTensorInfo(NamedTuple):
    """One tensor of a GGUF file: its name, ggml type id, dimensions as the file lists
    them (innermost first: ``[inputs, outputs]`` for a weight) and the absolute byte
    offset of its data in the file."""

    name: str
    type_id: int
    dims: tuple[int, ...]
    offset: int


def read_gguf_tensors(path: str | os.PathLike[str]) -> list[GGUFTensorInfo]:
    """The tensor table of the GGUF at ``path`` (the header's key/values skipped, but
    ``general.alignment``), without reading any tensor data.

    Raises:
        GGUFFormatError: not a GGUF file, or a header that ends early.
        OSError: the file cannot be read.
    """
    with open(path, "rb") as f:
        n_tensors, n_kv = _header(f, path)
        alignment = 32
        for _ in range(n_kv):
            key = _read_string(f, path)
            (value_type,) = _unpack(f, "<I", path)
            if key == "general.alignment":
                alignment = int(_read_value(f, value_type, path))
            else:
                _skip_value(f, value_type, path)
        table = []
        for _ in range(n_tensors):
            name = _read_string(f, path)
            (n_dims,) = _unpack(f, "<I", path)
            dims = _unpack(f, f"<{n_dims}Q", path)
            type_id, offset = _unpack(f, "<IQ", path)
            table.append((name, type_id, tuple(int(d) for d in dims), int(offset)))
        start = -(-f.tell() // alignment) * alignment
    return [GGUFTensorInfo(name, type_id, dims, start + offset) for name, type_id, dims, offset in table]


def _unpack(f: BinaryIO, fmt: str, path: Any) -> tuple[Any, ...]:
    size = struct.calcsize(fmt)
    raw = f.read(size)
    if len(raw) != size:
        raise GGUFFormatError(f"{path}: the metadata header ends early")
    return struct.unpack(fmt, raw)


def _read_string(f: BinaryIO, path: Any) -> str:
    (length,) = _unpack(f, "<Q", path)
    raw = f.read(length)
    if len(raw) != length:
        raise GGUFFormatError(f"{path}: the metadata header ends early")
    return raw.decode("utf-8", errors="replace")


def _read_value(f: BinaryIO, value_type: int, path: Any) -> Any:
    if value_type == _STRING:
        return _read_string(f, path)
    if value_type == _ARRAY:
        item_type, count = _unpack(f, "<IQ", path)
        return [_read_value(f, item_type, path) for _ in range(count)]
    fmt = _SCALARS.get(value_type)
    if fmt is None:
        raise GGUFFormatError(f"{path}: unknown metadata value type {value_type}")
    return _unpack(f, fmt, path)[0]


def _skip_value(f: BinaryIO, value_type: int, path: Any) -> None:
    if value_type == _STRING:
        (length,) = _unpack(f, "<Q", path)
        f.seek(length, os.SEEK_CUR)
    elif value_type == _ARRAY:
        item_type, count = _unpack(f, "<IQ", path)
        fmt = _SCALARS.get(item_type)
        if fmt is not None:
            f.seek(struct.calcsize(fmt) * count, os.SEEK_CUR)
        else:
            for _ in range(count):
                _skip_value(f, item_type, path)
    elif value_type in _SCALARS:
        f.seek(struct.calcsize(_SCALARS[value_type]), os.SEEK_CUR)
    else:
        raise GGUFFormatError(f"{path}: unknown metadata value type {value_type}")
