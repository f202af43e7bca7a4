"""``oneOf`` made an ``anyOf`` of mutually exclusive branches (``schema/one_of.py``, through
``normalize``): what the rewrite takes is valid against the original schema by the
reference validator (``jsonschema``), on hand-written cases and on random schemas."""

from __future__ import annotations

import itertools
import json
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thinkstruct.grammar.schema.keywords import normalize
from thinkstruct.grammar.service.auto import HARD_KEYWORDS

KEYS = ["a", "b", "c"]
SCALARS: list[Any] = [0, 1, 2.5, "x", "", None, True]


def rewrite(schema: Any) -> Any:
    return normalize(schema, hard_keywords=HARD_KEYWORDS)


def valid(schema: Any, value: Any) -> bool:
    return bool(jsonschema.Draft202012Validator(schema).is_valid(value))


def instances() -> list[Any]:
    """Objects over every subset of KEYS with a few values each, arrays, scalars."""
    found: list[Any] = [*SCALARS, [], [0], ["x"], [0, "x"], [[0]]]
    for size in range(len(KEYS) + 1):
        for keys in itertools.combinations(KEYS, size):
            for values in itertools.product([0, "x"], repeat=size):
                found.append(dict(zip(keys, values, strict=True)))
    found += [{"d": 0}, {"a": 0, "d": "x"}]
    return found


INSTANCES = instances()


def test_branches_told_apart_by_required_are_narrowed() -> None:
    schema = {
        "type": "object",
        "properties": {
            "length": {"type": "number"},
            "width": {"type": "number"},
            "radius": {"type": "number"},
        },
        "oneOf": [{"required": ["length", "width"]}, {"required": ["radius"]}],
    }
    out = rewrite(schema)
    assert "oneOf" not in json.dumps(out)
    assert valid(out, {"length": 1, "width": 2}) and valid(out, {"radius": 1})
    assert not valid(out, {"length": 1, "width": 2, "radius": 1})  # both branches: invalid
    assert not valid(out, {"length": 1})  # neither


def test_untyped_branches_become_objects() -> None:
    # A string matches both branches (``required`` says nothing of strings): invalid.
    schema = {"oneOf": [{"required": ["a"]}, {"required": ["b"]}]}
    out = rewrite(schema)
    assert "oneOf" not in json.dumps(out)
    assert not valid(schema, "s") and not valid(out, "s")
    assert valid(out, {"a": 1}) and valid(out, {"b": 1})


def test_discriminator_beside_the_one_of() -> None:
    schema = {
        "type": "object",
        "required": ["kind"],
        "oneOf": [{"properties": {"kind": {"enum": ["x"]}}}, {"properties": {"kind": {"enum": ["y"]}}}],
    }
    out = rewrite(schema)
    assert out["anyOf"] == schema["oneOf"]  # disjoint as they stand: nothing narrowed


def test_value_sets_checked_against_the_other_branch() -> None:
    schema = {"oneOf": [{"type": "string", "pattern": "^[0-9a-f]{24}$"}, {"enum": [""]}, {"type": "null"}]}
    assert rewrite(schema)["anyOf"] == schema["oneOf"]


def test_arrays_and_closed_objects_told_apart_but_for_the_empty_value() -> None:
    # [] (and {}) match both branches, so are invalid; every other value matches one.
    arrays = {
        "oneOf": [
            {"type": "array", "items": {"type": "number"}},
            {"type": "array", "items": {"type": "array"}},
        ]
    }
    out = rewrite(arrays)
    assert "oneOf" not in json.dumps(out)
    assert [valid(out, v) for v in ([], [1], [[1]])] == [False, True, True]
    closed = {
        "oneOf": [
            {"type": "object", "additionalProperties": False, "properties": {"foo": {}}},
            {"type": "object", "additionalProperties": False, "properties": {"bar": {}}},
        ]
    }
    out = rewrite(closed)
    assert "oneOf" not in json.dumps(out)
    assert valid(out, {"foo": 1}) and valid(out, {"bar": 1}) and not valid(out, {})


