"""Whole answers against a compiled grammar: :func:`first_rejected` and :func:`can_stop`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from thinkstruct.grammar.bitmask import allocate_bitmask, is_allowed

if TYPE_CHECKING:
    from thinkstruct.grammar.base import CompiledGrammar
    from thinkstruct.grammar.matcher import GrammarMatcher
    from thinkstruct.tokenizer import Tokenizer


def first_rejected(compiled: CompiledGrammar, text: str) -> int | None:
    """Character offset in ``text`` where the grammar rejects it, or ``None`` if it accepts
    it as a complete answer (``len(text)`` when the text is a valid but unfinished prefix)."""
    tok = compiled.tokenizer
    grammar = compiled.matcher()
    ids, offsets = tok.encode_with_offsets(text)
    for token_id, (start, end) in zip(ids, offsets, strict=True):
        if not grammar.accept_token(token_id):
            return _first_rejected_char(grammar, tok, text, start, end)
    return None if can_stop(grammar, tok) else len(text)


def _first_rejected_char(grammar: GrammarMatcher, tok: Tokenizer, text: str, start: int, end: int) -> int:
    # The rejected token may begin with characters the grammar allows (" " of ' "x"');
    # feed its span one character at a time to find the first one it does not.
    for pos in range(start, max(end, start + 1)):
        ids = tok.encode(text[pos])
        if grammar.accept_tokens(ids) != len(ids):
            return pos
    return start


def can_stop(grammar: GrammarMatcher, tokenizer: Tokenizer) -> bool:
    """Whether a stop token is allowed next (the answer so far is complete)."""
    bitmask = allocate_bitmask(1, tokenizer.vocab_size)
    grammar.fill_bitmask(bitmask, 0)
    return any(is_allowed(bitmask, 0, eos) for eos in tokenizer.eos_token_ids)


__all__ = ["can_stop", "first_rejected"]
