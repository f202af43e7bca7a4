"""No silently dead grammars: a compiled grammar can produce a valid answer, its mask and
accept_token agree, and schemas without a finite (or short enough) instance are refused."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import thinkstruct
from thinkstruct import CompiledGrammar, Constraint, InvalidConstraint, Tokenizer
from thinkstruct.grammar.api import first_rejected
from thinkstruct.grammar.runtime.bitmask import (
    allocate_bitmask,
    allowed_bounds,
    allowed_token_ids,
    set_allowed,
)
from thinkstruct.grammar.service.compiler import CompilerConfig, GrammarCompiler

ANYOF_2010 = Constraint.json_schema(
    {
        "anyOf": [
            {"type": "object", "properties": {f"p{i}": {"type": "integer"}}, "required": [f"p{i}"]}
            for i in range(2010)
        ]
    }
)
OPTIONAL_500 = Constraint.json_schema(
    {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(500)}}
)
#: About 10,400 Earley items in one row: past llguidance's (raised) limit.
OPTIONAL_2600 = Constraint.json_schema(
    {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(2600)}}
)
EBNF_20K = Constraint.ebnf("root ::= " + " | ".join(f'"x{i}"' for i in range(20_000)))
CHOICE_2000 = Constraint.choice([f"a{i}" for i in range(2000)])


@pytest.fixture(scope="module")
def service(tokenizer: Tokenizer):
    with GrammarCompiler(tokenizer, CompilerConfig(timeout_s=120.0)) as c:
        yield c


def _contract_holds(compiled: CompiledGrammar, answer: str, *, samples: int = 12) -> None:
    """Along ``answer``, every allowed token that is sampled is accepted (never "allowed,
    then refused"), and the answer itself is accepted."""
    tok = compiled.tokenizer
    ids = tok.encode(answer)
    rng = random.Random(0)
    bitmask = allocate_bitmask(1, tok.vocab_size)
    for n in range(len(ids) + 1):
        g = compiled.matcher()
        assert g.accept_tokens(ids[:n]) == n
        g.fill_bitmask(bitmask, 0)
        allowed = allowed_token_ids(bitmask, 0, tok.vocab_size).tolist()
        assert allowed, f"nothing allowed after {tok.decode(ids[:n])!r}"
        for t in rng.sample(allowed, min(samples, len(allowed))):
            fresh = compiled.matcher()
            fresh.accept_tokens(ids[:n])
            assert fresh.accept_token(t), (
                f"{tok.decode([t])!r} allowed after {tok.decode(ids[:n])!r} but refused"
            )
    assert first_rejected(compiled, answer) is None


@pytest.mark.parametrize(
    "constraint, answer, fallback",
    [
        # Within llguidance's raised row limit: it takes them itself.
        (ANYOF_2010, '{"p2009":7}', False),
        (OPTIONAL_500, '{"p3":1,"p498":2}', False),
        (CHOICE_2000, "a1999", False),  # one regex lexeme, not 2,000 grammar rules
        # Past it: refused by llguidance up front, compiled by xgrammar.
        (EBNF_20K, "x19998", True),
    ],
    ids=["anyOf-2010", "optional-500", "choice-2000", "ebnf-20000"],
)
def test_wide_alternations_get_a_backend_that_can_produce_them(
    service: GrammarCompiler, constraint: Constraint, answer: str, fallback: bool
) -> None:
    compiled = service.compile(constraint)
    assert compiled.backend == ("xgrammar" if fallback else "llguidance")
    _contract_holds(compiled, answer)


@pytest.mark.parametrize("constraint", [OPTIONAL_2600, EBNF_20K], ids=["optional-2600", "ebnf-20000"])
def test_llguidance_past_its_row_limit_says_why(service: GrammarCompiler, constraint: Constraint) -> None:
    with pytest.raises(
        InvalidConstraint, match=r"too many alternatives for llguidance: [\d,]+ > limit 10,000"
    ) as info:
        service.compile(constraint, backend="llguidance")
    assert info.value.backend == "llguidance"


@pytest.mark.parametrize(
    "schema, pointer",
    [
        ({"$ref": "#"}, ""),
        (
            {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
            "/$defs/a",
        ),
        ({"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}, ""),
        ({"type": "array", "minItems": 1, "items": False}, "/items"),
    ],
)
def test_schemas_without_a_finite_instance_are_refused(backend: str, schema: dict, pointer: str) -> None:
    with pytest.raises(InvalidConstraint, match="no finite instance") as info:
        thinkstruct.compile(Constraint.json_schema(schema), Tokenizer.default(), backend)
    assert info.value.pointer == pointer


def test_recursion_with_a_base_case_compiles() -> None:
    tree = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                "required": ["kids"],
            }
        },
        "$ref": "#/$defs/node",
    }
    assert thinkstruct.accepts(Constraint.json_schema(tree), '{"kids":[{"kids":[]}]}')


@pytest.mark.parametrize(
    "schema, pointer",
    [
        ({"type": "array", "items": {"type": "integer"}, "minItems": 1_000_000_000}, "/minItems"),
        ({"type": "string", "minLength": 10**9}, "/minLength"),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "string", "minLength": 10**9}},
                "required": ["a"],
            },
            "/properties/a/minLength",
        ),
    ],
)
def test_instances_longer_than_the_context_are_refused(
    tokenizer: Tokenizer, schema: dict, pointer: str
) -> None:
    with GrammarCompiler(tokenizer, CompilerConfig(worker_processes=0, max_answer_tokens=131_072)) as c:
        with pytest.raises(InvalidConstraint, match="131,072 tokens") as info:
            c.compile(Constraint.json_schema(schema))
        assert info.value.pointer == pointer
        # A long but possible one is fine.
        c.compile(Constraint.json_schema({"type": "array", "minItems": 1000}))