@pytest.mark.parametrize(
    "schema",
    [
        {"not": {"type": "object", "oneOf": [{"required": ["a"]}, {"required": ["b"]}]}},
        {
            "if": {"type": "object", "oneOf": [{"required": ["a"]}, {"required": ["b"]}]},
            "then": {"minProperties": 2},
        },
        {
            "$defs": {"d": {"type": "object", "oneOf": [{"required": ["a"]}, {"required": ["b"]}]}},
            "not": {"$ref": "#/$defs/d"},
        },
        {
            "oneOf": [
                {"type": "object", "oneOf": [{"required": ["a"]}, {"required": ["b"]}]},
                {"type": "object", "minProperties": 2},
            ]
        },
    ],
)
def test_no_narrowing_where_it_would_widen(schema: dict[str, Any]) -> None:
    out = rewrite(schema)
    for value in INSTANCES:
        assert not valid(out, value) or valid(schema, value), value


def test_a_property_of_disjoint_types_is_required() -> None:
    # Objects without "events" match both branches (invalid); with it, one.
    schema = {
        "type": "object",
        "oneOf": [
            {"properties": {"events": {"type": "array"}}},
            {"properties": {"events": {"type": "string"}}},
        ],
    }
    out = rewrite(schema)
    assert "oneOf" not in json.dumps(out)
    assert [valid(out, v) for v in ({}, {"events": []}, {"events": "x"})] == [False, True, True]


def test_a_dependent_schema_knows_its_trigger() -> None:
    schema = {
        "dependentSchemas": {
            "kind": {
                "oneOf": [
                    {"properties": {"kind": {"const": "a"}, "x": {"type": "string"}}},
                    {"properties": {"kind": {"const": "b"}}},
                ]
            }
        }
    }
    out = rewrite(schema)
    assert "oneOf" not in json.dumps(out)
    for value in ({"kind": "a", "x": "s"}, {"kind": "b"}, {"kind": "c"}, {}, "s"):
        assert valid(out, value) == valid(schema, value), value


def test_oneof_left_alone_where_nothing_tells_the_branches_apart() -> None:
    schema = {"oneOf": [{"type": "integer"}, {"minimum": 2}]}
    assert rewrite(schema) == schema


# ---- random schemas -------------------------------------------------------------------

_KEY = st.sampled_from(KEYS)
_PROPERTY = st.sampled_from(
    [False, {"const": 0}, {"enum": [0, "x"]}, {"type": "string"}, {"type": "integer"}, {}]
)
_OBJECT = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["object", ["object", "string"]]),
        "required": st.lists(_KEY, min_size=1, max_size=3, unique=True),
        "properties": st.dictionaries(_KEY, _PROPERTY, max_size=3),
        "additionalProperties": st.just(False),
        "minProperties": st.integers(1, 2),
    },
)
_OTHER = st.sampled_from(
    [
        {"type": "string"},
        {"enum": ["x", 0]},
        {"const": ""},
        {"type": "array", "items": {"type": "integer"}},
        {"type": "array", "items": {"type": "array"}},
        {"type": "array", "items": {"type": "string"}},
        {"type": "integer"},
        {"type": "number"},
        {"type": "null"},
    ]
)
_BRANCH = st.one_of(_OBJECT, _OTHER, _OBJECT.map(lambda b: {"$ref": "#/$defs/shared", **b}))
_SIBLINGS = st.fixed_dictionaries(
    {},
    optional={
        "type": st.just("object"),
        "required": st.lists(_KEY, min_size=1, max_size=2, unique=True),
        "properties": st.dictionaries(_KEY, _PROPERTY, max_size=2),
    },
)


@st.composite
def one_of_schemas(draw: st.DrawFn) -> dict[str, Any]:
    node = {**draw(_SIBLINGS), "oneOf": draw(st.lists(_BRANCH, min_size=2, max_size=4))}
    wrap = draw(st.sampled_from(["none", "not", "items", "defs", "nested", "dependent"]))
    shared = draw(_OBJECT)
    if wrap == "not":
        return {"$defs": {"shared": shared}, "not": node}
    if wrap == "items":
        return {"$defs": {"shared": shared}, "type": "array", "items": node}
    if wrap == "defs":
        return {
            "$defs": {"shared": shared, "n": node},
            "anyOf": [{"$ref": "#/$defs/n"}, {"not": {"$ref": "#/$defs/n"}}],
        }
    if wrap == "dependent":
        return {"$defs": {"shared": shared}, "dependentSchemas": {"a": node}}
    if wrap == "nested":
        return {"$defs": {"shared": shared}, "oneOf": [node, draw(_BRANCH)]}
    return {"$defs": {"shared": shared}, **node}


