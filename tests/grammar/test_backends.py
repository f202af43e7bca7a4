"""Behaviour every backend shares: acceptance, stop tokens, rollback, one JSON format."""

from __future__ import annotations

import json

import pytest

import thinkstruct
from thinkstruct import CompiledGrammar, Constraint, InvalidConstraint, JsonFormat, Tokenizer
from thinkstruct.grammar.api import can_stop, first_rejected
from thinkstruct.grammar.runtime.bitmask import allocate_bitmask, allowed_token_ids, is_allowed

from .conftest import BACKENDS, PERSON_SCHEMA, compiled


@pytest.mark.parametrize(
    "text, ok",
    [
        ('{"name":"Ada","age":36,"tags":["x"]}', True),
        ('{"name": "Ada", "age": 36, "tags": ["x", "y"]}', True),
        ('{"name":"Ada","age":36,"tags":[]}', True),
        ('{"name":"Ada","age":36}', False),  # missing required
        ('{"name":"Ada","age":"36","tags":[]}', False),  # wrong type
        ('{"name":"Ada","age":36,"tags":[],"x":1}', False),  # additionalProperties
        ('{"name":"Ada","age":36,"tags":[]', False),  # unfinished
        ('{"name":"</think>","age":1,"tags":[]}', True),  # tag text inside a string is text
    ],
)
def test_accepts_the_same_answers(person: CompiledGrammar, text: str, ok: bool) -> None:
    assert (first_rejected(person, text) is None) is ok


def test_rejected_token_leaves_state_unchanged(person: CompiledGrammar, tokenizer: Tokenizer) -> None:
    g = person.matcher()
    assert g.accept_tokens(tokenizer.encode('{"name":')) == len(tokenizer.encode('{"name":'))
    before = allocate_bitmask(1, tokenizer.vocab_size)
    g.fill_bitmask(before, 0)
    bad = tokenizer.encode("42")[0]
    assert not is_allowed(before, 0, bad)
    assert g.accept_token(bad) is False
    after = allocate_bitmask(1, tokenizer.vocab_size)
    g.fill_bitmask(after, 0)
    assert bool((before == after).all())
    assert g.accept_tokens(tokenizer.encode('"Ada"')) == len(tokenizer.encode('"Ada"'))


def test_every_stop_token_ends_a_complete_answer(backend: str, tokenizer: Tokenizer) -> None:
    # A tokenizer with two stop ids: both must be allowed, and either terminates.
    two_eos = Tokenizer(tokenizer.hf, eos_token_ids=[1, 128803], name="two-eos")
    cg = thinkstruct.compile(Constraint.regex("(yes|no)"), two_eos, backend)
    for eos in two_eos.eos_token_ids:
        g = cg.matcher()
        assert not can_stop(g, two_eos)
        assert g.accept_token(eos) is False  # not before the answer is complete
        assert g.accept_tokens(two_eos.encode("yes")) == len(two_eos.encode("yes"))
        bm = allocate_bitmask(1, two_eos.vocab_size)
        g.fill_bitmask(bm, 0)
        assert is_allowed(bm, 0, 1) and is_allowed(bm, 0, 128803)
        assert g.accept_token(eos) is True
        assert g.is_terminated()
        assert g.accept_token(two_eos.encode("yes")[0]) is False
        g.rollback(1)  # rollback over the stop token
        assert not g.is_terminated()
        assert g.accept_token(eos) is True


