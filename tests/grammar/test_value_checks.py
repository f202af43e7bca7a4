"""The streaming value checker: the same verdict as validating the parsed document,
whatever the pieces; the failed value's start; rollback; what it holds back."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thinkstruct.errors import InvalidConstraint
from thinkstruct.grammar.base import NO_BACKEND_ENFORCES
from thinkstruct.grammar.constraint import escape_pointer
from thinkstruct.grammar.runtime.tag_checks import first_failed_check
from thinkstruct.grammar.runtime.value_checks import CheckFailure, ValueChecker
from thinkstruct.grammar.schema.checks import CheckPlan, Location, Wildcard, plan_checks
from thinkstruct.grammar.schema.prefix_checks import prefix_rules

#: Schemas whose checked keywords sit at several depths, behind references and patterns.
SCHEMAS: list[dict[str, Any]] = [
    {"type": "array", "uniqueItems": True},
    {
        "type": "object",
        "properties": {"a": {"type": "array", "items": {"not": {"const": 0}}}, "b": {"uniqueItems": True}},
    },
    {"type": "array", "items": {"type": "array", "uniqueItems": True}},
    {"type": "object", "additionalProperties": {"not": {"type": "string"}}},
    {"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}},
    {"items": {"multipleOf": 0.5}},
    {"properties": {"a": {"format": "date"}, "b": {"format": "email"}}},
    {"contains": {"type": "integer"}, "maxContains": 1},
    {
        "$defs": {"u": {"uniqueItems": True}},
        "properties": {"a": {"$ref": "#/$defs/u"}},
        "items": {"$ref": "#/$defs/u"},
    },
    {"properties": {"k": {"items": {"$ref": "#"}}, "t": {"uniqueItems": True}}},
    {"prefixItems": [{"not": {"const": 1}}], "items": {"not": {"type": "boolean"}}},
    {"properties": {"a": {"anyOf": [{"type": "array", "uniqueItems": True}, {"type": "string"}]}}},
    {"propertyNames": {"maxLength": 1}, "additionalProperties": {"propertyNames": {"pattern": "^[ab]$"}}},
]

#: The keywords of the shallowest backend (xgrammar: most checks) and of all of them.
INEXACT_SETS = [NO_BACKEND_ENFORCES | {"format", "multipleOf", "allOf"}, NO_BACKEND_ENFORCES]

KEYS = st.sampled_from(["a", "b", "k", "t", "ab", 'q"', "é/~"])
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.sampled_from([0.5, 1.5, -2.25, 1e20, 0.1])
    | st.sampled_from(["", "x", "2024-02-29", "2023-02-30", "a@b.c", 'q"\\', "é\u2028\n"])
)
DOCUMENTS = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=12,
)


def _dumps(doc: Any, style: int) -> str:
    if style == 0:
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
    if style == 1:
        return json.dumps(doc)
    return json.dumps(doc, indent=1, ensure_ascii=False)


def _matches(doc: Any, location: Location) -> list[str]:
    """Pointers of the values ``location`` names in ``doc``."""
    found: list[tuple[str, Any]] = [("", doc)]
    for step in location:
        nxt: list[tuple[str, Any]] = []
        for pointer, value in found:
            if step is Wildcard.ITEM and isinstance(value, list):
                nxt += [(f"{pointer}/{i}", v) for i, v in enumerate(value)]
            elif step is Wildcard.PROPERTY and isinstance(value, dict):
                nxt += [(f"{pointer}/{escape_pointer(k)}", v) for k, v in value.items()]
            elif isinstance(step, int) and isinstance(value, list) and step < len(value):
                nxt.append((f"{pointer}/{step}", value[step]))
            elif isinstance(step, str) and isinstance(value, dict) and step in value:
                nxt.append((f"{pointer}/{escape_pointer(step)}", value[step]))
        found = nxt
    return [pointer for pointer, _ in found]


def _first_invalid(plan: CheckPlan, doc: Any) -> str | None:
    """The pointer of the first part, in closing order, that fails a check: a value that
    fails a check at it; an item of an array checked for ``uniqueItems`` that repeats an
    earlier one, or that is one match too many for ``maxContains``; a member whose key
    breaks the object's ``propertyNames`` (a key closes before its value)."""
    invalid: set[tuple[str, str]] = set()
    unique = jsonschema.Draft202012Validator({"uniqueItems": True})
    for index, check in enumerate(plan.checks):
        rules = prefix_rules(plan, index)
        assert not rules.unevaluated  # none in SCHEMAS: the model leaves it out
        for pointer in _matches(doc, check.location):
            value = _post_value(doc, pointer)
            if plan.first_error(index, value) is not None:
                invalid.add(("value", pointer))
            if rules.unique and isinstance(value, list):
                repeat = next((i for i in range(1, len(value)) if not unique.is_valid(value[: i + 1])), None)
                if repeat is not None:
                    invalid.add(("value", f"{pointer}/{repeat}"))
            for rule in rules.contains:
                if isinstance(value, list) and rule.maximum is not None and rule.max_items is None:
                    hits = [i for i, item in enumerate(value) if plan.valid_at(rule.subschema, item)]
                    if len(hits) > rule.maximum:
                        invalid.add(("value", f"{pointer}/{hits[rule.maximum]}"))
            if rules.names and isinstance(value, dict):
                invalid |= {
                    ("key", f"{pointer}/{escape_pointer(k)}")
                    for k in value
                    if not plan.valid_at(rules.names, k)
                }
    return next((p for kind, p, _ in _closing_order(doc) if (kind, p) in invalid), None)


