"""Superset rewrites: what a grammar cannot take, left out of the schema it gets.

Strict ``auto``'s last resort (:mod:`thinkstruct.grammar.service.auto`) for a schema that
no backend compiles, even leniently: :func:`relax` removes the parts its grammar chokes on
and returns their pointers, which are then *checked* as values close
(:func:`~.checks.plan_checks`'s ``relaxed``), validated against the schema as written.

Each removal only lets more instances through, for the lenient grammar it is compiled by
(which already ignores ``not``, ``if`` and the exclusivity of ``oneOf``, the places where
removing an assertion would forbid more):

- a ``pattern`` the backends' regex engines cannot run (look-around, back-references, an
  anchor inside the pattern: :func:`unparseable_pattern`);
- ``patternProperties`` with several patterns, in several subschemas (llguidance refuses
  overlapping ones) or one it cannot run, with the ``additionalProperties`` they shape;
- the keywords beside a ``$ref``, and beside an ``anyOf``/``oneOf``/``allOf`` whose branches
  are ``$ref``s (llguidance refuses to merge them into a circular reference).

After those, one exact rewrite with the same aim: an ``allOf`` branch whose keywords are
not the node's own and do not act together with them (``properties`` and
``additionalProperties``, ``if`` and ``then``...) is written into the node
(``{"type": "object", "allOf": [{"properties": ...}]}`` is ``{"type": "object",
"properties": ...}``), so there is nothing left to merge.
"""

from __future__ import annotations

import json
from typing import Any

from thinkstruct.grammar.constraint import escape_pointer
from thinkstruct.grammar.schema.keywords import NON_ASSERTIONS
from thinkstruct.grammar.schema.validation import regex_problem
from thinkstruct.grammar.schema.walk import subschemas

#: Keywords never removed beside a ``$ref``: identifiers and the definitions refs point into.
_KEPT = frozenset({"$ref", "$defs", "definitions", "$id", "$anchor", "$dynamicAnchor", "$schema"})
_APPLICATORS = ("anyOf", "oneOf", "allOf")


def unparseable_pattern(pattern: Any) -> bool:
    """Whether the backends' regex engines cannot run ``pattern`` as JSON Schema means it
    (anchors are implied at neither end; one inside the pattern is a look-around to them)."""
    if not isinstance(pattern, str):
        return False
    return regex_problem(pattern) is not None or _inner_anchor(pattern)


def has_unparseable_patterns(schema: Any) -> bool:
    """Whether any ``pattern`` or ``patternProperties`` key of ``schema`` is one."""
    for node, _ in subschemas(schema):
        if unparseable_pattern(node.get("pattern")):
            return True
        keys = node.get("patternProperties")
        if isinstance(keys, dict) and any(unparseable_pattern(k) for k in keys):
            return True
    return False


def relax(schema: Any) -> tuple[Any, frozenset[str]]:
    """A copy of ``schema`` without what a grammar cannot take (see the module doc), and
    the JSON pointers of the assertion keywords removed (annotations go unlisted)."""
    if not isinstance(schema, dict):
        return schema, frozenset()
    out = json.loads(json.dumps(schema))
    removed: set[str] = set()
    nodes = list(subschemas(out))
    # Patterns of several subschemas may meet in one object (allOf, $ref): llguidance
    # refuses them where they overlap, which is not decidable here.
    several = sum(isinstance(n.get("patternProperties"), dict) for n, _ in nodes) > 1
    for node, pointer in nodes:

        def drop(keyword: str, node: dict[str, Any] = node, pointer: str = pointer) -> None:
            if keyword in node:
                del node[keyword]
                if keyword not in NON_ASSERTIONS or keyword == "format":
                    removed.add(f"{pointer}/{escape_pointer(keyword)}")

        if unparseable_pattern(node.get("pattern")):
            drop("pattern")
        keys = node.get("patternProperties")
        if isinstance(keys, dict) and (several or len(keys) > 1 or any(unparseable_pattern(k) for k in keys)):
            drop("patternProperties")
            drop("additionalProperties")
        beside_refs = "$ref" in node or any(
            isinstance(node.get(a), list) and any(isinstance(b, dict) and "$ref" in b for b in node[a])
            for a in _APPLICATORS
        )
        if beside_refs:
            keep = _KEPT.union(a for a in _APPLICATORS if "$ref" not in node and a in node)
            for keyword in [k for k in node if k not in keep]:
                drop(keyword)
    # Last, so that the pointers removed are the schema's own.
    targets = _ref_targets(out)
    for node, pointer in list(subschemas(out)):
        _inline_all_of(node, pointer, targets)
    return out, frozenset(removed)


#: Keywords that act together: one on each side of a merge would change what they mean.
_TOGETHER = (
    frozenset({"properties", "patternProperties", "additionalProperties"}),
    frozenset({"prefixItems", "items", "additionalItems"}),
    frozenset({"if", "then", "else"}),
    frozenset({"contains", "minContains", "maxContains"}),
)
#: Keywords that keep an ``allOf`` branch where it is: identifiers, definitions (references
#: point into them), references (their siblings mean something else in draft 7) and the
#: ``unevaluated*`` keywords (which see what the branches evaluate).
_STAYS = frozenset(
    {
        "$id", "$anchor", "$dynamicAnchor", "$schema", "$defs", "definitions", "$ref", "$dynamicRef",
        "$recursiveRef", "$recursiveAnchor", "unevaluatedProperties", "unevaluatedItems",
    }
)  # fmt: skip


#: Keywords that keep a node's ``allOf`` as it is.
_REFERENCES_AND_UNEVALUATED = frozenset(
    {"$ref", "$dynamicRef", "$recursiveRef", "unevaluatedProperties", "unevaluatedItems"}
)


def _inline_all_of(node: dict[str, Any], pointer: str, targets: list[str]) -> None:
    """Write into ``node`` each ``allOf`` branch that merges exactly (see the module doc)."""
    branches = node.get("allOf")
    if not isinstance(branches, list) or node.keys() & _REFERENCES_AND_UNEVALUATED:
        return
    prefix = f"{pointer}/allOf"
    if any(t == prefix or t.startswith(prefix + "/") for t in targets):
        return  # a reference points into a branch: it must stay where it is
    kept = []
    for branch in branches:
        if (
            isinstance(branch, dict)
            and not branch.keys() & (_STAYS | {"allOf"})
            and not branch.keys() & node.keys()
            and not any(branch.keys() & group and node.keys() & group for group in _TOGETHER)
        ):
            node.update(branch)
        else:
            kept.append(branch)
    if kept:
        node["allOf"] = kept
    else:
        del node["allOf"]


def _ref_targets(schema: Any) -> list[str]:
    """The JSON pointers every local ``$ref`` of ``schema`` points to."""
    return [
        node["$ref"][1:]
        for node, _ in subschemas(schema)
        if isinstance(node.get("$ref"), str) and node["$ref"].startswith("#")
    ]


def _inner_anchor(pattern: str) -> bool:
    """An unescaped ``^`` or ``$`` outside a character class, other than at either end."""
    body = pattern[1:] if pattern.startswith("^") else pattern
    if body.endswith("$") and not body.endswith("\\$"):
        body = body[:-1]
    escaped = in_class = False
    for c in body:
        if escaped:
            escaped = False
        elif c == "\\":
            escaped = True
        elif in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c in "^$":
            return True
    return False


__all__ = ["has_unparseable_patterns", "relax", "unparseable_pattern"]
