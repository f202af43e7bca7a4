"""Which replicas served which prompt prefixes: :class:`PromptKeys` and :class:`PrefixIndex`.

A prompt is cut into blocks of ``block`` tokens; block ``i``'s key digests the key before
it and its own tokens, so equal keys mean equal prefixes. A prompt whose length is not
a whole number of blocks also gets a tail key for its whole self (the key of its last
whole block, then the tokens after it). A chat's next turn starts with its previous
turn's whole prompt: the tail key finds that prompt even where it ends inside a block,
so two chats that share a long system prompt and differ only in a short first question
are still told apart. A match says whether it is such a whole earlier prompt that the
prompt goes on from (a tail key, or a block key a prompt ended on, shorter than the
prompt), or only a prefix shared with longer ones, or the same prompt again.

The index remembers every replica that served a key (a prefix served by several
replicas, a popular system prompt, is held by each of them), least recently used first
out; a prompt's shallow keys are touched after its deep ones, so a prefix's deeper keys
leave before its shallower ones.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Hashable, Sequence, Set
from dataclasses import dataclass
from typing import Generic, TypeVar

#: Tokens per block: a match is counted in whole blocks, plus a recorded prompt's tail.
BLOCK_TOKENS = 16

R = TypeVar("R", bound=Hashable)

_KEY_BYTES = 16
_TOKEN_BYTES = 4  # token ids as little-endian uint32


def _chain(previous: bytes, tokens: bytes, *, kind: bytes = b"block") -> bytes:
    return hashlib.blake2b(previous + tokens, digest_size=_KEY_BYTES, person=kind).digest()


def _token_bytes(token_ids: Sequence[int]) -> bytes:
    packed = array("I", token_ids)
    if packed.itemsize != _TOKEN_BYTES:  # pragma: no cover - every platform CPython ships on
        packed = array("L", token_ids)
    return packed.tobytes()


@dataclass(frozen=True, slots=True)
class PromptKeys:
    """A prompt's block keys and what its tail keys are made from.

    Attributes:
        blocks: one key per whole leading block (key ``i``: tokens ``[0, (i + 1) * block)``).
        data: the prompt's token ids as bytes (4 a token).
        block: tokens per block.
    """

    blocks: tuple[bytes, ...]
    data: bytes
    block: int

    @classmethod
    def of(cls, token_ids: Sequence[int], *, block: int = BLOCK_TOKENS) -> PromptKeys:
        data = _token_bytes(token_ids)
        keys: list[bytes] = []
        previous = b""
        step = block * _TOKEN_BYTES
        for end in range(step, len(data) + 1, step):
            previous = _chain(previous, data[end - step : end])
            keys.append(previous)
        return cls(blocks=tuple(keys), data=data, block=block)

    @property
    def tokens(self) -> int:
        return len(self.data) // _TOKEN_BYTES

    def tail(self, depth: int, length: int) -> bytes:
        """The key of the first ``depth`` blocks and ``length`` (1 to ``block - 1``) tokens after them."""
        start = depth * self.block * _TOKEN_BYTES
        previous = self.blocks[depth - 1] if depth else b""
        return _chain(previous, self.data[start : start + length * _TOKEN_BYTES], kind=b"tail")


def block_keys(token_ids: Sequence[int], *, block: int = BLOCK_TOKENS) -> list[bytes]:
    """One key per whole leading block: key ``i`` stands for tokens ``[0, (i + 1) * block)``,
    so equal keys mean equal prefixes."""
    return list(PromptKeys.of(token_ids, block=block).blocks)


@dataclass(frozen=True, slots=True)
class Match(Generic[R]):
    """The longest prefix of a prompt the index knows: the replicas that served it (in
    the order they last did, most recent last; empty: none), its length in tokens, and
    whether it is a whole prompt served before that the prompt goes on from (a
    conversation's earlier turn) rather than only a prefix of longer ones (a shared
    system prompt) or the same prompt again."""

    holders: tuple[R, ...]
    tokens: int
    whole: bool


class _Entry(Generic[R]):
    __slots__ = ("ends", "holders", "tails")

    def __init__(self) -> None:
        self.holders: list[R] = []  # most recent last
        self.tails: set[int] = set()  # lengths of the tails recorded after this block
        self.ends = False  # a recorded prompt ended with this block (a tail key: always)


class PrefixIndex(Generic[R]):
    """Which replicas served each prompt prefix (block and tail keys), least recently used
    first out.

    Args:
        max_keys: keys remembered in all (each ~200 bytes with its holders).
    """

    def __init__(self, *, max_keys: int = 200_000) -> None:
        self._entries: OrderedDict[bytes, _Entry[R]] = OrderedDict()
        self._root_tails: set[int] = set()  # tails of prompts shorter than one block
        self._max_keys = max_keys

    def __len__(self) -> int:
        return len(self._entries)

    def _hold(self, key: bytes, replica: R) -> _Entry[R]:
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry[R]()
        else:
            self._entries.move_to_end(key)
        if entry.holders and entry.holders[-1] == replica:
            return entry
        if replica in entry.holders:
            entry.holders.remove(replica)
        entry.holders.append(replica)
        return entry

    def record(self, prompt: PromptKeys, replica: R) -> None:
        """``replica`` now holds this prompt: its whole blocks and its tail."""
        depth, rest = divmod(prompt.tokens, prompt.block)
        if rest:
            self._hold(prompt.tail(depth, rest), replica)
        for key in reversed(prompt.blocks):
            self._hold(key, replica)
        if not rest and depth:
            self._entries[prompt.blocks[-1]].ends = True
        if rest:
            tails = self._entries[prompt.blocks[depth - 1]].tails if depth else self._root_tails
            tails.add(rest)
        while len(self._entries) > self._max_keys:
            self._entries.popitem(last=False)

    def longest(self, prompt: PromptKeys, among: Set[R]) -> Match[R]:
        """The replicas in ``among`` holding the longest prefix of ``prompt`` any of them
        served (a recorded prompt that ends inside a block counts to its last token)."""
        depth = 0
        for key in prompt.blocks:
            if key not in self._entries:
                break
            depth += 1
        if depth:
            tails = self._entries[prompt.blocks[depth - 1]].tails
        else:
            tails = self._root_tails
        room = prompt.tokens - depth * prompt.block
        for length in sorted((t for t in tails if t <= room), reverse=True):
            entry = self._entries.get(prompt.tail(depth, length))
            holders = tuple(r for r in entry.holders if r in among) if entry is not None else ()
            if holders:
                tokens = depth * prompt.block + length
                return Match(holders, tokens, whole=tokens < prompt.tokens)
        for deepest in range(depth, 0, -1):
            entry = self._entries[prompt.blocks[deepest - 1]]
            holders = tuple(r for r in entry.holders if r in among)
            if holders:
                tokens = deepest * prompt.block
                return Match(holders, tokens, whole=entry.ends and tokens < prompt.tokens)
        return Match((), 0, whole=False)

    def forget(self, replica: R) -> None:
        """Drop a replica that is gone from every key (a key no one holds goes)."""
        for key in list(self._entries):
            entry = self._entries[key]
            if replica in entry.holders:
                entry.holders.remove(replica)
                if not entry.holders:
                    del self._entries[key]