def _closing_order(doc: Any, pointer: str = "") -> list[tuple[str, str, Any]]:
    """Every key and value with its pointer (a key: its member's) in the order their
    texts close."""
    out: list[tuple[str, str, Any]] = []
    if isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _closing_order(v, f"{pointer}/{i}")
    elif isinstance(doc, dict):
        for k, v in doc.items():
            out.append(("key", f"{pointer}/{escape_pointer(k)}", k))
            out += _closing_order(v, f"{pointer}/{escape_pointer(k)}")
    out.append(("value", pointer, doc))
    return out


def _post_order(doc: Any) -> list[tuple[str, Any]]:
    """Every value with its pointer in the order their texts close."""
    return [(p, v) for kind, p, v in _closing_order(doc) if kind == "value"]


def _post_value(doc: Any, pointer: str) -> Any:
    return next(v for p, v in _post_order(doc) if p == pointer)


def _feed(checker: ValueChecker, pieces: list[str]) -> tuple[CheckFailure | None, list[int | None]]:
    held: list[int | None] = []
    for piece in pieces:
        failure = checker.feed(piece)
        if failure is not None:
            return failure, held
        held.append(checker.held_from())
    return checker.finish(), held


def _split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


@settings(max_examples=300, deadline=None)
@given(
    schema=st.sampled_from(SCHEMAS),
    inexact=st.sampled_from(INEXACT_SETS),
    doc=DOCUMENTS,
    style=st.integers(0, 2),
    cuts=st.lists(st.integers(0, 200), max_size=12),
)
def test_any_split_gives_the_documents_verdict_and_the_failed_values_start(
    schema: dict[str, Any], inexact: frozenset[str], doc: Any, style: int, cuts: list[int]
) -> None:
    plan = plan_checks(schema, inexact=inexact)
    text = _dumps(doc, style)
    failure, _ = _feed(ValueChecker(plan), _split(text, cuts))
    whole = first_failed_check(plan, text)
    assert failure == whole  # the pieces never matter
    expected = _first_invalid(plan, doc)
    assert (failure.value_pointer if failure else None) == expected
    if failure is not None:
        # The reported start is where the text of the failed part begins: the value, the
        # member of it the error is about (then only that member is drawn again), a key,
        # or the closing bracket where another item or member would mend it.
        if text[failure.start] in "]}":
            assert failure.end == failure.start + 1
            assert failure.keyword in ("contains", "minContains", "required", "minProperties", "minItems")
        else:
            part, _ = json.JSONDecoder().raw_decode(text[: failure.end], failure.start)
            if failure.keyword == "propertyNames" and failure.value_pointer != failure.pointer:
                assert escape_pointer(part) == failure.value_pointer.rpartition("/")[2]
            else:
                assert part in (_post_value(doc, failure.value_pointer), _post_value(doc, failure.pointer))
    # Checking every keyword of the schema is validating the document.
    everything = frozenset(k for k in _all_keywords(schema))
    full = plan_checks(schema, inexact=everything)
    validator = jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    assert (first_failed_check(full, text) is None) == validator.is_valid(doc)


