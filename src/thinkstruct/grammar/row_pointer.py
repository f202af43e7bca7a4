"""Raw row addresses for the backends that write masks through a pointer.

llguidance and outlines-core write into memory by address; a wrong tensor would be
written out of bounds, so the address is only handed out after the checks here.
"""

from __future__ import annotations

import torch


def row_address(bitmask: torch.Tensor, row: int) -> tuple[int, int]:
    """``(address, words)`` of one row of an int32 CPU bitmask with contiguous rows."""
    if bitmask.dtype is not torch.int32 or bitmask.dim() != 2:
        raise TypeError("bitmask must be a 2-D int32 tensor")
    if bitmask.device.type != "cpu":
        raise ValueError("grammars fill a CPU bitmask; copy it to the device afterwards")
    if bitmask.stride(1) != 1:
        raise ValueError("bitmask rows must be contiguous")
    if not 0 <= row < bitmask.shape[0]:
        raise IndexError(f"row {row} outside a bitmask of {bitmask.shape[0]} rows")
    return bitmask.data_ptr() + row * bitmask.stride(0) * 4, bitmask.shape[1]
