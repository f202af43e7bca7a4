"""Finding the end of a thought in a stream of token ids: :class:`EndTagMatcher`.

Many models spell their end tag in several tokens (SmolLM2 writes ``</think>`` as
``</``, ``think``, ``>``) or can spell it more than one way (DeepSeek-V4 has the single
token ``</think>`` but can also write the same text in pieces). The matcher therefore
follows the *bytes* of the emitted tokens with a KMP automaton over the tag text; a
model whose tag is one special token also takes a fast path on that id. The state is one
integer, the number of tag bytes matched so far, so a caller can keep one per token and
roll back by popping.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING

import torch

from thinkstruct.grammar.runtime.bitmask import allocate_bitmask, clear_allowed

if TYPE_CHECKING:
    from thinkstruct.tokenizer import Tokenizer

#: The token completes the tag exactly at its last byte.
COMPLETES = 1
#: The token completes the tag and goes on with more bytes: the answer would start inside
#: a token, unseen by the grammar, so such tokens are masked while thinking.
RUNS_ON = 2


class EndTagMatcher:
    """The end tag ``tag`` of one tokenizer, as a byte automaton over its tokens.

    Shared by every request of that tokenizer and tag (see :func:`end_tag_matcher`);
    all caches inside are filled lazily and safely from several threads.
    """

    def __init__(self, tokenizer: Tokenizer, tag: str) -> None:
        if not tag:
            raise ValueError("the end tag must not be empty")
        self.tokenizer = tokenizer
        self.text = tag
        self.tag = tag.encode("utf-8")
        ids = tokenizer.hf.convert_tokens_to_ids(tag)
        self.single_id: int | None = (
            ids
            if isinstance(ids, int)
            and ids in tokenizer.special_token_ids
            and tokenizer.hf.convert_ids_to_tokens(ids) == tag
            else None
        )
        self._vocab = tokenizer.decoded_vocab()
        self._fail = _failure_table(self.tag)
        self._steps: dict[tuple[int, int], tuple[int, int]] = {}
        self._next_ids: dict[int, tuple[int, ...]] = {}
        self._rows: dict[tuple[int, frozenset[int]], torch.Tensor] = {}
        self._run_on: dict[int, frozenset[int]] = {}
        self._lock = threading.Lock()
        self._tag_bytes = frozenset(self.tag)
        self._by_bytes: dict[bytes, int] | None = None

    # ---- stepping ------------------------------------------------------------------

    def step(self, matched: int, token_id: int) -> tuple[int, int]:
        """``(matched', status)`` after ``token_id``: status 0, :data:`COMPLETES` or
        :data:`RUNS_ON`. After a completion ``matched'`` is 0."""
        if token_id == self.single_id:
            return 0, COMPLETES
        key = (matched, token_id)
        cached = self._steps.get(key)
        if cached is not None:
            return cached
        raw = self._vocab[token_id] if 0 <= token_id < len(self._vocab) else b""
        result = self._walk(matched, raw)
        if len(self._steps) < 1_000_000:
            self._steps[key] = result
        return result

    def _walk(self, matched: int, raw: bytes) -> tuple[int, int]:
        if not raw:
            return 0, 0  # a special token interrupts any partial tag
        if matched == 0 and not self._tag_bytes.intersection(raw):
            return 0, 0
        tag, fail, n = self.tag, self._fail, len(self.tag)
        for i, byte in enumerate(raw):
            while matched and tag[matched] != byte:
                matched = fail[matched - 1]
            if tag[matched] == byte:
                matched += 1
            if matched == n:
                return 0, COMPLETES if i == len(raw) - 1 else RUNS_ON
        return matched, 0

    # ---- forcing the tag -------------------------------------------------------------

    def closing_ids(self, matched: int) -> tuple[int, ...]:
        """Tokens that spell the rest of the tag after ``matched`` bytes (greedy longest
        tokens; the single tag token where the tokenizer has one)."""
        cached = self._next_ids.get(matched)
        if cached is None:
            cached = self._closing_ids(matched)
            self._next_ids[matched] = cached
        return cached

    def _closing_ids(self, matched: int) -> tuple[int, ...]:
        if matched == 0 and self.single_id is not None:
            return (self.single_id,)
        by_bytes = self._bytes_to_id()
        rest = self.tag[matched:]
        out: list[int] = []
        while rest:
            for length in range(len(rest), 0, -1):
                token = by_bytes.get(rest[:length])
                if token is not None:
                    out.append(token)
                    rest = rest[length:]
                    break
            else:
                raise ValueError(f"no token spells {rest!r} of the end tag {self.text!r}")
        return tuple(out)

    def _bytes_to_id(self) -> dict[bytes, int]:
        table = self._by_bytes
        if table is None:
            table = {}
            special = self.tokenizer.special_token_ids
            for idx, raw in enumerate(self._vocab):
                if raw and idx not in special and raw in self.tag:
                    table.setdefault(raw, idx)
            self._by_bytes = table
        return table

    # ---- masks while thinking ------------------------------------------------------

    def thinking_row(self, matched: int, banned: frozenset[int]) -> torch.Tensor:
        """The mask row while thinking: everything but ``banned`` and the tokens that
        would run on past the tag (an int32 ``[words]`` tensor; do not modify)."""
        key = (matched, banned)
        row = self._rows.get(key)
        if row is None:
            with self._lock:
                row = self._rows.get(key)
                if row is None:
                    mask = allocate_bitmask(1, self.tokenizer.vocab_size)
                    clear_allowed(mask, 0, banned | self.run_on_ids(matched))
                    row = mask[0]
                    self._rows[key] = row
        return row

    def run_on_ids(self, matched: int) -> frozenset[int]:
        """Tokens that complete the tag from ``matched`` and go on past it."""
        cached = self._run_on.get(matched)
        if cached is None:
            last = self.tag[-1]
            cached = frozenset(
                idx
                for idx, raw in enumerate(self._vocab)
                if last in raw and self._walk(matched, raw)[1] == RUNS_ON
            )
            self._run_on[matched] = cached
        return cached


def _failure_table(pattern: bytes) -> list[int]:
    fail = [0] * len(pattern)
    k = 0
    for i in range(1, len(pattern)):
        while k and pattern[i] != pattern[k]:
            k = fail[k - 1]
        if pattern[i] == pattern[k]:
            k += 1
        fail[i] = k
    return fail


_matchers: weakref.WeakKeyDictionary[Tokenizer, dict[str, EndTagMatcher]] = weakref.WeakKeyDictionary()
_matchers_lock = threading.Lock()


def end_tag_matcher(tokenizer: Tokenizer, tag: str | None = None) -> EndTagMatcher:
    """The shared matcher for ``tag`` (default: the tokenizer's think-end text)."""
    text = tag or tokenizer.think_end_text
    with _matchers_lock:
        per_tokenizer = _matchers.setdefault(tokenizer, {})
        matcher = per_tokenizer.get(text)
        if matcher is None:
            matcher = EndTagMatcher(tokenizer, text)
            per_tokenizer[text] = matcher
    return matcher
