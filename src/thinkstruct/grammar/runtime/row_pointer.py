"""Raw row addresses for the backends that write masks through a pointer.

llguidance and outlines-core write into memory by address; a wrong tensor would be
written out of bounds, so an address is only handed out after the checks here. An engine
fills every row of one bitmask per step, so the checks run once per bitmask (the last
one checked is remembered, the tensor itself, not its id, so a new tensor can never
match a dead one) and each row then costs an addition.
"""

from __future__ import annotations

import threading

import torch

_local = threading.local()


def row_address(bitmask: torch.Tensor, row: int) -> tuple[int, int]:
    """``(address, words)`` of one row of an int32 CPU bitmask with contiguous rows."""
    checked = getattr(_local, "checked", None)
    # The pointer is compared on every call: set_() or a growing resize_() moves it.
    if checked is None or checked[0] is not bitmask or checked[1] != bitmask.data_ptr():
        checked = _local.checked = _check(bitmask)
    _, base, row_bytes, rows, words = checked
    if not 0 <= row < rows:
        raise IndexError(f"row {row} outside a bitmask of {rows} rows")
    return base + row * row_bytes, words


def _check(bitmask: torch.Tensor) -> tuple[torch.Tensor, int, int, int, int]:
    if not isinstance(bitmask, torch.Tensor) or bitmask.dtype is not torch.int32 or bitmask.dim() != 2:
        raise TypeError("bitmask must be a 2-D int32 tensor")
    if not bitmask.is_cpu:
        raise ValueError("grammars fill a CPU bitmask; copy it to the device afterwards")
    row_stride, word_stride = bitmask.stride()
    if word_stride != 1:
        raise ValueError("bitmask rows must be contiguous")
    rows, words = bitmask.shape
    return bitmask, bitmask.data_ptr(), row_stride * 4, rows, words