def _all_keywords(schema: Any) -> set[str]:
    found: set[str] = set()
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            found.update(node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


@settings(max_examples=200, deadline=None)
@given(
    schema=st.sampled_from(SCHEMAS),
    doc=DOCUMENTS,
    other=DOCUMENTS,
    cuts=st.lists(st.integers(0, 200), max_size=10),
    data=st.data(),
)
def test_rollback_then_refeed_is_as_if_never_fed(
    schema: dict[str, Any], doc: Any, other: Any, cuts: list[int], data: st.DataObject
) -> None:
    plan = plan_checks(schema, inexact=NO_BACKEND_ENFORCES)
    pieces = _split(_dumps(doc, 0), cuts)
    fresh, fresh_held = _feed(ValueChecker(plan), pieces)
    checker = ValueChecker(plan)
    k = data.draw(st.integers(0, len(pieces)))
    # A detour: the first k pieces, then pieces of another answer, undone.
    for piece in pieces[:k]:
        if checker.feed(piece) is not None:
            checker.rollback(1)
            break
    kept = checker.pieces
    detour = _split(_dumps(other, 0), cuts)[: data.draw(st.integers(0, 4))]
    fed = 0
    for piece in detour:
        try:
            fed += 1
            if checker.feed(piece) is not None:
                break
        except ValueError:  # the detour's text need not continue this JSON
            break
    checker.rollback(checker.pieces - kept)
    assert checker.pieces == kept and checker.text == "".join(pieces[:kept])
    again, held = _feed(checker, pieces[kept:])
    assert again == fresh
    assert held == fresh_held[kept:]


def test_held_from_covers_an_open_checked_value_only() -> None:
    plan = plan_checks(
        {
            "type": "object",
            "properties": {"tags": {"type": "array", "uniqueItems": True}, "n": {"type": "integer"}},
        },
        inexact=NO_BACKEND_ENFORCES,
    )
    checker = ValueChecker(plan)
    seen = []
    for piece in ['{"n":', "1", ',"tags"', ":[", '"a"', ',"b"', "]", "}"]:
        assert checker.feed(piece) is None
        seen.append(checker.held_from())
    start = len('{"n":1,"tags":')
    assert seen == [None, None, None, start, start, start, None, None]


def test_a_failure_names_keyword_pointers_and_rolls_back_to_the_value() -> None:
    plan = plan_checks(
        {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}},
        inexact=NO_BACKEND_ENFORCES,
    )
    checker = ValueChecker(plan)
    pieces = ['{"', 'tags":', "[1", ",", "1", "]"]
    failures = [checker.feed(p) for p in pieces]
    failure = failures[-1]
    assert failures[:-1] == [None] * 5 and failure is not None
    # The repeated item fails as it closes (the "]" closes the number), not the array.
    assert (failure.start, failure.end, failure.value_pointer, failure.pointer) == (
        11,
        12,
        "/tags/1",
        "/tags",
    )
    assert failure.keyword == "uniqueItems" and failure.schema_pointer == "/properties/tags/uniqueItems"
    assert "uniqueItems at /tags" in failure.describe()
    with pytest.raises(ValueError, match="rolled back"):
        checker.feed("}")
    # Back to the token that holds the item's first character ("1"), then another try.
    assert checker.pieces_since(failure.start) == 2
    checker.rollback(2)
    assert checker.text == '{"tags":[1,' and checker.held_from() == 8
    assert [checker.feed(p) for p in ["2]", "}"]] == [None, None]
    assert checker.finish() is None


