"""Keys and values in blocks with a block table per slot: :class:`PagedKvCache`, and
:class:`HeldBlocks`, the blocks the prefix cache keeps by reference.

Each layer keeps one pool of keys and one of values, ``[kv_heads, num_blocks,
block_tokens, head_dim]`` (heads outermost: a slot whose blocks are consecutive is read
head by head as one run, as the contiguous slot buffers were; blocks first cost attention
about 13 % at a thousand positions, measured). A block is one index into every layer's pools: the keys and
values of :data:`~thinkstruct.engine.kv.prefix_cache.BLOCK_TOKENS` consecutive positions of
one slot, every layer. ``table[slot, p // block_tokens]`` is the block holding position
``p`` of ``slot`` (offset ``p % block_tokens``); the compiled kernels read and write
through it (:class:`~thinkstruct.engine.kernels.cpu_kernels.Pages`).

Blocks are reference counted: every slot's table holds one reference to each of its
blocks, every :class:`HeldBlocks` one to each of its. So a row that moves to another slot,
or a prompt that starts with a live row's prefix, shares that row's blocks instead of
copying them (:meth:`PagedKvCache.share`); a finished row's blocks go to the prefix cache
by reference (:meth:`PagedKvCache.hold`) and a later prompt maps them into its table
(:meth:`PagedKvCache.adopt`); a block whose last reference goes is free again.

**A shared block is never written.** A slot writes only positions at or after what it
holds (:meth:`PagedKvCache.prepare`: a pass appends, a refused speculative draft is
rewritten from the row's length), so every block wholly below that length stays as it
is; the one block a write can land in while it is shared is the slot's partial last
block (a prefix of a length that is not a multiple of the block), and
:meth:`~PagedKvCache.prepare` copies it first (copy on write, :attr:`PagedKvCache.copies`
counts them) — the only keys and values ever copied.

**Placement.** A slot's next block is the one right after its last where that is free,
else the lowest free block, so a prompt's blocks lie in one run and a slot is read as
few runs as it can be (attention prefetches across the jumps, but a run is still faster:
measured, one thread, 1k positions, shuffled blocks 1.2-1.6x consecutive ones' time).

**Sizing.** The pools hold at most ``capacity_blocks`` blocks: the engine's budgets
(:class:`~thinkstruct.engine.kv.budget.KvBudget`), the running requests' reservations
and the prefix cache's, plus one block for a copy on write in progress. They reserve
that room up front, up to :data:`RESERVE_BYTES` over all layers, as zero pages the
system maps on first touch (a private anonymous mapping: nothing written), so memory
grows only with the blocks used: the lowest free block goes first, and
:attr:`PagedKvCache.nbytes` counts up to the highest block ever used. Past that room
(a budget over :data:`RESERVE_BYTES`) they double when no block is free, up to
``capacity_blocks`` (every block keeps its index, so the tables stay valid; the kernels
get the new buffers on the next pass), copying only the blocks ever used: a doubling
stalls every row, and doubling from a small start while the prefix cache filled stalled
the batch for about 12 % of its first 15 s under 8 clients (measured;
``benchmarks/kv_growth.py``). A slot's table holds at most the blocks of what it writes,
which its request reserved (``ceil((prompt + max_tokens) / block_tokens)``, within the
context), and the prefix cache at most ``max_bytes / block_bytes`` of its own, so the
pools never need more than the reservations plus the prefix cache's blocks (a shared
block is counted by each holder, held once), plus one for a copy on write: a request
admitted within its reservation never finds the pool short mid-way. A pool with no
block free at its capacity raises :class:`KvPoolFull` (a reservation was broken).

The cache is the engine thread's alone: no locks.
"""

from __future__ import annotations

import heapq
import math
import mmap
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from thinkstruct.engine.kv.prefix_cache import BLOCK_TOKENS

#: Fewest blocks the pools hold at first, for every slot.
INITIAL_BLOCKS_PER_SLOT = 8
#: Most bytes (all layers' keys and values) of blocks the pools reserve at first, as
#: untouched zero pages: address space, not memory, until blocks are used.
RESERVE_BYTES = 4 << 30


class KvPoolFull(RuntimeError):
    """Every block of the pools is in use at their capacity: more was written than the
    requests reserved (a fault of the engine, never of one request)."""


