"""Checked keywords without undo: the closing-token rule (``ClosingRule``) and the schema
analysis that says where it can leave no token (``dead_ends``).

Real tokenizer (SmolLM2's, the embedded model's), real strict ``auto`` compiles."""

from __future__ import annotations

import functools
import json
import random
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thinkstruct import Constraint, Tokenizer
from thinkstruct.grammar.backends import backend_class
from thinkstruct.grammar.base import NO_BACKEND_ENFORCES, CompiledGrammar
from thinkstruct.grammar.json_format import JsonFormat
from thinkstruct.grammar.runtime.bitmask import allocate_bitmask, allowed_token_ids, is_allowed
from thinkstruct.grammar.runtime.closing_tokens import ClosingRule, TokenClasses
from thinkstruct.grammar.schema.checks import plan_checks
from thinkstruct.grammar.schema.dead_ends import dead_ends
from thinkstruct.grammar.service.compiler import CompilerConfig, GrammarCompiler
from thinkstruct.tokenizer import smollm2_gguf_path

UNIQUE_STRINGS = {
    "type": "object",
    "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
    "required": ["tags"],
    "additionalProperties": False,
}
NOT_CONST = {"type": "string", "not": {"const": "ab"}}
ONE_OF_FINITE = {"oneOf": [{"type": "string"}, {"type": "string", "enum": ["a", "b"]}]}
ROOT_NUMBER = {"type": "number", "not": {"enum": [5, 50]}}


@functools.cache
def tokenizer() -> Tokenizer:
    return Tokenizer.from_pretrained(smollm2_gguf_path())


@functools.cache
def compiler() -> GrammarCompiler:
    return GrammarCompiler(
        tokenizer(), CompilerConfig(strict=True, json_format=JsonFormat(max_whitespace=0), worker_processes=0)
    )


@functools.cache
def checked(schema_text: str) -> CompiledGrammar:
    compiled = compiler().compile(Constraint.json_schema(schema_text))
    assert compiled.checks is not None, "the schema should need checks"
    return compiled


def grammar(schema: dict[str, Any]) -> CompiledGrammar:
    return checked(json.dumps(schema))


def walk_to(compiled: CompiledGrammar, text: str) -> tuple[Any, ClosingRule]:
    matcher = compiled.matcher()
    rule = ClosingRule(compiled.checks, compiled.tokenizer)  # type: ignore[arg-type]
    for token_id in compiled.tokenizer.encode(text):
        assert matcher.accept_token(token_id)
        assert rule.accept(token_id) is None
    return matcher, rule


def masked(matcher: Any, rule: ClosingRule) -> Any:
    bitmask = allocate_bitmask(1, tokenizer().vocab_size)
    matcher.fill_bitmask(bitmask, 0)
    rule.restrict(bitmask, 0)
    return bitmask


def token(text: str) -> int:
    ids = tokenizer().encode(text)
    assert len(ids) == 1, (text, ids)
    return ids[0]


def test_a_repeated_item_cannot_close_but_can_go_on() -> None:
    matcher, rule = walk_to(grammar(UNIQUE_STRINGS), '{"tags":["ab","a')
    b = token("b")
    assert matcher.accept_token(b) and rule.accept(b) is None
    quote = token('"')
    before = allocate_bitmask(1, tokenizer().vocab_size)
    matcher.fill_bitmask(before, 0)
    assert is_allowed(before, 0, quote)  # the grammar alone allows the repeat to close
    after = masked(matcher, rule)
    assert not is_allowed(after, 0, quote)
    assert is_allowed(after, 0, token("c"))  # the item can still become another one
    assert rule.closes_failing(quote) is not None
    assert rule.accept(quote) is not None  # taken anyway: refused, nothing changed
    assert rule.checker.text == '{"tags":["ab","ab'


def test_rollback_restores_the_rule() -> None:
    compiled = grammar(UNIQUE_STRINGS)
    matcher, rule = walk_to(compiled, '{"tags":["ab","')
    ids = tokenizer().encode("ab")
    for token_id in ids:
        assert matcher.accept_token(token_id) and rule.accept(token_id) is None
    assert not is_allowed(masked(matcher, rule), 0, token('"'))
    matcher.rollback(len(ids))
    rule.rollback(len(ids))
    assert rule.checker.text == '{"tags":["ab","'
    assert is_allowed(masked(matcher, rule), 0, token('"'))  # an empty string is new


