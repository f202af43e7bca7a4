"""Checked keywords without undo: :class:`ClosingRule`.

thinkstruct's engine checks a value as it closes and, when it fails, takes the value's
tokens back and samples again (:mod:`.value_checks`). A serving engine that cannot take a
token back needs the check before the token: a value's *closing token* — the closing
quote, bracket or brace, the comma, whitespace or bracket after a number, the last letter
of ``true`` — is allowed only where the value, closed there, passes its checks. So a
repeated array item, a failing ``not`` or an ambiguous ``oneOf`` is never finished, and
nothing needs undoing. Whether such a mask can leave a request with no token at all is a
property of the schema, decided before generation
(:func:`thinkstruct.grammar.schema.dead_ends.dead_ends`).

The two reusable parts:

- :class:`TokenClasses`, per tokenizer: which tokens can close which kind of value
  (a string closes at a quote, a number at any character that cannot continue it, a
  container at a bracket; a token that opens and closes a value holds two quotes, a
  bracket, a number and its end, or a whole literal);
- :meth:`ClosingRule.closes_failing`: the check of the value(s) a token closes, by
  feeding its text to the answer's :class:`~.value_checks.ValueChecker` and taking it back.

:meth:`ClosingRule.restrict` clears, in a request's bitmask row, every allowed token that
closes a failing value; :meth:`ClosingRule.accept` and :meth:`ClosingRule.rollback` follow
the tokens the request takes. Stop tokens close a number at the root (``finish``).
"""

from __future__ import annotations

import codecs
import re
from typing import TYPE_CHECKING

from thinkstruct.grammar.runtime.value_checks import CheckFailure, ValueChecker

if TYPE_CHECKING:
    import torch

    from thinkstruct.grammar.schema.checks import CheckPlan
    from thinkstruct.tokenizer import Tokenizer

_NUMBER_BYTES = frozenset(b"0123456789eE+-.")
_WHITESPACE = b" \t\n\r"
# A token that, read from between values, opens and closes one: a bracket, two quotes, a
# digit then a byte that ends a number, or a whole literal.
_CLOSES_FROM_STRUCTURE = re.compile(rb'[\]}]|"[^"]*"|[0-9][^0-9eE+\-.]|true|false|null')


class TokenClasses:
    """Rows (int32 ``[ceil(vocab_size / 32)]``, bit ``j`` of word ``i`` for token
    ``32 * i + j``) of the tokens that can close a value, by what is being read.

    Attributes:
        in_string: tokens holding a quote (a string value or key closes at its quote).
        in_number: tokens holding a byte that cannot continue a number.
        in_structure: tokens that open and close a value, or close a container.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        import numpy as np
        import torch

        from thinkstruct.grammar.runtime.bitmask import bitmask_words

        size = bitmask_words(tokenizer.vocab_size) * 32
        string, number, structure = (np.zeros(size, dtype=bool) for _ in range(3))
        special = tokenizer.special_token_ids
        for token_id, raw in enumerate(tokenizer.decoded_vocab()):
            if token_id in special or not raw:
                continue
            string[token_id] = b'"' in raw
            number[token_id] = any(b not in _NUMBER_BYTES for b in raw)
            structure[token_id] = _CLOSES_FROM_STRUCTURE.search(raw) is not None

        def packed(flags: np.ndarray) -> torch.Tensor:
            words = np.packbits(flags, bitorder="little").view("<i4")
            return torch.from_numpy(words.astype(np.int32))

        self.in_string = packed(string)
        self.in_number = packed(number)
        self.in_structure = packed(structure)

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> TokenClasses:
        """The tokenizer's shared instance (built once, a few hundred ms on 130k tokens)."""
        return tokenizer.cached("closing-token-classes", lambda: cls(tokenizer))

    def candidates(self, scanning: str) -> torch.Tensor | None:
        """The row of tokens that can close a value while reading ``scanning`` (what
        :attr:`ValueChecker.scanning` says); ``None``: every token (a literal)."""
        if scanning == "string":
            return self.in_string
        if scanning == "number":
            return self.in_number
        if scanning == "structure":
            return self.in_structure
        return None


class ClosingRule:
    """The closing-token rule for one answer (see the module docstring).

    Feed it every answer token the request takes (never the thought's), in order.

    Args:
        plan: the compiled grammar's checks (``CompiledGrammar.checks``, a schema's).
        tokenizer: the model's vocabulary.
    """

    def __init__(self, plan: CheckPlan, tokenizer: Tokenizer) -> None:
        self._checker = ValueChecker(plan)
        self._texts = tokenizer.decoded_vocab()
        self._stops = frozenset(tokenizer.eos_token_ids)
        self._classes = TokenClasses.of(tokenizer)
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        # Per token taken: the decoder's state before it, and whether it fed a piece.
        self._history: list[tuple[tuple[bytes, int], bool]] = []

    @property
    def checker(self) -> ValueChecker:
        """The answer's checker (its text: what was accepted so far)."""
        return self._checker

    def accept(self, token_id: int) -> CheckFailure | None:
        """Take ``token_id``; the failure of a value it closes, if any (then the token
        should not have been allowed: the caller ends the request)."""
        state = self._decoder.getstate()
        if token_id in self._stops:
            self._history.append((state, False))
            return self._checker.finish()
        piece = self._decoder.decode(self._texts[token_id])
        failure = self._checker.feed(piece)
        self._history.append((state, True))
        if failure is not None:
            self.rollback(1)
        return failure

    def rollback(self, tokens: int) -> None:
        """Take back the last ``tokens`` tokens."""
        if tokens <= 0:
            return
        undone = self._history[len(self._history) - tokens :]
        del self._history[len(self._history) - tokens :]
        self._checker.rollback(sum(fed for _, fed in undone))
        self._decoder.setstate(undone[0][0])

    def closes_failing(self, token_id: int) -> CheckFailure | None:
        """The failure of a value ``token_id`` would close now, if any; nothing changes."""
        if token_id in self._stops:
            return self._checker.finish()
        state = self._decoder.getstate()
        piece = self._decoder.decode(self._texts[token_id])
        self._decoder.setstate(state)
        failure = self._checker.feed(piece)
        self._checker.rollback(1)
        return failure

    def restrict(self, bitmask: torch.Tensor, row: int) -> int:
        """Clear in ``bitmask[row]`` every allowed token that closes a failing value;
        how many were cleared."""
        import torch

        from thinkstruct.grammar.runtime.bitmask import clear_allowed, is_allowed

        allowed = bitmask[row]
        classes = self._classes.candidates(self._checker.scanning)
        candidates = allowed if classes is None else allowed & classes
        # A stop token the grammar allows ends the answer: it closes a number at the root.
        banned = [stop for stop in self._stops if is_allowed(bitmask, row, stop)]
        if not banned or self._checker.finish() is None:
            banned = []
        for word in torch.nonzero(candidates).flatten().tolist():
            bits = int(candidates[word]) & 0xFFFFFFFF
            while bits:
                low = bits & -bits
                bits ^= low
                token_id = word * 32 + low.bit_length() - 1
                if token_id not in self._stops and self.closes_failing(token_id) is not None:
                    banned.append(token_id)
        clear_allowed(bitmask, row, banned)
        return len(banned)


__all__ = ["ClosingRule", "TokenClasses"]