@settings(max_examples=400, deadline=None)
@given(one_of_schemas())
def test_rewritten_schema_takes_only_valid_values(schema: dict[str, Any]) -> None:
    out = rewrite(schema)
    for value in INSTANCES + [[v] for v in INSTANCES[-10:]]:
        if valid(out, value):
            assert valid(schema, value), (json.dumps(out), value)


@settings(max_examples=200, deadline=None)
@given(st.lists(_BRANCH, min_size=2, max_size=4), _SIBLINGS)
def test_rewritten_branches_exclude_each_other(branches: list[Any], siblings: dict[str, Any]) -> None:
    schema = {"$defs": {"shared": {"type": "object"}}, **siblings, "oneOf": branches}
    out = rewrite(schema)
    if "oneOf" in out or "anyOf" not in out:
        return  # left as it is, or nothing valid (two branches that take everything)
    rewritten = out["anyOf"]
    for value in INSTANCES:
        matching = [b for b in rewritten if valid({**out, "anyOf": [b]}, value)]
        assert len(matching) <= 1, (json.dumps(out), value)


def test_required_in_every_alternative_and_additional_properties_tell_apart() -> None:
    # A repository (each kind requires "type", a string) or one name mapped to false.
    schema = {
        "$defs": {
            "git": {"type": "object", "required": ["type"], "properties": {"type": {"const": "git"}}},
            "path": {
                "type": "object",
                "required": ["type", "url"],
                "properties": {"type": {"enum": ["path"]}},
            },
        },
        "oneOf": [
            {"type": "object", "anyOf": [{"$ref": "#/$defs/git"}, {"$ref": "#/$defs/path"}]},
            {
                "type": "object",
                "additionalProperties": {"enum": [False]},
                "minProperties": 1,
                "maxProperties": 1,
            },
        ],
    }
    out = rewrite(schema)
    assert out["anyOf"] == schema["oneOf"]  # disjoint as they stand
    for value in ({"type": "git"}, {"type": False}, {"x": False}, {"type": "path", "url": 1}):
        assert valid(out, value) == valid(schema, value), value


@pytest.mark.parametrize(
    ("pattern", "strings"),
    [
        (r"^[\.\,\*\\\-\s\{\}\(\)]+$", ["", ".", "a", "..", ". x", "()", "\\", "x."]),
        ("^[a-z]*$", ["", "abc", "aB", "1", "-"]),
    ],
)
def test_not_of_a_whole_class_pattern_becomes_a_pattern(pattern: str, strings: list[str]) -> None:
    schema = {"not": {"pattern": pattern}}
    out = rewrite(schema)
    assert "not" not in out
    for value in [*strings, 1, None, ["a"]]:
        assert valid(out, value) == valid(schema, value), value


_BOUND = st.sampled_from([0, 1, 2, 2.5, 5])


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries(
            {},
            optional={
                "type": st.just("number"),
                "minimum": _BOUND,
                "exclusiveMinimum": _BOUND,
                "maximum": _BOUND,
                "exclusiveMaximum": _BOUND,
            },
        ),
        min_size=2,
        max_size=4,
    ),
    st.sampled_from([{}, {"type": "number"}, {"type": "integer"}]),
)
def test_numeric_intervals_become_the_numbers_in_exactly_one(
    branches: list[dict[str, Any]], siblings: dict[str, Any]
) -> None:
    schema = {**siblings, "oneOf": branches}
    out = rewrite(schema)
    for value in [-1, 0, 0.5, 1, 1.5, 2, 2.25, 2.5, 3, 5, 6, "x", None, [1]]:
        assert valid(out, value) == valid(schema, value), (json.dumps(out), value)
