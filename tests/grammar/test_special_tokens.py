"""No mask ever allows a special token inside a constrained answer.

Measured before the fix: xgrammar's tokenizer info built naively from the DeepSeek-V4
tokenizer marks no token special, so inside a JSON string its mask allowed 1,282 of the
1,283 added tokens (BOS and </think> included); llguidance let "｜DSML｜"-style added
tokens through.
"""

from __future__ import annotations

import pytest

from thinkstruct import CompiledGrammar, Constraint, Tokenizer
from thinkstruct.grammar.runtime.bitmask import allocate_bitmask, allowed_token_ids

from .conftest import compiled

FREE_TEXT_SCHEMA = {
    "type": "object",
    "properties": {
        "note": {"type": "string"},
        # not "items": {} — outlines-core's regex for any JSON value takes over a minute
        "items": {"type": "array", "items": {"type": ["integer", "string"]}},
    },
    "required": ["note", "items"],
}

# Prefixes that leave the grammar inside a string, between values, and at the very start.
PREFIXES = {
    "start": "",
    "inside a string": '{"note":"abc',
    "between values": '{"note":"abc",',
    "inside an array": '{"note":"abc","items":[1,',
    "inside a nested string": '{"note":"abc","items":["x',
}


def _allowed(cg: CompiledGrammar, tokenizer: Tokenizer, prefix: str) -> set[int]:
    g = cg.matcher()
    ids = tokenizer.encode(prefix)
    assert g.accept_tokens(ids) == len(ids)
    bm = allocate_bitmask(1, tokenizer.vocab_size)
    g.fill_bitmask(bm, 0)
    return set(allowed_token_ids(bm, 0, tokenizer.vocab_size).tolist())


@pytest.mark.parametrize("where", list(PREFIXES))
def test_no_special_token_in_json(backend: str, tokenizer: Tokenizer, where: str) -> None:
    cg = compiled(backend, Constraint.json_schema(FREE_TEXT_SCHEMA))
    allowed = _allowed(cg, tokenizer, PREFIXES[where])
    assert allowed, "the mask must allow something"
    leaked = allowed & tokenizer.special_token_ids
    assert not leaked, [tokenizer.hf.convert_ids_to_tokens(i) for i in sorted(leaked)[:10]]


def test_free_text_regex_allows_text_but_no_special_token(backend: str, tokenizer: Tokenizer) -> None:
    cg = compiled(backend, Constraint.regex(r"(.|\n){0,40}"))
    allowed = _allowed(cg, tokenizer, "thinking about ")
    assert len(allowed) > 10_000  # free text really is free ...
    assert not allowed & (
        tokenizer.special_token_ids - set(tokenizer.eos_token_ids)
    )  # ... but not control tokens
    assert set(tokenizer.eos_token_ids) <= allowed  # the answer may end here


def test_only_stop_tokens_where_the_answer_may_end(backend: str, tokenizer: Tokenizer) -> None:
    cg = compiled(backend, Constraint.json_schema(FREE_TEXT_SCHEMA))
    allowed = _allowed(cg, tokenizer, '{"note":"abc","items":[]}')
    assert allowed & tokenizer.special_token_ids == set(tokenizer.eos_token_ids)


def test_padding_ids_are_never_allowed(backend: str, tokenizer: Tokenizer) -> None:
    padded = Tokenizer(tokenizer.hf, vocab_size=tokenizer.vocab_size + 100, name="padded")
    import thinkstruct

    cg = thinkstruct.compile(Constraint.regex(r"[a-z ]{0,10}"), padded, backend)
    g = cg.matcher()
    bm = allocate_bitmask(1, padded.vocab_size)
    g.fill_bitmask(bm, 0)
    allowed = allowed_token_ids(bm, 0, padded.vocab_size)
    assert int(allowed.max()) < tokenizer.vocab_size