def test_a_stop_token_closes_a_number_at_the_root() -> None:
    compiled = grammar(ROOT_NUMBER)
    matcher, rule = walk_to(compiled, "5")
    row = masked(matcher, rule)
    for stop in tokenizer().eos_token_ids:
        assert not is_allowed(row, 0, stop)
    assert is_allowed(row, 0, token("1"))
    matcher, rule = walk_to(compiled, "7")
    assert any(is_allowed(masked(matcher, rule), 0, stop) for stop in tokenizer().eos_token_ids)


def test_token_classes_hold_the_closing_characters() -> None:
    classes = TokenClasses.of(tokenizer())
    texts = tokenizer().decoded_vocab()
    size = tokenizer().vocab_size
    in_string = {int(i) for i in allowed_token_ids(classes.in_string.unsqueeze(0), 0, size)}
    in_number = {int(i) for i in allowed_token_ids(classes.in_number.unsqueeze(0), 0, size)}
    assert in_string == {
        i for i, raw in enumerate(texts) if b'"' in raw and i not in tokenizer().special_token_ids
    }
    assert token("e") not in in_number and token(",") in in_number and token("1") not in in_number


@pytest.mark.parametrize("schema", [UNIQUE_STRINGS, NOT_CONST, ONE_OF_FINITE, ROOT_NUMBER], ids=str)
@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_enforceable_schemas_never_leave_no_token(schema: dict[str, Any], seed: int) -> None:
    """A random walk through the masked grammar: a token is always left, and an answer
    that ends is valid."""
    assert dead_ends(plan_checks(schema, inexact=NO_BACKEND_ENFORCES)) == ()
    compiled = grammar(schema)
    matcher = compiled.matcher()
    rule = ClosingRule(compiled.checks, compiled.tokenizer)  # type: ignore[arg-type]
    pick = random.Random(seed)
    stops = set(tokenizer().eos_token_ids)
    for _ in range(48):
        allowed = allowed_token_ids(masked(matcher, rule), 0, tokenizer().vocab_size).tolist()
        assert allowed, f"no token left after {rule.checker.text!r}"
        # Stop as soon as allowed half the time, so that walks end.
        choice = next((t for t in allowed if t in stops), None) if pick.random() < 0.5 else None
        if choice is None:
            choice = pick.choice(allowed)
        assert matcher.accept_token(choice)
        assert rule.accept(choice) is None
        if matcher.is_terminated():
            jsonschema.validate(json.loads(rule.checker.text), schema)
            return


CLASSIFIED: list[tuple[dict[str, Any], set[str]]] = [
    (UNIQUE_STRINGS, set()),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, {"uniqueItems"}),
    ({"type": "array", "items": {"type": "string", "maxLength": 2}, "uniqueItems": True}, {"uniqueItems"}),
    (NOT_CONST, set()),
    ({"type": "string", "not": {"pattern": "^a"}}, {"not"}),
    (ONE_OF_FINITE, set()),
    ({"oneOf": [{"type": "integer"}, {"type": "string"}]}, set()),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, {"oneOf"}),
    (
        {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "oneOf": [{"required": ["a"]}, {"required": ["b"]}],
        },
        {"oneOf"},
    ),
    ({"type": "object", "minProperties": 2}, set()),
    ({"type": "object", "minProperties": 2, "maxProperties": 3}, {"minProperties", "maxProperties"}),
    ({"type": "array", "contains": {"const": 3}}, set()),
    ({"type": "array", "contains": {"const": 3}, "maxItems": 2}, {"contains"}),
    ({"if": {"required": ["a"]}, "then": {"required": ["b"]}}, {"if", "then"}),
]


@pytest.mark.parametrize(("schema", "dead"), CLASSIFIED, ids=[json.dumps(s) for s, _ in CLASSIFIED])
def test_dead_ends_by_rule(schema: dict[str, Any], dead: set[str]) -> None:
    # xgrammar's inexact keywords: the most any backend leaves to checks.
    found = dead_ends(plan_checks(schema, inexact=backend_class("xgrammar").inexact_keywords))
    assert {e.keyword for e in found} == dead
    for entry in found:
        assert entry.pointer.endswith("/" + entry.keyword)