def block_bytes(*, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Bytes one block takes: every layer's keys and values of
    :data:`~thinkstruct.engine.kv.prefix_cache.BLOCK_TOKENS` positions."""
    return 2 * layers * kv_heads * BLOCK_TOKENS * head_dim * dtype.itemsize


def _untouched_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Zeros whose memory the system supplies page by page on first touch: a private
    anonymous mapping (as a large ``malloc`` is; Python's default, shared, would be shared
    memory and shared with a forked child), page-aligned, nothing written. Pages of 4 KiB:
    numpy's large zeros ask for 2 MiB pages, each zeroed whole at its first touch, and the
    pools' blocks (heads outermost) reach hundreds of such pages at once: measured, steps
    of 50 ms."""
    size = math.prod(shape) * dtype.itemsize
    if size == 0:
        return torch.zeros(shape, dtype=dtype)
    memory = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(memory, dtype=dtype).view(shape)


@dataclass(eq=False)
class HeldBlocks:
    """Consecutive whole blocks of a :class:`PagedKvCache`, by reference (a
    :class:`~thinkstruct.engine.kv.prefix_cache.HeldKv`).

    Attributes:
        cache: the cache the blocks belong to.
        blocks: block indices, position order.
        owned: whether it holds a reference to each (:meth:`release` gives them back);
            a :meth:`concat` view holds none.
    """

    cache: PagedKvCache
    blocks: tuple[int, ...]
    owned: bool = True
    _released: bool = field(default=False, repr=False)

    @property
    def nbytes(self) -> int:
        """Bytes of keys and values its blocks hold (every layer)."""
        return len(self.blocks) * self.cache.block_bytes

    def release(self) -> None:
        """Give the blocks' references back (once)."""
        if self.owned and not self._released:
            self._released = True
            self.cache.release(self.blocks)

    @classmethod
    def concat(cls, spans: Sequence[HeldBlocks]) -> HeldBlocks:
        """The blocks of ``spans`` end to end, as a view holding no references."""
        return cls(spans[0].cache, tuple(b for s in spans for b in s.blocks), owned=False)


class PagedKvCache:
    """Block pools for ``layers`` layers and a block table for each of ``slots`` slots of
    up to ``context_length`` positions.

    Args:
        layers: attention layers.
        slots: rows a pass may address.
        kv_heads, head_dim: the model's key/value heads and their size.
        context_length: most positions a slot holds.
        dtype: what the pools hold (written keys and values are rounded to it).
        capacity_blocks: most blocks the pools ever hold (``None``: no bound beyond
            what the slots' tables and held spans refer to).
        initial_blocks: blocks the pools hold at first (default: ``capacity_blocks``, or
            without one every slot's context and as much again, within
            ``reserve_bytes``, at least :data:`INITIAL_BLOCKS_PER_SLOT` a slot).
        reserve_bytes: most bytes of blocks reserved at first (default
            :data:`RESERVE_BYTES`), all layers' keys and values.

    Raises:
        ValueError: a capacity below one block.
    """

    def __init__(
        self,
        *,
        layers: int,
        slots: int,
        kv_heads: int,
        head_dim: int,
        context_length: int,
        dtype: torch.dtype,
        capacity_blocks: int | None = None,
        initial_blocks: int | None = None,
        reserve_bytes: int = RESERVE_BYTES,
    ) -> None:
        if capacity_blocks is not None and capacity_blocks < 1:
            raise ValueError(f"the pools need room for at least one block, got {capacity_blocks}")
        self.block_tokens = BLOCK_TOKENS
        self.slots = slots
        #: Blocks a slot's table has room for (its whole context).
        self.max_blocks = -(-context_length // self.block_tokens)
        #: Bytes one block holds over every layer's keys and values.
        self.block_bytes = block_bytes(layers=layers, kv_heads=kv_heads, head_dim=head_dim, dtype=dtype)
        #: Most blocks the pools ever hold (``None``: unbounded).
        self.capacity_blocks = capacity_blocks
        reserve = reserve_bytes // max(self.block_bytes, 1)
        if initial_blocks is None:
            wanted = 2 * slots * self.max_blocks if capacity_blocks is None else capacity_blocks
            initial_blocks = max(INITIAL_BLOCKS_PER_SLOT * slots, min(wanted, reserve))
        if capacity_blocks is not None:
            initial_blocks = min(initial_blocks, capacity_blocks)
        blocks = max(1, initial_blocks)
        shape = (kv_heads, blocks, self.block_tokens, head_dim)
        #: Per layer ``[kv_heads, num_blocks, block_tokens, head_dim]``.
        self.keys = [_untouched_zeros(shape, dtype) for _ in range(layers)]
        self.values = [_untouched_zeros(shape, dtype) for _ in range(layers)]
        #: One past the highest block ever used: the blocks below it were touched.
        self._used = 0
        #: int64 ``[slots, max_blocks]``: the block of each position; -1 past a slot's blocks.
        self.table = torch.full((slots, self.max_blocks), -1, dtype=torch.int64)
        #: Blocks copied because a write would have landed in a shared one (monotonic).
        self.copies = 0
        self._held: list[list[int]] = [[] for _ in range(slots)]
        self._refs = [0] * blocks
        #: Free blocks, lowest first (a min-heap; an entry whose block was taken out of
        #: order, as the one after a slot's last, is skipped when it comes up).
        self._free = list(range(blocks))
        self._free_count = blocks

    @property
    def dtype(self) -> torch.dtype:
        """What the pools hold."""
        return self.keys[0].dtype

    @property
    def num_blocks(self) -> int:
        """Blocks the pools hold (free or not)."""
        return self.keys[0].shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes of the pools' blocks ever used (the memory they take; the blocks above,
        reserved, take none)."""
        return self._used * self.block_bytes

    @property
    def free_blocks(self) -> int:
        """Blocks no table and no :class:`HeldBlocks` refers to."""
        return self._free_count

    def blocks_of(self, slot: int) -> tuple[int, ...]:
        """The blocks ``slot``'s table holds, position order."""
        return tuple(self._held[slot])

    def refs(self, block: int) -> int:
        """References to ``block`` (tables and held spans)."""
        return self._refs[block]

    def prepare(self, slot: int, start: int, stop: int) -> None:
        """Make ``slot`` keep positions ``[0, start)`` and able to take writes at
        ``[start, stop)``: blocks past ``start`` are dropped, the partial block at
        ``start`` is copied if it is shared, and blocks are added up to ``stop``.

        Raises:
            ValueError: a range outside the context, or a ``start`` past what the slot holds.
        """
        size = self.block_tokens
        if not 0 <= start < stop <= self.max_blocks * size:
            raise ValueError(f"positions {start}..{stop} outside a slot of {self.max_blocks * size}")
        keep = -(-start // size)
        self._truncate(slot, keep)
        held = self._held[slot]
        if len(held) < keep:
            raise ValueError(f"slot {slot} holds {len(held) * size} positions, not the {start} it keeps")
        if start % size and self._refs[held[-1]] > 1:
            self._copy_on_write(slot, len(held) - 1)
        while len(held) < -(-stop // size):
            self._append(slot, self._allocate(after=held[-1] if held else None))
        for block in held[start // size :]:
            if self._refs[block] != 1:
                raise RuntimeError(f"block {block} would be written while shared")

    def share(self, src: int, dst: int, length: int) -> None:
        """Make ``dst`` hold the first ``length`` positions of ``src``: the blocks holding
        them, shared (its previous blocks dropped). A partial last block is copied only
        when one of them writes into it (:meth:`prepare`).

        Raises:
            ValueError: ``src`` holds fewer than ``length`` positions.
        """
        count = -(-length // self.block_tokens) if length > 0 else 0
        blocks = self._held[src][:count]
        if len(blocks) < count:
            raise ValueError(f"slot {src} holds fewer than {length} positions")
        for block in blocks:
            self._refs[block] += 1
        self._truncate(dst, 0)
        for block in blocks:
            self._append(dst, block)

    def hold(self, slot: int, start: int, stop: int) -> HeldBlocks:
        """References to the whole blocks of positions ``[start, stop)`` of ``slot``
        (both multiples of the block size).

        Raises:
            ValueError: a range not on block boundaries or past what the slot holds.
        """
        size = self.block_tokens
        if start % size or stop % size or not 0 <= start < stop <= len(self._held[slot]) * size:
            raise ValueError(f"positions {start}..{stop} are not whole blocks slot {slot} holds")
        blocks = tuple(self._held[slot][start // size : stop // size])
        for block in blocks:
            self._refs[block] += 1
        return HeldBlocks(self, blocks)

    def adopt(self, slot: int, start: int, held: HeldBlocks) -> None:
        """Make ``slot`` keep positions ``[0, start)`` (a multiple of the block size)
        followed by ``held``'s blocks, shared.

        Raises:
            ValueError: blocks of another cache, a ``start`` off a block boundary or past
                what the slot holds, or more than a slot's context.
        """
        size = self.block_tokens
        keep = start // size
        if held.cache is not self:
            raise ValueError("these blocks belong to another cache")
        if start % size or start < 0 or len(self._held[slot]) < keep:
            raise ValueError(f"slot {slot} cannot take blocks at position {start}")
        if keep + len(held.blocks) > self.max_blocks:
            raise ValueError(f"{start + len(held.blocks) * size} positions exceed a slot's context")
        for block in held.blocks:
            self._refs[block] += 1
        self._truncate(slot, keep)
        for block in held.blocks:
            self._append(slot, block)

    def write_tokens(
        self,
        layer: int,
        slot_of: torch.Tensor,
        pos_of: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
    ) -> None:
        """Store one layer's keys and values ``[T, kv_heads, head_dim]`` of tokens at
        positions ``pos_of`` of slots ``slot_of`` (int64 ``[T]``) through the table (the
        torch path; the kernels write themselves). :meth:`prepare` gave them blocks."""
        size = self.block_tokens
        blocks, offsets = self.table[slot_of, pos_of // size], pos_of % size
        self.keys[layer][:, blocks, offsets] = keys.transpose(0, 1).to(self.keys[layer].dtype)
        self.values[layer][:, blocks, offsets] = values.transpose(0, 1).to(self.values[layer].dtype)

    def read_rows(self, layer: int, first: int, rows: int, span: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's keys and values of slots ``first..first + rows`` over positions
        ``[0, span)``, gathered from their blocks: ``[rows, kv_heads, span, head_dim]``
        each (past a slot's blocks: block 0's, for a mask to hide)."""
        count = -(-span // self.block_tokens)
        index = self.table[first : first + rows, :count].clamp(min=0)
        out = []
        for pool in (self.keys[layer], self.values[layer]):
            gathered = pool[:, index]  # [kv_heads, rows, count, block_tokens, head_dim]
            kv_heads, dim = pool.shape[0], pool.shape[3]
            out.append(
                gathered.transpose(0, 1).reshape(rows, kv_heads, count * self.block_tokens, dim)[:, :, :span]
            )
        return out[0], out[1]

    def free(self, slot: int) -> None:
        """``slot`` holds nothing: its references go back."""
        self._truncate(slot, 0)

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference to each of ``blocks``; a block with none left is free."""
        for block in blocks:
            self._refs[block] -= 1
            if self._refs[block] == 0:
                heapq.heappush(self._free, block)
                self._free_count += 1
            elif self._refs[block] < 0:
                raise RuntimeError(f"block {block} released more often than held")

    def _truncate(self, slot: int, keep: int) -> None:
        held = self._held[slot]
        if len(held) > keep:
            dropped = held[keep:]
            del held[keep:]
            self.table[slot, keep : keep + len(dropped)] = -1
            self.release(dropped)

    def _append(self, slot: int, block: int) -> None:
        held = self._held[slot]
        self.table[slot, len(held)] = block
        held.append(block)

    def _allocate(self, after: int | None = None) -> int:
        """A free block, now referenced once: the one after block ``after`` if free, else
        the lowest free one (the pools double when none is, up to their capacity).

        Raises:
            KvPoolFull: no block free at the pools' capacity.
        """
        if self._free_count == 0:
            capacity = self.capacity_blocks
            if capacity is not None and self.num_blocks >= capacity:
                raise KvPoolFull(
                    f"all {capacity} blocks of the KV pools are in use: more was written than reserved"
                )
            self._grow(2 * self.num_blocks if capacity is None else min(2 * self.num_blocks, capacity))
        if after is not None and after + 1 < self.num_blocks and self._refs[after + 1] == 0:
            block = after + 1  # its heap entry is skipped when it comes up
        else:
            block = heapq.heappop(self._free)
            while self._refs[block] != 0:  # taken out of order since it was pushed
                block = heapq.heappop(self._free)
        self._refs[block] = 1
        self._free_count -= 1
        self._used = max(self._used, block + 1)
        return block

    def _copy_on_write(self, slot: int, index: int) -> None:
        old = self._held[slot][index]
        new = self._allocate()
        for pool in (*self.keys, *self.values):
            pool[:, new].copy_(pool[:, old])
        self.copies += 1
        self._held[slot][index] = new
        self.table[slot, index] = new
        self.release((old,))

    def _grow(self, blocks: int) -> None:
        """Reallocate every pool to ``blocks`` blocks, keeping what they hold."""
        old, used = self.num_blocks, self._used
        for store in (self.keys, self.values):
            for i, pool in enumerate(store):
                # Only the blocks ever used copied: the rest are zero pages in both.
                grown = _untouched_zeros((pool.shape[0], blocks, *pool.shape[2:]), pool.dtype)
                grown[:, :used].copy_(pool[:, :used])
                store[i] = grown
        self._refs.extend([0] * (blocks - old))
        for block in range(old, blocks):
            heapq.heappush(self._free, block)
        self._free_count += blocks - old
