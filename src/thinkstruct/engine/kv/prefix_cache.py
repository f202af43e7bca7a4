"""Keys and values of finished requests, kept for the next request that starts the same
way: :class:`PrefixCache`.

A radix tree over blocks of ``block_tokens`` token ids: a node is one block, reached by
the blocks before it, so a node's keys and values are exactly what a model computes for
that block after that prefix. A request that finishes (or is cancelled) hands the
tokens its slot holds to :meth:`PrefixCache.insert`, which copies out the blocks the tree
lacks; a request that joins asks :meth:`PrefixCache.match` for the longest run of its
prompt's blocks the tree holds and writes their keys and values into its slot instead of
computing them. A chat's next turn, an agent's next call after a tool result, a repeated
system prompt and a retried request so skip what was computed before.

What a node keeps is whatever the runner's ``read`` hands over (:class:`HeldKv`): on a
paged runner (:class:`~thinkstruct.engine.kv.blocks.PagedKvCache`) a reference to the
slot's own blocks, so keeping them copies nothing and reusing them only maps them into
the joining slot's block table; on any other runner a copy (:class:`KvSpan`), written
back into the joining slot. The tree does not care which: it counts ``nbytes`` and calls
``release()`` on what it evicts.

Only whole blocks are kept (a turn recomputes at most ``block_tokens - 1`` tokens of what
the tree could have held). Memory is bounded by ``max_bytes``: past it the least recently
used leaves go first (a block others extend stays while they do). On a batch-invariant
runner a reused block is the same bits as computing it again; on others it is what an
earlier pass computed, equal within floating-point rounding.

The tree is the engine thread's alone: no locks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, Self

import torch

__all__ = ["BLOCK_TOKENS", "HeldKv", "KvSpan", "PrefixCache", "PrefixMatch"]

#: Tokens a block holds: the prefix cache's unit of reuse and the paged KV cache's page.
BLOCK_TOKENS = 32


class HeldKv(Protocol):
    """Keys and values of consecutive positions a runner handed over (``read_kv``), in
    whatever form it keeps them: a copy or references to its own storage."""

    @property
    def nbytes(self) -> int:
        """Bytes of keys and values it stands for (every layer)."""
        ...

    def release(self) -> None:
        """Give back what it holds (a paged runner's blocks); it is not used after."""
        ...

    @classmethod
    def concat(cls, spans: Sequence[Self]) -> Self:
        """``spans`` end to end, for one ``write_kv`` (a view: it holds nothing of its
        own, and is used before any of ``spans`` is released)."""
        ...


@dataclass(frozen=True, slots=True)
class KvSpan:
    """A copy of the keys and values of consecutive positions: per layer ``[kv_heads,
    tokens, head_dim]`` (a :class:`HeldKv` that holds nothing of a runner's)."""

    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def release(self) -> None:
        """Nothing to give back: the tensors are its own."""

    @classmethod
    def concat(cls, spans: Sequence[KvSpan]) -> KvSpan:
        """One span of ``spans`` end to end (one tensor a layer: one copy each to write)."""
        if len(spans) == 1:
            return spans[0]
        layers = range(len(spans[0].keys))
        return KvSpan(
            keys=tuple(torch.cat([s.keys[i] for s in spans], dim=1) for i in layers),
            values=tuple(torch.cat([s.values[i] for s in spans], dim=1) for i in layers),
        )


@dataclass(eq=False, slots=True)
class _Node:
    block: tuple[int, ...]
    kv: HeldKv | None  # None only at the root
    parent: _Node | None
    children: dict[tuple[int, ...], _Node] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """What :meth:`PrefixCache.match` found: ``tokens`` positions and their keys/values
    (a view of the tree's: write it before the tree next changes)."""

    tokens: int
    kv: HeldKv | None


class PrefixCache:
    """Keys and values of token blocks seen before, by prefix, within a byte budget.

    Args:
        block_tokens: tokens a block holds (the granularity of reuse).
        max_bytes: most bytes of keys and values kept; 0 keeps nothing.
    """

    def __init__(self, *, block_tokens: int = BLOCK_TOKENS, max_bytes: int) -> None:
        if block_tokens < 1 or max_bytes < 0:
            raise ValueError("block_tokens must be >= 1 and max_bytes >= 0")
        self.block_tokens = block_tokens
        self.max_bytes = max_bytes
        self.bytes = 0
        self.blocks = 0
        #: Blocks evicted to stay within ``max_bytes`` (monotonic).
        self.evicted = 0
        self._root = _Node(block=(), kv=None, parent=None)
        #: Every node, least recently used first. A path is touched leaf first, so a node
        #: always comes after its children: the first node is a leaf.
        self._lru: OrderedDict[_Node, None] = OrderedDict()

    def match(self, tokens: Sequence[int], *, limit: int) -> PrefixMatch:
        """The longest run of whole blocks at the start of ``tokens`` the tree holds, at
        most ``limit`` tokens, marked as just used."""
        path = self._path(tokens, limit)
        if not path:
            return PrefixMatch(0, None)
        self._touch(path)
        held = [n.kv for n in path if n.kv is not None]
        return PrefixMatch(len(path) * self.block_tokens, type(held[0]).concat(held))

    def peek(self, tokens: Sequence[int], *, limit: int) -> int:
        """How many tokens :meth:`match` would give now, without marking them used."""
        return len(self._path(tokens, limit)) * self.block_tokens

    def _path(self, tokens: Sequence[int], limit: int) -> list[_Node]:
        """The nodes of the longest run of whole blocks at the start of ``tokens`` (at most
        ``limit`` tokens) the tree holds."""
        node = self._root
        path: list[_Node] = []
        size = self.block_tokens
        for start in range(0, min(limit, len(tokens)) - size + 1, size):
            child = node.children.get(tuple(tokens[start : start + size]))
            if child is None:
                break
            node = child
            path.append(node)
        return path

    def insert(self, tokens: Sequence[int], read: Callable[[int, int], HeldKv]) -> int:
        """Keep the whole blocks of ``tokens`` (the positions a slot holds, from 0) that the
        tree lacks, taking each new block's keys and values from ``read(start, stop)``
        (a copy or a reference the tree now owns: never a view the slot will overwrite);
        returns how many blocks were added."""
        if self.max_bytes == 0:
            return 0
        node = self._root
        path: list[_Node] = []
        size = self.block_tokens
        added = 0
        for start in range(0, len(tokens) - size + 1, size):
            block = tuple(tokens[start : start + size])
            child = node.children.get(block)
            if child is None:
                kv = read(start, start + size)
                child = _Node(block=block, kv=kv, parent=node)
                node.children[block] = child
                self.bytes += kv.nbytes
                self.blocks += 1
                added += 1
            path.append(child)
            node = child
        self._touch(path)
        self._evict()
        return added

    def clear(self) -> None:
        """Forget everything (releasing what every block holds)."""
        for node in self._lru:
            if node.kv is not None:
                node.kv.release()
        self._root.children.clear()
        self._lru.clear()
        self.bytes = self.blocks = 0

    def _touch(self, path: list[_Node]) -> None:
        for node in reversed(path):
            self._lru[node] = None
            self._lru.move_to_end(node)

    def _evict(self) -> None:
        """Drop least recently used leaves until within budget (the path just touched
        goes last)."""
        while self.bytes > self.max_bytes and self._lru:
            victim, _ = self._lru.popitem(last=False)
            if victim.children:  # cannot happen (see _lru); never orphan a subtree
                raise RuntimeError("prefix cache order broken: a block older than its extensions")
            if victim.parent is None or victim.kv is None:
                raise RuntimeError("prefix cache holds the root")
            del victim.parent.children[victim.block]
            self.bytes -= victim.kv.nbytes
            victim.kv.release()
            self.blocks -= 1
            self.evicted += 1
