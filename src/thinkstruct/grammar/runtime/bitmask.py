"""Token bitmasks: allocate once, fill per row, apply to logits in place.

A bitmask is an int32 tensor of shape ``[batch, ceil(vocab_size / 32)]``. Bit ``j`` of
word ``i`` (least significant first) set means token ``32 * i + j`` is allowed. xgrammar,
llguidance and outlines-core all write this layout, so rows filled by different backends
can sit in one tensor and be applied together.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

_ALL_ALLOWED = -1  # every bit set


def bitmask_words(vocab_size: int) -> int:
    """Number of int32 words one row needs for ``vocab_size`` tokens."""
    return (vocab_size + 31) // 32


def allocate_bitmask(batch_size: int, vocab_size: int, *, device: str | torch.device = "cpu") -> torch.Tensor:
    """A new ``[batch_size, ceil(vocab_size/32)]`` int32 bitmask with every token allowed.

    Grammars fill rows on the CPU; copy to the logits' device before applying.
    """
    pin = torch.device(device).type == "cpu" and torch.cuda.is_available()
    return torch.full(
        (batch_size, bitmask_words(vocab_size)),
        _ALL_ALLOWED,
        dtype=torch.int32,
        device=device,
        pin_memory=pin,
    )


class TokenBitmask:
    """One bitmask buffer reused across decoding steps; rows are views, never copies.

    Args:
        max_batch_size: rows allocated up front (grown, never shrunk, if exceeded).
        vocab_size: the model's vocabulary size (logits width).
    """

    def __init__(self, max_batch_size: int, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._buffer = allocate_bitmask(max_batch_size, vocab_size)

    def rows(self, batch_size: int) -> torch.Tensor:
        """The first ``batch_size`` rows (a view), reset to all-allowed."""
        if batch_size > self._buffer.shape[0]:
            self._buffer = allocate_bitmask(batch_size, self.vocab_size)
        view = self._buffer[:batch_size]
        if view.device.type == "cpu":
            # numpy's fill stays on this thread; torch's fill_ of a few hundred KB wakes
            # its OpenMP threads (about 1 ms a decoding step of 32 rows, measured).
            view.numpy().fill(_ALL_ALLOWED)
        else:
            view.fill_(_ALL_ALLOWED)
        return view


def allow_all(bitmask: torch.Tensor, row: int) -> None:
    """Set every bit of one row."""
    bitmask[row].fill_(_ALL_ALLOWED)


def allow_only(bitmask: torch.Tensor, row: int, token_ids: Iterable[int]) -> None:
    """Clear a row, then allow exactly ``token_ids``."""
    r = bitmask[row]
    r.zero_()
    for t in token_ids:
        set_allowed(bitmask, row, t)


def set_allowed(bitmask: torch.Tensor, row: int, token_id: int) -> None:
    """Set one token's bit (leaving the others)."""
    word, bit = divmod(token_id, 32)
    value = int(bitmask[row, word]) | (1 << bit)
    bitmask[row, word] = value - (1 << 32) if value >= 1 << 31 else value


def clear_allowed(bitmask: torch.Tensor, row: int, token_ids: Iterable[int]) -> None:
    """Clear the bits of ``token_ids`` in one row."""
    r = bitmask[row]
    for t in token_ids:
        word, bit = divmod(t, 32)
        value = int(r[word]) & ~(1 << bit) & 0xFFFFFFFF
        r[word] = value - (1 << 32) if value >= 1 << 31 else value


def is_allowed(bitmask: torch.Tensor, row: int, token_id: int) -> bool:
    word, bit = divmod(token_id, 32)
    return bool((int(bitmask[row, word]) >> bit) & 1)


def allowed_token_ids(bitmask: torch.Tensor, row: int, vocab_size: int) -> torch.Tensor:
    """The allowed ids of one row, ascending (for tests and tools, not the hot path)."""
    return torch.nonzero(unpack_row(bitmask[row], vocab_size)).flatten()


def allowed_count(row: torch.Tensor, vocab_size: int) -> int:
    """How many of the first ``vocab_size`` tokens one filled int32 bitmask row allows
    (a popcount over ``ceil(vocab_size/32)`` words: microseconds)."""
    words = row.numpy().view(np.uint32)
    return (
        int(np.bitwise_count(words[:-1]).sum())
        + (int(words[-1]) & _last_word_bits(words, vocab_size)).bit_count()
    )