@pytest.mark.parametrize("char", ["\x01", "\x1f", "\x7f"], ids=["U+0001", "U+001F", "U+007F"])
def test_control_characters_in_property_names(char: str) -> None:
    key = f"a{char}b"
    constraint = Constraint.json_schema(
        {"type": "object", "properties": {key: {"type": "integer"}}, "required": [key]}
    )
    raw = '{"a' + char + 'b":1}'
    escaped = '{"a\\u' + f"{ord(char):04x}" + 'b":1}'
    spellings = [text for text in (raw, escaped) if _valid_json(text)]
    for backend in ("auto", "llguidance", "xgrammar", "outlines"):
        try:
            compiled = thinkstruct.compile(constraint, Tokenizer.default(), backend)
        except InvalidConstraint:
            assert backend != "auto"  # refused by a backend that cannot produce it
            continue
        # The grammar produces a valid spelling of the key, and no invalid one.
        assert any(first_rejected(compiled, text) is None for text in spellings), backend
        if not _valid_json(raw):
            assert first_rejected(compiled, raw) is not None, backend


def _valid_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


@settings(max_examples=200, deadline=None)
@given(
    allowed=st.sets(st.integers(0, 299)),
    stops=st.sets(st.integers(0, 299), max_size=3),
    vocab_size=st.integers(1, 300),
)
def test_allowed_bounds_are_the_lowest_and_highest_listed_id(
    allowed: set[int], stops: set[int], vocab_size: int
) -> None:
    """The probe reads its bounds off the words; a listing of the allowed ids agrees
    (bits past the vocabulary, as a library may leave them set, do not count)."""
    stops = {t for t in stops if t < vocab_size}
    bitmask = allocate_bitmask(1, 300)
    bitmask.zero_()
    for t in allowed:
        set_allowed(bitmask, 0, t)
    listed = [t for t in allowed_token_ids(bitmask, 0, vocab_size).tolist() if t not in stops]
    expected = tuple(dict.fromkeys((listed[0], listed[-1]))) if listed else ()
    assert allowed_bounds(bitmask[0, : (vocab_size + 31) // 32], vocab_size, excluded=stops) == expected


#: Found on MaskBench: the property has no type, so ``null`` is valid; xgrammar guesses an
#: object from its ``properties`` and rejects every valid instance the probe tries.
UNTYPED_PROPERTY = Constraint.json_schema(
    {
        "type": "object",
        "properties": {
            "notification": {"properties": {"person_id": {"type": "integer"}}, "required": ["person_id"]}
        },
        "required": ["notification"],
    }
)


def test_a_grammar_that_rejects_every_valid_witness_is_refused() -> None:
    tok = Tokenizer.default()
    from thinkstruct.grammar.api import get_backend
    from thinkstruct.grammar.base import InvalidGrammar

    result = get_backend(tok, "xgrammar").compile(UNTYPED_PROPERTY)
    assert isinstance(result, InvalidGrammar)
    assert "rejects every valid instance tried" in str(result.error), result.error
    # llguidance, which skips the witness, produces the valid instance itself.
    compiled = get_backend(tok, "llguidance").compile(UNTYPED_PROPERTY)
    assert isinstance(compiled, CompiledGrammar)
    assert first_rejected(compiled, '{"notification":null}') is None
