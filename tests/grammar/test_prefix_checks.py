"""Prefix rules: a container's prefix that already breaks a checked keyword fails at the
part that breaks it (an item, a key, the separator before a member), and only where
every way to finish the container breaks the keyword too; a container that wants more
items or members fails at its closing bracket. The verdict on a whole value is the
validator's."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

import jsonschema
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from thinkstruct.grammar.base import NO_BACKEND_ENFORCES
from thinkstruct.grammar.runtime.tag_checks import first_failed_check
from thinkstruct.grammar.runtime.value_checks import ValueChecker
from thinkstruct.grammar.schema.checks import plan_checks
from thinkstruct.grammar.schema.prefix_checks import prefix_rules

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from checked_cases import SEVENS  # two to four digits, two of them 7

#: Items are drawn from these (7 matches ``contains``).
DIGITS = (0, 7, 9)
MAX_ITEMS = 4


def _contains_schema(minimum: int, maximum: int | None) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "array",
        "items": {"enum": list(DIGITS)},
        "maxItems": MAX_ITEMS,
        "contains": {"const": 7},
        "minContains": minimum,
    }
    if maximum is not None:
        schema["maxContains"] = maximum
    return schema


@settings(max_examples=120, deadline=None)
@given(
    minimum=st.integers(0, 3),
    maximum=st.none() | st.integers(0, 3),
    items=st.lists(st.sampled_from(DIGITS), max_size=MAX_ITEMS),
)
def test_an_item_fails_only_where_no_completion_meets_contains(
    minimum: int, maximum: int | None, items: list[int]
) -> None:
    assume(maximum is None or minimum <= maximum)  # satisfiable
    schema = _contains_schema(minimum, maximum)
    plan = plan_checks(schema, inexact=NO_BACKEND_ENFORCES)
    assert prefix_rules(plan, 0).contains  # the rule under test applies
    validator = jsonschema.Draft202012Validator(schema)
    text = json.dumps(items)
    failure = first_failed_check(plan, text)
    assert (failure is None) == validator.is_valid(items)
    if failure is None:
        return
    if text[failure.start] == "]":
        # Closed too early: some array with more items is valid, and none this short.
        assert failure.keyword in ("contains", "minContains") and failure.value_pointer == ""
        return
    # An item failed: every array that begins with the items through it is invalid.
    index = int(failure.value_pointer.rpartition("/")[2])
    assert json.loads(text[failure.start : failure.end]) == items[index]
    kept = items[: index + 1]
    for more in range(MAX_ITEMS - len(kept) + 1):
        for tail in itertools.product(DIGITS, repeat=more):
            assert not validator.is_valid([*kept, *tail]), (kept, tail)
    # And the items before it still had a valid completion (else it would have failed earlier).
    before = items[:index]
    assert any(
        validator.is_valid([*before, *tail])
        for more in range(MAX_ITEMS - len(before) + 1)
        for tail in itertools.product(DIGITS, repeat=more)
    )


def test_two_sevens_in_four_digits_fail_at_the_third_item_that_is_not_seven() -> None:
    plan = plan_checks(SEVENS, inexact=NO_BACKEND_ENFORCES)
    text = "[1, 2, 3, 7]"
    failure = first_failed_check(plan, text)
    assert failure is not None
    assert (failure.keyword, failure.value_pointer, failure.pointer) == ("minContains", "/2", "")
    assert text[failure.start : failure.end] == "3"
    assert failure.expected == (7,)  # what the engine bans around
    # Closing after one 7 fails at the bracket: another item mends it.
    failure = first_failed_check(plan, "[7, 1]")
    assert failure is not None and failure.start == len("[7, 1") and failure.expected is None


@settings(max_examples=100, deadline=None)
@given(
    keys=st.lists(st.sampled_from(["a", "b", "zz", "Q"]), max_size=4, unique=True),
    split=st.integers(1, 6),
)
def test_unevaluated_and_property_names_fail_at_the_member(keys: list[str], split: int) -> None:
    """``unevaluatedProperties: false`` over ``allOf``'s properties fails at the separator
    before the first member it leaves unevaluated (the object may close there instead);
    ``propertyNames`` at the first key it refuses; the verdict is the validator's, in
    any pieces."""
    schema = {
        "type": "object",
        "allOf": [{"properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "Q": {}}}],
        "unevaluatedProperties": False,
        "propertyNames": {"pattern": "^[a-z]+$"},
    }
    plan = plan_checks(schema, inexact=NO_BACKEND_ENFORCES)
    doc = dict.fromkeys(keys, 1)
    text = json.dumps(doc)
    checker = ValueChecker(plan)
    pieces = [text[i : i + split] for i in range(0, len(text), split)]
    failure = next((f for f in map(checker.feed, pieces) if f is not None), None) or checker.finish()
    assert failure == first_failed_check(plan, text)
    assert (failure is None) == jsonschema.Draft202012Validator(schema).is_valid(doc)
    bad = next((k for k in keys if k not in ("a", "b", "Q") or k == "Q"), None)
    if bad is None:
        return
    assert failure is not None and failure.value_pointer == f"/{bad}"
    part = text[failure.start : failure.end]
    if bad == "Q":  # a key propertyNames refuses: the key is the part
        assert failure.keyword == "propertyNames" and part == '"Q"'
    else:  # evaluated by nothing: from the separator before it (its key, if first)
        assert failure.keyword == "unevaluatedProperties"
        assert part.lstrip(", ").startswith(f'"{bad}"') and (part[0] == "," or keys[0] == bad)
