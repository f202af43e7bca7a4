"""Whole answers against a compiled grammar: :func:`first_rejected` and :func:`can_stop`."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from thinkstruct.grammar.compiled import CompiledGrammar
    from thinkstruct.grammar.runtime.matcher import GrammarMatcher
    from thinkstruct.tokenizer import Tokenizer


def first_rejected(compiled: CompiledGrammar, text: str) -> int | None:
    """Character offset in ``text`` where the grammar rejects it, or ``None`` if it accepts
    it as a complete answer (``len(text)`` when the text is a valid but unfinished prefix)."""
    tok = compiled.tokenizer
    grammar = compiled.matcher()
    ids, offsets = tok.encode_with_offsets(text)
    accepted = grammar.accept_tokens(ids)
    if accepted < len(ids):
        start, end = offsets[accepted]
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
    # Asked without a mask (a full fill over the vocabulary costs ~0.5 ms): the matcher
    # contract makes "accepted" and "allowed by the mask" the same.
    return any(grammar.validate_tokens([eos]) == 1 for eos in tokenizer.eos_token_ids)


__all__ = ["can_stop", "first_rejected"]