def test_rollback_over_stop_and_answer_tokens(person: CompiledGrammar, tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode('{"name":"Ada","age":36,"tags":[]}')
    g = person.matcher()
    assert g.accept_tokens(ids) == len(ids)
    assert g.accept_token(tokenizer.eos_token_ids[0])
    g.rollback(4)  # the stop token and the last three answer tokens
    assert not g.is_terminated()
    assert g.accept_tokens(ids[-3:]) == 3
    assert can_stop(g, tokenizer)


def test_copy_starts_fresh_and_shares_the_compiled_grammar(
    person: CompiledGrammar, tokenizer: Tokenizer
) -> None:
    g = person.matcher()
    g.accept_tokens(tokenizer.encode('{"name":"A'))
    fresh = g.copy()
    assert fresh.accept_tokens(tokenizer.encode('{"name":"B')) == len(tokenizer.encode('{"name":"B'))
    assert g.accept_tokens(tokenizer.encode('da","age":1,"tags":[]}')) > 0


@pytest.mark.parametrize(
    "constraint, good, bad",
    [
        (Constraint.regex(r"[0-9]{3}-[a-z]+"), "123-abc", "12-abc"),
        (Constraint.choice(["red", "green", "blue (dark)"]), "blue (dark)", "blue"),
        (Constraint.json_object(), '{"any": [1, {"x": null}]}', "[1,2]"),
    ],
    ids=["regex", "choice", "json_object"],
)
def test_other_kinds(backend: str, constraint: Constraint, good: str, bad: str) -> None:
    if backend == "outlines" and constraint.kind == "json_object":
        # outlines-core builds any-JSON over the 129k vocabulary in 45-120 s on 2 cores
        # (README, known limits); auto never gives it json_object, and the suite's time is
        # better spent elsewhere.
        pytest.skip("outlines-core json_object: minutes over the 129k vocabulary; auto never picks it")
    cg = compiled(backend, constraint)
    assert first_rejected(cg, good) is None
    assert first_rejected(cg, bad) is not None


@pytest.mark.parametrize("backend_name", ["xgrammar", "llguidance"])
def test_ebnf(backend_name: str) -> None:
    grammar = 'root ::= "(" num ("+" num)* ")"\nnum ::= [0-9]+'
    cg = compiled(backend_name, Constraint.ebnf(grammar))
    assert first_rejected(cg, "(1+22+3)") is None
    assert first_rejected(cg, "(1+)") == 3


LEGACY_TAG = {
    "structures": [
        {
            "begin": "<function=get_weather>",
            "schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            "end": "</function>",
        }
    ],
    "triggers": ["<function="],
}


@pytest.mark.parametrize("backend_name", ["xgrammar", "llguidance"])
def test_legacy_structural_tag(backend_name: str) -> None:
    cg = compiled(backend_name, Constraint.structural_tag(LEGACY_TAG))
    ok = 'Let me check. <function=get_weather>{"city":"Paris"}</function>'
    assert first_rejected(cg, ok) is None
    bad = 'Let me check. <function=get_weather>{"town":"Paris"}</function>'
    assert first_rejected(cg, bad) is not None


def test_structural_tag_format_form_on_xgrammar() -> None:
    tag = {
        "type": "structural_tag",
        "format": {
            "type": "tag",
            "begin": "<answer>",
            "content": {"type": "json_schema", "json_schema": {"type": "integer"}},
            "end": "</answer>",
        },
    }
    cg = compiled("xgrammar", Constraint.structural_tag(tag))
    assert first_rejected(cg, "<answer>42</answer>") is None
    assert first_rejected(cg, "<answer>x</answer>") is not None


@pytest.mark.parametrize(
    "backend_name, constraint",
    [
        ("outlines", Constraint.ebnf('root ::= "a"')),
        ("outlines", Constraint.structural_tag(LEGACY_TAG)),
        ("llguidance", Constraint.structural_tag({"format": {"type": "const_string", "value": "x"}})),
    ],
)
def test_unsupported_kind_names_backend_and_kind(backend_name: str, constraint: Constraint) -> None:
    with pytest.raises(InvalidConstraint) as info:
        thinkstruct.compile(constraint, Tokenizer.default(), backend_name)
    assert info.value.backend == backend_name
    assert info.value.kind == constraint.kind.value
    assert backend_name in str(info.value) and constraint.kind.value in str(info.value)


# ---- one JSON format ----------------------------------------------------------------

WS_BASE = '{"name":"A","age":1,"tags":["x","y"]}'


def _gaps_between_tokens(text: str) -> list[int]:
    """Insertion points of ``text`` that are not inside a JSON string."""
    gaps, inside = [], False
    for i, ch in enumerate(text):
        if not inside:
            gaps.append(i)
        if ch == '"':
            inside = not inside
    return gaps + [len(text)]


def _whitespace_variants(run: str) -> list[str]:
    return [WS_BASE[:i] + run + WS_BASE[i:] for i in _gaps_between_tokens(WS_BASE)]


@pytest.mark.parametrize("run", [" ", "  ", "\n\t", "   ", "\n  "], ids=repr)
def test_every_backend_accepts_the_same_whitespace(run: str) -> None:
    verdicts = {
        b: [
            first_rejected(compiled(b, Constraint.json_schema(PERSON_SCHEMA)), v) is None
            for v in _whitespace_variants(run)
        ]
        for b in BACKENDS
    }
    assert verdicts["xgrammar"] == verdicts["llguidance"] == verdicts["outlines"]
    if len(run) <= JsonFormat().max_whitespace:
        assert any(verdicts["xgrammar"])  # whitespace is allowed between tokens ...
    else:
        assert not any(verdicts["xgrammar"])  # ... but never a longer run


def test_no_backend_allows_an_unbounded_whitespace_run(backend: str, tokenizer: Tokenizer) -> None:
    # After '{"name":' a model that only ever picks whitespace must be stopped quickly.
    g = compiled(backend, Constraint.json_schema(PERSON_SCHEMA)).matcher()
    g.accept_tokens(tokenizer.encode('{"name":'))
    space = tokenizer.encode(" ")[0]
    accepted = 0
    while accepted < 50 and g.accept_token(space):
        accepted += 1
    assert accepted == JsonFormat().max_whitespace


def test_flexible_format_allows_pretty_printing(backend: str, tokenizer: Tokenizer) -> None:
    pretty = json.dumps({"name": "A", "age": 1, "tags": ["x"]}, indent=2)
    cg = thinkstruct.compile(
        Constraint.json_schema(PERSON_SCHEMA), tokenizer, backend, json_format=JsonFormat.flexible()
    )
    assert first_rejected(cg, pretty) is None
    assert first_rejected(compiled(backend, Constraint.json_schema(PERSON_SCHEMA)), pretty) is not None


def test_public_accepts(backend: str) -> None:
    c = Constraint.json_schema({"type": "array", "items": {"type": "integer"}, "maxItems": 2})
    assert thinkstruct.accepts(c, "[1,2]", backend=backend)
    assert not thinkstruct.accepts(c, "[1,2,3]", backend=backend)


def test_mask_allows_exactly_the_answer_continuations(person: CompiledGrammar, tokenizer: Tokenizer) -> None:
    g = person.matcher()
    g.accept_tokens(tokenizer.encode('{"name":"Ada","age":36,"tags":[]'))
    bm = allocate_bitmask(1, tokenizer.vocab_size)
    g.fill_bitmask(bm, 0)
    allowed = {tokenizer.decode([t]) for t in allowed_token_ids(bm, 0, tokenizer.vocab_size).tolist()}
    assert "}" in allowed
    assert all(set(s) <= set(" \n\r\t}") for s in allowed), allowed
