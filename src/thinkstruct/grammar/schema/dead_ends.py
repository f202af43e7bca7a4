"""Checked keywords that the closing-token rule can enforce: :func:`dead_ends`.

Where tokens cannot be taken back, a checked keyword is enforced by forbidding the token
that would close a failing value (:mod:`thinkstruct.grammar.runtime.closing_tokens`). That
never lets a failing value through, but it can leave a request with no token at all: in
``{"uniqueItems": true, "items": {"enum": ["a", "ab"]}}`` after ``["ab","a`` the grammar
allows only ``"`` and ``b"``, and both close a failing item. Strict mode must know before
generation, so each checked keyword is classified here: it is *enforceable* when every
prefix the grammar allows can still be completed into a value that passes; otherwise it is
a *dead end* (strict mode refuses the schema naming its pointer).

The proof is by a few sound rules, and anything they do not cover is a dead end. A value
is *open-ended* when every prefix of it can be completed in infinitely many ways that
all satisfy its subschema: a string with no ``maxLength``, ``pattern``, ``format``,
``enum`` or ``const``; a number (not an integer: ``0`` cannot be continued) with no
bounds; an object that takes further properties (no ``additionalProperties: false``,
``maxProperties``, ``propertyNames``, ``patternProperties``); an array that takes further
items (no ``maxItems``, no tuple form); a subschema with ``type`` spelled out and nothing
conditional beside the keyword. An open-ended value can always steer clear of a finite
set of failing values. The rules:

- ``uniqueItems`` on an array whose items are open-ended: the items before are a finite set.
- ``not`` of a ``const`` or an ``enum`` on an open-ended value: a finite set.
- ``oneOf`` on a value where every two branches either take disjoint types or one of
  them is a finite set (``const``/``enum``) and the other open-ended: the values in two
  branches at once are then a finite set, left by continuing the open-ended one.
- ``minProperties`` on an open-ended object; ``contains`` / ``minContains`` on an array
  that takes further items when a value satisfying the ``contains`` subschema exists.

A keyword is judged on the subschema holding it, and only where that subschema is the
check's own (a keyword inside a conditional branch, checked at a value above it, is a dead
end).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from thinkstruct.grammar.schema.checks import CheckPlan, KeywordEnforcement
from thinkstruct.grammar.schema.instances import NO_WITNESS, witness
from thinkstruct.grammar.schema.one_of import types_of as _types
from thinkstruct.grammar.schema.walk import follow_bare_ref, resolve

#: Keywords that bound a string's continuations.
_BOUNDED_STRING = frozenset({"maxLength", "pattern", "format", "enum", "const", "contentMediaType"})
#: Keywords that bound a number's continuations.
_BOUNDED_NUMBER = frozenset(
    {"enum", "const", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum", "multipleOf"}
)
#: Keywords that bound an object's further properties.
_BOUNDED_OBJECT = frozenset(
    {"maxProperties", "propertyNames", "patternProperties", "unevaluatedProperties", "enum", "const"}
)
#: Keywords that bound an array's further items.
_BOUNDED_ARRAY = frozenset({"maxItems", "prefixItems", "unevaluatedItems", "enum", "const", "contains"})
#: Keywords whose presence makes a value's language conditional (not judged here).
_CONDITIONAL = frozenset(
    {"anyOf", "oneOf", "allOf", "not", "if", "then", "else", "dependentSchemas", "dependencies", "$ref"}
)


def dead_ends(plan: CheckPlan) -> tuple[KeywordEnforcement, ...]:
    """The checked keywords of ``plan`` whose closing-token enforcement may leave no
    token (each with its pointer and where it is checked); ``()`` when every one is
    enforceable."""
    own = {check.schema_pointer: check for check in plan.checks}
    found = []
    for enforced in plan.enforcement:
        if enforced.enforcement != "checked":
            continue
        holder = enforced.pointer.rsplit("/", 1)[0]
        node = resolve(plan.schema, holder)
        if (
            holder not in own
            or not isinstance(node, dict)
            or not _enforceable(enforced.keyword, node, plan.schema)
        ):
            found.append(enforced)
    return tuple(found)


def _enforceable(keyword: str, node: dict[str, Any], root: Any) -> bool:
    rule = RULES.get(keyword)
    return rule is not None and rule.holds(node, root)


def _unique(node: dict[str, Any], root: Any) -> bool:
    items = node.get("items", {})
    return node.get("uniqueItems") is not True or (
        isinstance(items, dict) and "prefixItems" not in node and _open_ended(items, root)
    )


def _not(node: dict[str, Any], root: Any) -> bool:
    excluded = node.get("not")
    finite = isinstance(excluded, dict) and set(excluded) in ({"const"}, {"enum"})
    return finite and _open_ended(_without(node, "not"), root)


def _one_of(node: dict[str, Any], root: Any) -> bool:
    branches = node.get("oneOf")
    if not isinstance(branches, list) or not all(isinstance(b, dict) for b in branches):
        return False
    rest = _without(node, "oneOf")
    merged = [_resolved({**rest, **branch}, root) for branch in branches]
    return all(_separable(a, b, root) for a, b in itertools.combinations(merged, 2))


def _min_properties(node: dict[str, Any], root: Any) -> bool:
    return _types(node) == frozenset({"object"}) and _open_ended(_without(node, "minProperties"), root)


def _contains(node: dict[str, Any], root: Any) -> bool:
    contains = node.get("contains")
    return (
        _types(node) == frozenset({"array"})
        and "maxItems" not in node
        and "prefixItems" not in node
        and contains is not None
        and _witness_within(contains, node.get("items", {}))
    )


@dataclass(frozen=True)
class ClosingCondition:
    """When the closing-token rule enforces one keyword with no dead end.

    Attributes:
        when: the condition, in words (``docs/keyword_support.md`` shows it).
        holds: whether it holds for the subschema holding the keyword (and the root, for
            ``$ref``s).
    """

    when: str
    holds: Callable[[dict[str, Any], Any], bool]


#: The keywords the closing-token rule enforces, and when; every other checked keyword
#: is a dead end (refused in strict mode).
RULES: dict[str, ClosingCondition] = {
    "uniqueItems": ClosingCondition("the items are open-ended", _unique),
    "not": ClosingCondition("it excludes a `const` or an `enum` from an open-ended value", _not),
    "oneOf": ClosingCondition(
        "every two branches take disjoint types, or one is a `const`/`enum` and the other open-ended", _one_of
    ),
    "minProperties": ClosingCondition("the object is open-ended", _min_properties),
    "contains": ClosingCondition(
        "the array takes further items (no `maxItems`, no tuple) and a value of the `contains` subschema is easy to build",
        _contains,
    ),
    "minContains": ClosingCondition("`contains` is enforced (its row)", _contains),
}


def _witness_within(schema: Any, items: Any) -> bool:
    """Whether a value of ``schema`` is easy to build that ``items`` also takes."""
    import jsonschema

    found = witness(schema)
    return found is not NO_WITNESS and (
        items in ({}, True) or jsonschema.Draft202012Validator(items).is_valid(found)
    )


def _separable(a: dict[str, Any] | None, b: dict[str, Any] | None, root: Any) -> bool:
    """Whether the values in both branches are a finite set left by continuing one."""
    if a is None or b is None:
        return False
    types_a, types_b = _types(a), _types(b)
    if types_a and types_b and not types_a & types_b:
        return True
    finite_a, finite_b = _finite(a), _finite(b)
    return (finite_a and _open_ended(b, root)) or (finite_b and _open_ended(a, root))


def _finite(node: dict[str, Any]) -> bool:
    return "const" in node or isinstance(node.get("enum"), list)


def _open_ended(node: Any, root: Any) -> bool:
    """Whether every prefix of a value of ``node`` has infinitely many completions that
    satisfy ``node`` (see the module docstring)."""
    node = _resolved(node, root)
    if node is None or _CONDITIONAL & node.keys():
        return False
    types = _types(node)
    if not types:
        return False
    for t in types - ({"integer"} if "number" in types else set()):
        if t == "string" and _BOUNDED_STRING & node.keys():
            return False
        if t == "number" and _BOUNDED_NUMBER & node.keys():
            return False
        if t == "object" and (
            _BOUNDED_OBJECT & node.keys() or not _takes_more(node.get("additionalProperties"))
        ):
            return False
        if t == "array" and (_BOUNDED_ARRAY & node.keys() or isinstance(node.get("items"), list)):
            return False
        if t not in ("string", "number", "object", "array"):
            return False
    return True


def _takes_more(additional: Any) -> bool:
    """Whether ``additionalProperties`` lets an object take one more property."""
    if additional is None or additional is True:
        return True
    return isinstance(additional, dict) and witness(additional) is not NO_WITNESS


def _resolved(node: Any, root: Any) -> dict[str, Any] | None:
    """``node`` with a bare local ``$ref`` followed (annotations beside it allowed)."""
    found = follow_bare_ref(node, root, annotations_allowed=True)
    return found if isinstance(found, dict) else None


def _without(node: dict[str, Any], keyword: str) -> dict[str, Any]:
    return {k: v for k, v in node.items() if k != keyword}


__all__ = ["RULES", "ClosingCondition", "dead_ends"]
