"""Checked keywords: the split between what a backend's grammar enforces and what is checked
as values close, per keyword and per backend; strict ``auto`` compiling checked schemas;
``accepts`` applying the checks."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thinkstruct import Constraint, InvalidConstraint, Tokenizer
from thinkstruct.grammar.api import accepts, first_rejected
from thinkstruct.grammar.backends import backend_classes
from thinkstruct.grammar.base import NO_BACKEND_ENFORCES
from thinkstruct.grammar.runtime.tag_checks import first_failed_check
from thinkstruct.grammar.schema.checks import location_text, plan_checks
from thinkstruct.grammar.schema.relaxations import relax, unparseable_pattern
from thinkstruct.grammar.schema.walk import resolve
from thinkstruct.grammar.service.compiler import CompilerConfig, GrammarCompiler

# (keyword, schema, the keyword's pointer, where it is checked, a valid and an invalid
# answer that differ only in that keyword).
CASES: list[tuple[str, dict[str, Any], str, str, str, str]] = [
    (
        "uniqueItems",
        {
            "type": "object",
            "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b"]}, "uniqueItems": True}},
        },
        "/properties/tags/uniqueItems",
        "/tags",
        '{"tags":["a","b"]}',
        '{"tags":["a","a"]}',
    ),
    (
        "not",
        {"type": "object", "properties": {"n": {"type": "integer", "not": {"const": 3}}}},
        "/properties/n/not",
        "/n",
        '{"n":4}',
        '{"n":3}',
    ),
    (
        "oneOf",
        {
            "type": "object",
            "properties": {"v": {"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 2}]}},
        },
        "/properties/v/oneOf",
        "/v",
        '{"v":1}',
        '{"v":5}',
    ),
    (
        "if",
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "if": {"properties": {"a": {"const": 1}}, "required": ["a"]},
            "then": {"required": ["b"]},
        },
        "/if",
        "",
        '{"a":1,"b":2}',
        '{"a":1}',
    ),
    (
        "contains",
        {
            "type": "object",
            "properties": {
                "xs": {
                    "type": "array",
                    "items": {"type": "integer"},
                    "contains": {"const": 1},
                    "minContains": 2,
                }
            },
        },
        "/properties/xs/contains",
        "/xs",
        '{"xs":[1,1]}',
        '{"xs":[1,2]}',
    ),
    (
        "maxContains",
        {"type": "array", "items": {"type": "integer"}, "contains": {"const": 1}, "maxContains": 1},
        "/maxContains",
        "",
        "[1,2]",
        "[1,1]",
    ),
    (
        "propertyNames",
        {"type": "object", "additionalProperties": {"type": "integer"}, "propertyNames": {"maxLength": 2}},
        "/propertyNames",
        "",
        '{"ab":1}',
        '{"abc":1}',
    ),
    (
        "unevaluatedProperties",
        {"type": "object", "properties": {"a": {"type": "integer"}}, "unevaluatedProperties": False},
        "/unevaluatedProperties",
        "",
        '{"a":1}',
        '{"a":1,"b":2}',
    ),
    (
        "uniqueItems",  # every value of a map
        {
            "type": "object",
            "additionalProperties": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
        },
        "/additionalProperties/uniqueItems",
        "/*",
        '{"x":[1,2],"y":[1]}',
        '{"x":[1,2],"y":[3,3]}',
    ),
    (
        "uniqueItems",  # inside a conditional branch: checked with the whole value there
        {
            "type": "object",
            "properties": {"v": {"anyOf": [{"type": "array", "uniqueItems": True}, {"type": "string"}]}},
        },
        "/properties/v/anyOf/0/uniqueItems",
        "/v",
        '{"v":[1,2]}',
        '{"v":[2,2]}',
    ),
]

# Keywords some backend's grammar enforces (the split differs per backend).
PER_BACKEND: list[tuple[str, dict[str, Any], str, str, str, str]] = [
    (
        "multipleOf",
        {"type": "object", "properties": {"p": {"type": "number", "multipleOf": 0.25}}},
        "/properties/p/multipleOf",
        "/p",
        '{"p":0.75}',
        '{"p":0.8}',
    ),
    (
        "format",
        {"type": "array", "items": {"type": "string", "format": "date"}},
        "/items/format",
        "/*",
        '["2024-02-29"]',
        '["2023-02-29"]',
    ),
]


def _split(schema: dict[str, Any], inexact: frozenset[str]) -> dict[str, tuple[str, str | None]]:
    plan = plan_checks(schema, inexact=inexact)
    return {e.pointer: (e.enforcement, e.location) for e in plan.enforcement}


@pytest.mark.parametrize(
    ("keyword", "schema", "pointer", "location", "valid", "invalid"), CASES + PER_BACKEND
)
def test_each_backend_checks_what_it_declares_inexact(
    keyword: str, schema: dict[str, Any], pointer: str, location: str, valid: str, invalid: str
) -> None:
    for cls in backend_classes():
        split = _split(schema, cls.inexact_keywords)
        if keyword in cls.inexact_keywords:
            assert split[pointer] == ("checked", location), cls.name
        else:
            assert split[pointer] == ("grammar", None), cls.name
        # Nothing is listed twice, and every keyword has one fate.
        plan = plan_checks(schema, inexact=cls.inexact_keywords)
        assert len({e.pointer for e in plan.enforcement}) == len(plan.enforcement)
    plan = plan_checks(schema, inexact=NO_BACKEND_ENFORCES | {"format", "multipleOf"})
    assert first_failed_check(plan, valid) is None
    failure = first_failed_check(plan, invalid)
    assert failure is not None


def test_the_facts_behind_the_split() -> None:
    """Spot checks of the declarations the split reads (measured in keyword_support.md)."""
    by_name = {cls.name: cls.inexact_keywords for cls in backend_classes()}
    for name in ("llguidance", "xgrammar", "outlines"):
        assert {"uniqueItems", "not", "if", "contains", "propertyNames"} <= by_name[name]
    assert "format" not in by_name["llguidance"] and "format" in by_name["xgrammar"]
    assert "multipleOf" not in by_name["llguidance"] and "multipleOf" in by_name["outlines"]


def test_a_referenced_subschema_is_checked_where_each_reference_applies() -> None:
    schema = {
        "$defs": {"u": {"type": "array", "uniqueItems": True}},
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/u"}, "b": {"type": "array", "items": {"$ref": "#/$defs/u"}}},
    }
    plan = plan_checks(schema, inexact=NO_BACKEND_ENFORCES)
    assert {location_text(c.location) for c in plan.checks} == {"/a", "/b/*"}
    failure = first_failed_check(plan, '{"a":[1],"b":[[2],[3,3]]}')
    assert (
        failure is not None
        and failure.pointer == "/b/1"
        and failure.value_pointer == "/b/1/1"
        and failure.keyword == "uniqueItems"
    )


def test_recursion_is_checked_at_its_first_value() -> None:
    schema = {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "uniqueItems": True},
            "kids": {"type": "array", "items": {"$ref": "#"}},
        },
    }
    plan = plan_checks(schema, inexact=NO_BACKEND_ENFORCES)
    assert "" in {location_text(c.location) for c in plan.checks}  # covers every level
    deep = '{"kids":[{"kids":[{"tags":[1,1]}]}]}'
    failure = first_failed_check(plan, deep)
    assert failure is not None and failure.pointer == "/kids/0/kids/0/tags"


def test_references_the_walk_does_not_follow_check_the_whole_document() -> None:
    schema = {"$defs": {"u": {"$anchor": "u", "uniqueItems": True}}, "properties": {"a": {"$ref": "#u"}}}
    plan = plan_checks(schema, inexact=NO_BACKEND_ENFORCES)
    assert [location_text(c.location) for c in plan.checks] == [""]
    assert first_failed_check(plan, '{"a":[1,1]}') is not None


@pytest.fixture(scope="module")
def strict() -> Any:
    with GrammarCompiler(Tokenizer.default(), CompilerConfig(strict=True, worker_processes=0)) as compiler:
        yield compiler


@pytest.mark.parametrize(("keyword", "schema", "pointer", "location", "valid", "invalid"), CASES)
def test_strict_auto_compiles_checked_schemas(
    strict: GrammarCompiler,
    keyword: str,
    schema: dict[str, Any],
    pointer: str,
    location: str,
    valid: str,
    invalid: str,
) -> None:
    compiled = strict.compile(Constraint.json_schema(schema))
    assert compiled.checks is not None and compiled.ignored_keywords == ()
    checked = {(e.keyword, e.location) for e in compiled.enforcement() if e.enforcement == "checked"}
    assert (keyword, location) in checked
    # The grammar holds the shape; the check tells the two answers apart.
    assert first_rejected(compiled, valid) is None
    assert first_rejected(compiled, invalid) is None
    assert first_failed_check(compiled.checks, valid) is None
    failure = first_failed_check(compiled.checks, invalid)
    assert failure is not None
    # It names the part that failed and where it starts (where decoding rolls back to):
    # the value, its key, the separator before a member the object may not hold, or the
    # closing bracket where another item or member would mend it.
    part = invalid[failure.start : failure.end]
    key = failure.value_pointer.rpartition("/")[2]
    if part in ("]", "}"):
        assert failure.keyword in ("minContains", "contains", "required")
        assert failure.end == len(invalid) - (failure.value_pointer != "")
    elif part.startswith(","):
        assert failure.keyword == "unevaluatedProperties"
        assert list(json.loads("{" + part[1:] + "}")) == [key]
    elif failure.keyword == "propertyNames":
        assert json.loads(part) == key
    else:
        assert json.loads(part) == resolve(json.loads(invalid), failure.value_pointer)
    assert failure.value_pointer.startswith(location.split("*")[0].rstrip("/"))


def test_accepts_applies_the_checks() -> None:
    schema = CASES[0][1]
    constraint = Constraint.json_schema(schema)
    assert accepts(constraint, '{"tags":["a","b"]}', strict=True)
    assert not accepts(constraint, '{"tags":["a","a"]}', strict=True)
    # Lenient mode ignores the keyword, as it says.
    assert accepts(constraint, '{"tags":["a","a"]}')
    date = Constraint.json_schema({"type": "string", "format": "date-time"})
    assert accepts(date, '"2024-01-01T00:00:00Z"', strict=True)
    assert not accepts(date, '"2024-01-01"', strict=True)


def test_exact_schemas_carry_no_checks(strict: GrammarCompiler) -> None:
    compiled = strict.compile(
        Constraint.json_schema({"type": "object", "properties": {"a": {"type": "integer"}}})
    )
    assert compiled.checks is None
    assert {e.enforcement for e in compiled.enforcement()} == {"grammar"}


# ---- strict mode's last resorts: what no grammar takes, left out and checked ----------

LOOKAROUND = {"type": "object", "properties": {"p": {"type": "string", "pattern": "^(?!x)[a-z]+$"}}}
OVERLAPPING = {
    "type": "object",
    "allOf": [
        {"patternProperties": {"^.{1,3}$": {"type": "integer"}}},
        {"patternProperties": {"a": {"minimum": 2}}},
    ],
}


def test_relax_leaves_out_what_grammars_cannot_take_and_says_so() -> None:
    relaxed, removed = relax(LOOKAROUND)
    assert removed == {"/properties/p/pattern"} and "pattern" not in relaxed["properties"]["p"]
    relaxed, removed = relax(OVERLAPPING)
    assert removed == {"/allOf/0/patternProperties", "/allOf/1/patternProperties"}
    ref_beside = {"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n", "minimum": 3, "description": "x"}
    relaxed, removed = relax(ref_beside)
    assert removed == {"/minimum"} and relaxed == {"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n"}
    assert (
        unparseable_pattern("a|^b")
        and unparseable_pattern("(?<=a)b")
        and not unparseable_pattern("^[\\^$]+$")
    )


@pytest.mark.parametrize("schema", [LOOKAROUND, OVERLAPPING])
def test_relaxed_schemas_are_supersets(schema: dict[str, Any]) -> None:
    relaxed, _ = relax(schema)
    strict_validator = jsonschema.Draft202012Validator(schema)
    loose_validator = jsonschema.Draft202012Validator(relaxed)
    for doc in ({"p": "ab"}, {"p": "xb"}, {"abc": 1}, {"abc": "s"}, {"a": 1}, {"abcd": 1}, {}):
        if strict_validator.is_valid(doc):
            assert loose_validator.is_valid(doc)


def test_strict_checks_a_pattern_no_grammar_runs(strict: GrammarCompiler) -> None:
    compiled = strict.compile(Constraint.json_schema(LOOKAROUND))
    assert compiled.checks is not None
    assert ("pattern", "/properties/p/pattern", "/p") in {
        (e.keyword, e.pointer, e.location) for e in compiled.enforcement() if e.enforcement == "checked"
    }
    assert first_rejected(compiled, '{"p":"xb"}') is None  # the grammar left it out
    failure = first_failed_check(compiled.checks, '{"p":"xb"}')
    assert failure is not None and failure.keyword == "pattern" and failure.start == 5
    assert first_failed_check(compiled.checks, '{"p":"ab"}') is None
    # Lenient mode has nothing to check it with: refused, naming the pattern.
    with GrammarCompiler(Tokenizer.default(), CompilerConfig(worker_processes=0)) as lenient:
        with pytest.raises(InvalidConstraint) as info:
            lenient.compile(Constraint.json_schema(LOOKAROUND))
    assert info.value.pointer == "/properties/p/pattern"


def test_strict_checks_overlapping_pattern_properties(strict: GrammarCompiler) -> None:
    compiled = strict.compile(Constraint.json_schema(OVERLAPPING))
    assert compiled.checks is not None and compiled.backend == "llguidance"
    assert first_failed_check(compiled.checks, '{"bc":1,"zzzz":"s"}') is None
    failure = first_failed_check(compiled.checks, '{"a":1}')  # both patterns: minimum 2 too
    assert failure is not None and failure.keyword == "minimum" and failure.pointer == "/a"


def test_relax_writes_mergeable_all_of_branches_into_their_node() -> None:
    schema = {
        "type": "object",
        "allOf": [{"properties": {"a": {"$ref": "#/$defs/n", "minimum": 3}}, "required": ["a"]}],
        "$defs": {"n": {"type": "integer"}},
    }
    relaxed, removed = relax(schema)
    assert relaxed == {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/n"}},
        "required": ["a"],
        "$defs": {"n": {"type": "integer"}},
    }
    assert removed == {"/allOf/0/properties/a/minimum"}  # the schema's own pointer
    plan = plan_checks(schema, inexact=NO_BACKEND_ENFORCES, relaxed=removed)
    assert ("minimum", "checked", "/a") in {(e.keyword, e.enforcement, e.location) for e in plan.enforcement}
    failure = first_failed_check(plan, '{"a":1}')
    assert failure is not None and failure.keyword == "minimum" and failure.start == 5
    # Keywords that act together with the node's stay in their branch.
    together = {"properties": {"a": {}}, "allOf": [{"additionalProperties": False}]}
    assert relax(together)[0] == together


_DOCS = st.recursive(
    st.none() | st.integers(-2, 4) | st.sampled_from(["", "ab", "abc"]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["a", "b"]), inner, max_size=2)
    ),
    max_leaves=6,
)
MERGES = [
    {"type": "object", "allOf": [{"properties": {"a": {"type": "integer"}}}, {"required": ["a"]}]},
    {"properties": {"a": {}}, "allOf": [{"additionalProperties": False}, {"maxProperties": 1}]},
    {"allOf": [{"items": {"type": "integer"}}, {"minItems": 1}], "prefixItems": [{"const": 1}]},
    {"allOf": [{"$ref": "#/$defs/s"}, {"maxLength": 2}], "$defs": {"s": {"type": "string"}}},
]


@settings(max_examples=150, deadline=None)
@given(schema=st.sampled_from(MERGES), doc=_DOCS)
def test_relaxed_schemas_accept_every_valid_instance_and_merges_are_exact(
    schema: dict[str, Any], doc: Any
) -> None:
    relaxed, removed = relax(schema)
    valid = jsonschema.Draft202012Validator(schema).is_valid(doc)
    loose = jsonschema.Draft202012Validator(relaxed).is_valid(doc)
    assert loose if valid else (removed or not loose)  # nothing removed: the same schema


def test_names_with_pointer_and_uri_escapes_are_checked_where_they_are() -> None:
    schema = {
        "type": "object",
        "$defs": {"a%b": {"type": "array", "uniqueItems": True}},
        "properties": {"x/~%25": {"type": "array", "uniqueItems": True}, "y": {"$ref": "#/$defs/a%25b"}},
    }
    plan = plan_checks(schema, inexact=NO_BACKEND_ENFORCES)
    assert {location_text(c.location) for c in plan.checks} == {"/x~1~0%25", "/y"}
    assert first_failed_check(plan, '{"x/~%25":[1,2],"y":[3,4]}') is None
    failure = first_failed_check(plan, '{"x/~%25":[1,1]}')
    assert failure is not None and failure.pointer == "/x~1~0%25" and failure.value_pointer == "/x~1~0%25/1"
    failure = first_failed_check(plan, '{"y":[3,3]}')
    assert failure is not None and failure.schema_pointer.startswith("/$defs/a%b")


PRICE = {"type": "object", "properties": {"price": {"type": "number", "multipleOf": 0.25, "maximum": 10}},
         "required": ["price"], "additionalProperties": False}  # fmt: skip


def test_a_backend_asked_for_by_name_checks_what_it_does_not_enforce(strict: GrammarCompiler) -> None:
    """xgrammar compiles ``multipleOf`` on a number as if it were not there: asked for by
    name in strict mode, the keyword is checked (it was reported as the grammar's, and
    answers like 7.095 came back); in lenient mode it is listed as ignored."""
    named = strict.compile(Constraint.json_schema(PRICE), backend="xgrammar", strict=True)
    assert named.backend == "xgrammar" and named.requested == "xgrammar"
    assert named.checks is not None
    by_keyword = {e.keyword: e.enforcement for e in named.enforcement()}
    assert by_keyword["multipleOf"] == "checked" and by_keyword["maximum"] == "grammar"
    assert first_failed_check(named.checks, '{"price": 7.095}') is not None
    assert first_failed_check(named.checks, '{"price": 7.25}') is None
    lenient = strict.compile(Constraint.json_schema(PRICE), backend="xgrammar", strict=False)
    assert lenient.checks is None
    assert lenient.ignored_keywords == ("/properties/price/multipleOf",)
