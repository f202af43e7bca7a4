"""How many intersections compiling a schema's merges takes: :func:`merge_combinations`.

llguidance compiles ``allOf`` (and a ``$ref`` with sibling keywords) by intersecting the
parts, distributing every part's ``anyOf``/``oneOf`` over the others', and it merges the
parts' ``properties``/``items`` the same way. So three parts of 30 alternatives each are
27,000 intersections: about 8 s of native code on 2 cores for a 1 KB schema (about 0.3 ms
per intersection, measured on the 129k vocabulary), and four parts are minutes. Such a
compile cannot stay on an in-process thread, which cannot be stopped; the estimate here
sends it to a worker process that can be killed at the deadline.

The estimate is an upper bound of the product of the alternatives merged at any one
place, cheap (linear in the schema for the usual schemas) and never an exception;
whatever it cannot follow (deep ``$ref`` chains, a huge document) counts as expensive.
"""

from __future__ import annotations

from typing import Any

from thinkstruct.grammar.schema.walk import local_ref, walk

#: Estimates are capped here (the products grow exponentially).
CAP = 1 << 40

#: Nesting of merges and ``$ref`` hops followed; deeper counts as :data:`CAP`.
_DEPTH = 32

#: Nodes visited in all before the estimate gives up and answers :data:`CAP`.
_BUDGET = 200_000

#: Keywords whose subschemas of merged parts are merged with each other.
_MERGED_CHILDREN = ("items", "additionalProperties", "contains", "propertyNames", "additionalItems")
_MERGED_MAPS = ("properties", "patternProperties")


class _OverBudget(Exception):
    pass


class _Estimate:
    def __init__(self, root: Any) -> None:
        self.root = root
        self.visits = 0
        # By id, with the node kept so that an id is never reused for another node.
        self._alternatives: dict[int, tuple[Any, int]] = {}
        self._active: set[int] = set()

    def _visit(self) -> None:
        self.visits += 1
        if self.visits > _BUDGET:
            raise _OverBudget

    def own(self, node: dict[str, Any], depth: int) -> int:
        """Alternatives of ``node``'s own ``anyOf``/``oneOf`` (each branch counted with its
        own alternatives)."""
        n = 1
        for keyword in ("anyOf", "oneOf"):
            branches = node.get(keyword)
            if isinstance(branches, list) and branches:
                n = min(n * sum(self.alternatives(b, depth + 1) for b in branches), CAP)
        return n

    def alternatives(self, node: Any, depth: int) -> int:
        """How many union branches ``node`` stands for once its merges are distributed."""
        self._visit()
        if not isinstance(node, dict):
            return 1
        if depth > _DEPTH:
            return CAP
        known = self._alternatives.get(id(node))
        if known is not None and known[0] is node:
            return known[1]
        if id(node) in self._active:
            return 1  # a recursion: a grammar rule referring to itself, not an expansion
        self._active.add(id(node))
        try:
            n = self.own(node, depth)
            for part in self.merged_parts(node):
                n = min(n * self.alternatives(part, depth + 1), CAP)
        finally:
            self._active.discard(id(node))
        self._alternatives[id(node)] = (node, n)
        return n

    def merged_parts(self, node: dict[str, Any]) -> list[Any]:
        """The schemas ``node`` is intersected with: its ``allOf`` members and its
        ``$ref`` target."""
        parts = list(node["allOf"]) if isinstance(node.get("allOf"), list) else []
        found = local_ref(node, self.root)
        if found is not None:
            parts.append(found[0])
        return parts

    def flattened(
        self, node: Any, depth: int, into: list[dict[str, Any]], path: frozenset[int] = frozenset()
    ) -> None:
        """``node`` and every schema whose keywords end up beside its own in a merge
        (its union branches, ``allOf`` members, ``$ref`` target)."""
        self._visit()
        if not isinstance(node, dict) or id(node) in path:
            return  # a recursion adds nothing new
        if depth > _DEPTH:
            raise _OverBudget
        into.append(node)
        path = path | {id(node)}
        for keyword in ("anyOf", "oneOf", "allOf"):
            if isinstance(node.get(keyword), list):
                for branch in node[keyword]:
                    self.flattened(branch, depth + 1, into, path)
        found = local_ref(node, self.root)
        if found is not None:
            self.flattened(found[0], depth + 1, into, path)

    def merge(self, parts: list[Any], depth: int) -> int:
        """The most intersections merging ``parts`` takes, there or in their children."""
        if depth > _DEPTH:
            return CAP
        cost = 1
        for part in parts:
            cost = min(cost * self.alternatives(part, depth + 1), CAP)
        flat: list[dict[str, Any]] = []
        for part in parts:
            self.flattened(part, depth + 1, flat)
        children: dict[tuple[str, str], list[Any]] = {}
        for node in flat:
            for keyword in _MERGED_CHILDREN:
                if isinstance(node.get(keyword), dict):
                    children.setdefault((keyword, ""), []).append(node[keyword])
            for keyword in _MERGED_MAPS:
                if isinstance(node.get(keyword), dict):
                    for name, child in node[keyword].items():
                        children.setdefault((keyword, name), []).append(child)
        for group in children.values():
            if len(group) > 1:
                cost = max(cost, self.merge(group, depth + 1))
        return cost


def merge_combinations(schema: Any) -> int:
    """An upper estimate of the intersections the largest merge of ``schema`` takes
    (1 when nothing is merged; :data:`CAP` when it cannot tell)."""
    estimate = _Estimate(schema)
    worst = 1
    try:
        for node, _, _ in walk(schema):
            estimate._visit()
            if not isinstance(node, dict):
                continue
            parts = estimate.merged_parts(node)
            if not parts:
                continue
            rest = {k: v for k, v in node.items() if k not in ("allOf", "$ref")}
            worst = max(worst, estimate.merge([rest, *parts], 0))
    except (_OverBudget, RecursionError):
        return CAP
    return worst