def test_a_number_at_the_root_closes_at_the_end() -> None:
    plan = plan_checks({"type": "number", "not": {"const": 12}}, inexact=NO_BACKEND_ENFORCES)
    checker = ValueChecker(plan)
    assert checker.feed("1") is None and checker.feed("2") is None
    assert checker.held_from() == 0
    failure = checker.finish()
    assert failure is not None and failure.start == 0 and failure.keyword == "not"
    assert checker.feed("3") is None and checker.finish() is None  # finish changed nothing


def test_text_that_is_not_json_is_refused() -> None:
    plan = plan_checks({"type": "array", "uniqueItems": True}, inexact=NO_BACKEND_ENFORCES)
    with pytest.raises(ValueError, match="not JSON at character 3"):
        ValueChecker(plan).feed("[1,]")
    with pytest.raises(ValueError, match="cannot roll back 2"):
        ValueChecker(plan).rollback(2)


def test_a_check_that_cannot_run_names_its_subschema() -> None:
    # A reference jsonschema cannot follow (thinkstruct's own checks refuse this one at
    # compile time; the checker still never takes it as valid).
    schema = {"allOf": [{"$ref": "#/$defs/missing"}], "not": {"const": 1}}
    plan = plan_checks(schema, inexact=NO_BACKEND_ENFORCES)
    with pytest.raises(InvalidConstraint, match="cannot run") as info:
        first_failed_check(plan, "2")
    assert info.value.pointer == ""


def test_draft7_tuples_are_checked_as_draft7() -> None:
    # Without "$schema", a list of "items" is draft 7's tuple: 2020-12's validator misreads it.
    plan = plan_checks(
        {"items": [{"type": "boolean"}, {"type": "boolean"}], "uniqueItems": True},
        inexact=NO_BACKEND_ENFORCES,
    )
    assert first_failed_check(plan, "[true,false]") is None
    failure = first_failed_check(plan, "[true,true]")
    assert failure is not None and failure.keyword == "uniqueItems"


def test_regexes_python_cannot_run_make_a_plan_unrunnable() -> None:
    schema = {"type": "object", "patternProperties": {"^\\p{L}+$": {"uniqueItems": True}}}
    assert not plan_checks(schema, inexact=NO_BACKEND_ENFORCES).runnable
    assert plan_checks(
        {"type": "string", "pattern": "^\\p{L}+$"}, inexact=NO_BACKEND_ENFORCES
    ).runnable  # nothing checked


def test_a_failure_about_a_member_starts_at_that_member() -> None:
    """``then`` fails on ``legs``: the failure starts at the ``legs`` value (the part to
    draw again), not at the object, and its pointers still name the keyword's place."""
    schema = {"properties": {"kind": {"enum": ["cat", "dog"]}, "legs": {"type": "integer"}},
              "if": {"properties": {"kind": {"const": "cat"}}}, "then": {"properties": {"legs": {"const": 3}}}}  # fmt: skip
    plan = plan_checks(schema, inexact=frozenset({"if", "then"}))
    text = '{"kind": "cat", "legs": 4, "name": {"a": [1, 2]}}'
    failure = first_failed_check(plan, text)
    assert failure is not None
    assert text[failure.start :].startswith("4, ")
    assert (failure.value_pointer, failure.pointer, failure.keyword) == ("", "/legs", "const")
    # A key that breaks propertyNames: the failure starts at that key, as it closes.
    names = plan_checks({"propertyNames": {"pattern": "^[a-z]+$"}}, inexact=frozenset({"propertyNames"}))
    text = '{"ok": 1, "Bad": 2}'
    failure = first_failed_check(names, text)
    assert failure is not None and text[failure.start : failure.end] == '"Bad"'
    assert (failure.value_pointer, failure.pointer) == ("/Bad", "")