def allowed_bounds(
    row: torch.Tensor | np.ndarray, vocab_size: int, *, excluded: Iterable[int] = ()
) -> tuple[int, ...]:
    """The lowest and highest token one filled int32 bitmask row (a tensor or its numpy
    array) allows, ``excluded`` ids left out: one id when they are the same, none when
    nothing is allowed. Read off the words, without listing the allowed ids (a string's
    mask allows ~100k of them)."""
    words = (row if isinstance(row, np.ndarray) else row.numpy()).view(np.uint32)
    last = int(words.shape[0]) - 1
    ignored = {last: ~_last_word_bits(words, vocab_size) & 0xFFFFFFFF}
    for t in excluded:
        ignored[t // 32] = ignored.get(t // 32, 0) | (1 << (t % 32))
    nonzero = np.flatnonzero(words)  # one pass; the Python below reads a few words only

    def bits(k: int) -> tuple[int, int]:
        word = int(nonzero[k])
        return word, int(words[word]) & ~ignored.get(word, 0)

    # A word all of whose set bits are ignored is skipped: at most len(ignored) of them.
    lo = next(((w, b) for w, b in map(bits, range(nonzero.size)) if b), None)
    if lo is None:
        return ()
    hi = next((w, b) for w, b in map(bits, range(nonzero.size - 1, -1, -1)) if b)
    low = lo[0] * 32 + (lo[1] & -lo[1]).bit_length() - 1
    high = hi[0] * 32 + hi[1].bit_length() - 1
    return (low,) if low == high else (low, high)


def _last_word_bits(words: np.ndarray, vocab_size: int) -> int:
    """The bits of a row's last word that stand for tokens of the vocabulary (a library
    may leave the ones past it set)."""
    used = vocab_size - (int(words.shape[0]) - 1) * 32
    return (1 << used) - 1


def unpack_row(words: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """A bool vector of ``vocab_size`` from one row of words."""
    return _unpack(words.unsqueeze(0))[0, :vocab_size]


def _unpack(bitmask: torch.Tensor) -> torch.Tensor:
    """``[batch, words]`` int32 to ``[batch, 32 * words]`` bool."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    return ((bitmask.unsqueeze(-1) >> shifts) & 1).view(bitmask.shape[0], -1).bool()


def apply_bitmask_inplace(
    logits: torch.Tensor, bitmask: torch.Tensor, *, indices: list[int] | None = None
) -> None:
    """Set the logits of disallowed tokens to ``-inf``, in place.

    Args:
        logits: ``[batch, vocab]`` float32, bfloat16 or float16, on CPU or CUDA. Columns past
            the bitmask's ``32 * words`` are treated as disallowed.
        bitmask: ``[batch, words]`` int32 (or ``[len(indices), words]`` with ``indices``),
            on any device; moved to the logits' device if needed.
        indices: apply only to these logits rows, row ``k`` of ``bitmask`` going to
            ``logits[indices[k]]``.
    """
    if bitmask.dtype != torch.int32:
        raise TypeError(f"bitmask must be int32, got {bitmask.dtype}")
    if logits.dim() != 2 or bitmask.dim() != 2:
        raise ValueError("logits and bitmask must both be 2-D")
    if bitmask.device != logits.device:
        bitmask = bitmask.to(logits.device, non_blocking=True)
    vocab = logits.shape[1]
    covered = min(vocab, bitmask.shape[1] * 32)
    if logits.is_cuda and indices is None and _xgrammar_cuda_apply(logits, bitmask):
        # xgrammar's kernel leaves the columns past the mask's words as they were (a
        # model's embedding rows beyond its tokenizer's, Qwen3's 151,936 over 151,680).
        if covered < vocab:
            logits[:, covered:] = float("-inf")
        return
    target = logits if indices is None else logits[indices]
    allowed = _unpack(bitmask)[:, :covered]
    if covered < vocab:
        target[:, covered:] = float("-inf")
    target[:, :covered].masked_fill_(~allowed, float("-inf"))
    if indices is not None:
        logits[indices] = target


def _xgrammar_cuda_apply(logits: torch.Tensor, bitmask: torch.Tensor) -> bool:
    """Use xgrammar's fused CUDA/Triton kernel where it takes these tensors."""
    try:
        import xgrammar

        xgrammar.apply_token_bitmask_inplace(logits, bitmask)
        return True
    except Exception:  # noqa: BLE001 - no triton or an unsupported dtype: the torch path works
        return False
