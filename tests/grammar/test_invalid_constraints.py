"""Each class of bad input raises InvalidConstraint naming where; nothing crashes."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import thinkstruct
from thinkstruct import Constraint, InvalidConstraint, Tokenizer
from thinkstruct.grammar.api import first_rejected
from thinkstruct.grammar.constraint import MAX_NESTING_DEPTH

from .conftest import BACKENDS


def _compile_error(constraint: Constraint, backend: str) -> InvalidConstraint:
    with pytest.raises(InvalidConstraint) as info:
        thinkstruct.compile(constraint, Tokenizer.default(), backend)
    return info.value


def test_malformed_json_names_the_position() -> None:
    with pytest.raises(InvalidConstraint) as info:
        Constraint.json_schema('{"type": "object", "properties": {"a": }}')
    assert info.value.position == 39
    assert "malformed JSON" in str(info.value) and "column 40" in str(info.value)


@pytest.mark.parametrize(
    "schema, pointer, words",
    [
        ({"type": "object", "properties": {"a": {"type": "strng"}}}, "/properties/a/type", "unknown type"),
        ({"type": ["string", 3]}, "/type", "unknown type"),
        ({"$ref": "#/$defs/missing", "$defs": {"there": {}}}, "/$ref", "cannot resolve"),
        ({"items": {"$ref": "other.json#/x"}}, "/items/$ref", "cannot resolve"),
        ({"type": "array", "minItems": 5, "maxItems": 2}, "/minItems", "unsatisfiable"),
        ({"type": "string", "minLength": 3, "maxLength": 1}, "/minLength", "unsatisfiable"),
        ({"type": "number", "minimum": 10, "maximum": 1}, "/minimum", "unsatisfiable"),
        (
            {"type": "integer", "exclusiveMinimum": 5, "exclusiveMaximum": 5},
            "/exclusiveMinimum",
            "unsatisfiable",
        ),
        ({"type": "string", "maxLength": -1}, "/maxLength", "non-negative integer"),
        ({"anyOf": []}, "/anyOf", "non-empty list"),
        ({"properties": {"a/b": {"pattern": "(unclosed"}}}, "/properties/a~1b/pattern", "invalid regex"),
        ({"patternProperties": {"[z-a]": {}}}, "/patternProperties/[z-a]", "invalid regex"),
        ({"properties": {"a": 5}}, "/properties/a", "must be an object or a boolean"),
    ],
)
def test_invalid_schema_names_the_pointer(backend: str, schema: dict, pointer: str, words: str) -> None:
    error = _compile_error(Constraint.json_schema(schema), backend)
    assert error.pointer == pointer
    assert words in error.reason
    assert pointer in str(error)


def test_regex_inside_pattern_reports_both_pointer_and_position() -> None:
    error = _compile_error(Constraint.json_schema({"type": "string", "pattern": "ab(c"}), "llguidance")
    assert error.pointer == "/pattern" and error.position == 2


@pytest.mark.parametrize("pattern, position", [("a(b", 1), ("[z-a]", 1), (r"x(?=y)", 1), ("a{3,1}", 1)])
def test_invalid_regex_names_the_position(backend: str, pattern: str, position: int) -> None:
    error = _compile_error(Constraint.regex(pattern), backend)
    assert error.position == position
    assert error.kind == "regex"


@pytest.mark.parametrize("backend_name", ["xgrammar", "llguidance"])
def test_ebnf_syntax_error(backend_name: str) -> None:
    grammar = 'root ::= "a" (\nnum ::= [0-9]+'
    error = _compile_error(Constraint.ebnf(grammar), backend_name)
    assert error.kind == "ebnf" and error.backend == backend_name
    assert backend_name in str(error)


def test_ebnf_error_position_from_xgrammar() -> None:
    error = _compile_error(Constraint.ebnf('root ::= "a" | ?'), "xgrammar")
    assert error.position == 15
    assert (error.line, error.column) == (1, 16)
    assert str(error).startswith("ebnf at line 1, column 16 (backend xgrammar)")
    assert "[" not in str(error).split(":")[0]  # no raw C++ log prefix


def test_ebnf_error_line_from_llguidance() -> None:
    grammar = 'root ::= "a"\nx ::= "b"\ny ::= ( "c" ]\nz ::= "d"'
    error = _compile_error(Constraint.ebnf(grammar), "llguidance")
    assert error.line == 3 and error.position == grammar.index("y ::=")


def test_positions_of_nested_texts_are_not_given_as_the_constraint_s() -> None:
    # The pattern's own offset is not an offset into the schema text.
    tag = {"type": "structural_tag", "format": {"type": "regex", "pattern": "a("}}
    error = _compile_error(Constraint.structural_tag(tag), "xgrammar")
    assert error.position is None and error.line is None


@pytest.mark.parametrize(
    "fmt, reason",
    [
        ({"type": "nope"}, "invalid structural tag: Format type not recognized: nope"),
        (
            {"type": "tag", "begin": "<a>", "end": "</a>"},
            "invalid structural tag: Tag format must have a content field",
        ),
        (
            {"type": "sequence", "elements": []},
            "invalid structural tag: Sequence format must have at least one element",
        ),
    ],
)
def test_xgrammar_internal_check_text_never_reaches_the_user(fmt: dict, reason: str) -> None:
    error = _compile_error(Constraint.structural_tag({"type": "structural_tag", "format": fmt}), "xgrammar")
    assert reason in str(error)
    assert "Check failed" not in str(error) and "holds_alternative" not in str(error)


NUL_CASES = [
    # (constraint, accepted answers, rejected answers); JSON writes NUL as \u0000.
    (
        Constraint.json_schema({"type": "string", "pattern": "^/[^\u0000]+$"}),
        ['"/usr/bin"'],
        ['"/a\\u0000b"', '"usr"'],
    ),
    (Constraint.json_schema({"enum": ["a\u0000b", "c"]}), ['"a\\u0000b"', '"c"'], ['"ab"']),
    (Constraint.json_schema({"const": "x\u0000"}), ['"x\\u0000"'], ['"x"']),
    (
        Constraint.json_schema(
            {"type": "object", "properties": {"a\u0000": {"type": "integer"}}, "required": ["a\u0000"]}
        ),
        ['{"a\\u0000":1}'],
        ['{"a":1}'],
    ),
    (Constraint.regex("a[^\u0000]b"), ["axb"], ["a\u0000b"]),
    (Constraint.regex("a\u0000b"), ["a\u0000b"], ["ab"]),
    (Constraint.choice(["a\u0000", "b"]), ["a\u0000", "b"], ["a"]),
    (Constraint.ebnf('root ::= "a" [^\u0000] "b"'), ["axb"], ["a\u0000b"]),
]


@pytest.mark.parametrize("constraint, good, bad", NUL_CASES, ids=[repr(c[0])[:40] for c in NUL_CASES])
def test_nul_is_legal_and_enforced(constraint: Constraint, good: list[str], bad: list[str]) -> None:
    # auto finds a backend that represents it, and it is enforced exactly ...
    for text in good:
        assert thinkstruct.accepts(constraint, text), text
    for text in bad:
        assert not thinkstruct.accepts(constraint, text), text
    # ... and each backend either enforces it too or refuses it clearly (never compiles
    # something that lets the forbidden NUL through or refuses the valid answer).
    for backend in BACKENDS:
        try:
            compiled = thinkstruct.compile(constraint, Tokenizer.default(), backend)
        except InvalidConstraint as e:
            assert e.backend == backend
            continue
        assert all(first_rejected(compiled, t) is None for t in good), backend
        assert all(first_rejected(compiled, t) is not None for t in bad), backend


@pytest.mark.parametrize(
    "make, pointer, position",
    [
        (lambda: Constraint.json_schema('{"enum": ["ok", "\\ud800"]}'), "/enum/1", None),
        (lambda: Constraint.json_schema({"properties": {"\ud800": {}}}), "/properties", None),
        (lambda: Constraint.json_schema({"type": "string", "pattern": "a\udfff"}), "/pattern", None),
        (lambda: Constraint.regex("ab\ud800"), None, 2),
        (lambda: Constraint.choice(["x", "\ud800"]), "/1", None),
    ],
)
def test_lone_surrogates_are_refused_naming_where(make, pointer: str | None, position: int | None) -> None:
    with pytest.raises(InvalidConstraint, match="lone surrogate") as info:
        make()
    assert info.value.pointer == pointer and info.value.position == position
    str(info.value).encode("utf-8")  # the message itself is printable


def test_nesting_deeper_than_the_limit() -> None:
    ok: dict = {"type": "string"}
    for _ in range(MAX_NESTING_DEPTH // 2 - 1):
        ok = {"type": "array", "items": ok}
    Constraint.json_schema(ok)
    deep: dict = {"type": "string"}
    for _ in range(MAX_NESTING_DEPTH):
        deep = {"type": "array", "items": deep}
    with pytest.raises(InvalidConstraint, match=f"deeper than {MAX_NESTING_DEPTH}") as info:
        Constraint.json_schema(deep)
    assert info.value.pointer.startswith("/items/items")


def _nested_json(depth: int) -> st.SearchStrategy[Any]:
    """JSON documents around the nesting limit: a chain of ``depth`` containers with
    scalars, lists and objects hanging off it."""
    leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=3))
    tree = st.recursive(
        leaf, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=2), c, max_size=3)
    )

    def chain(parts: tuple[list[Any], Any]) -> Any:
        wrappers, doc = parts
        for as_list in wrappers:
            doc = [doc] if as_list else {"k": doc}
        return doc

    return st.tuples(st.lists(st.booleans(), min_size=depth, max_size=depth), tree).map(chain)


@given(doc=st.integers(MAX_NESTING_DEPTH - 3, MAX_NESTING_DEPTH + 1).flatmap(_nested_json))
@settings(max_examples=60, deadline=None)
def test_the_fast_depth_check_refuses_exactly_what_the_pointer_walk_names(doc: Any) -> None:
    from thinkstruct.grammar.constraint import ConstraintKind, _name_depth_error, _within_depth

    try:
        _name_depth_error(doc, ConstraintKind.JSON_SCHEMA)
        named = False
    except InvalidConstraint:
        named = True
    assert _within_depth(doc) is not named


def test_absurdly_deep_json_text_is_refused_not_a_crash() -> None:
    text = "[" * 100_000 + "]" * 100_000
    with pytest.raises(InvalidConstraint):
        Constraint.json_schema(text)


def test_unknown_kind_lists_the_known_ones() -> None:
    with pytest.raises(InvalidConstraint) as info:
        Constraint("xml_schema", "<x/>")
    for kind in ("json_schema", "regex", "ebnf", "structural_tag", "choice", "json_object"):
        assert kind in str(info.value)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: Constraint.json_schema("[1, 2]"), "object or a boolean"),
        (lambda: Constraint.choice([]), "at least one"),
        (lambda: Constraint.choice(["a", 3]), "must be a string"),
        (lambda: Constraint.regex(""), "empty"),
        (lambda: Constraint.structural_tag('{"structures": []}'), None),
    ],
)
def test_other_malformed_input(make, match) -> None:
    if match is None:
        with pytest.raises(InvalidConstraint, match="structures"):
            thinkstruct.compile(make(), Tokenizer.default(), "xgrammar")
    else:
        with pytest.raises(InvalidConstraint, match=match):
            make()


@pytest.mark.parametrize("backend_name", ["llguidance", "outlines"])
def test_library_refusals_are_wrapped_with_backend_and_kind(backend_name: str) -> None:
    # Valid JSON Schema that these backends' own compilers refuse.
    error = _compile_error(
        Constraint.json_schema({"type": "string", "format": "no-such-format"}), backend_name
    )
    assert error.kind == "json_schema" and error.backend == backend_name
    assert str(error).startswith(
        f"json_schema (backend {backend_name}): {backend_name} could not compile it: "
    )
    assert "no-such-format" in str(error) or "nosuch" in str(error)


def test_a_bad_constraint_does_not_break_the_backend(backend: str) -> None:
    _compile_error(Constraint.regex("a(b"), backend)
    assert thinkstruct.accepts(Constraint.regex("ab+"), "abbb", backend=backend)


def test_every_backend_name_is_known() -> None:
    with pytest.raises(ValueError, match="known backends"):
        thinkstruct.compile(Constraint.regex("a"), Tokenizer.default(), "nope")
    assert set(BACKENDS) == {"xgrammar", "llguidance", "outlines"}
