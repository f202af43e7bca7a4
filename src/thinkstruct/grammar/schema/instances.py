"""What a JSON Schema's instances must look like, worked out without a backend.

- :func:`shortest_instance` proves that a schema has no finite instance at all (a
  ``$ref`` recursion without a base case, a required part that is ``false``), or gives a
  lower bound on the length of its shortest instance in characters (``minItems:
  1000000000``). Only what is provable counts: a keyword not understood here is taken to
  allow everything, so a satisfiable schema is never called empty.
- :func:`witness` builds a small instance that should be valid (for the compile probes in
  :mod:`.probe`); it gives up on anything it cannot be sure of, and the probe checks a
  rejected witness with the reference validator before blaming a backend.
"""

from __future__ import annotations

import json
import math
from typing import Any

from thinkstruct.grammar.constraint import escape_pointer
from thinkstruct.grammar.schema.walk import local_ref, subschemas

#: ``$ref`` depth followed for the length bound (deeper refs count as one character).
_REF_DEPTH = 8

_TYPES = ("null", "boolean", "integer", "number", "string", "array", "object")
_SCALAR_LENGTH = {"null": 4, "boolean": 4, "integer": 1, "number": 1}


def shortest_instance(schema: Any, text: str | None = None) -> tuple[int | None, str]:
    """``(length, pointer)``: a lower bound on the characters of any valid instance
    written compactly, or ``None`` when provably no finite instance exists; ``pointer``
    names the subschema responsible (``""`` for the root). ``text`` is the schema's JSON
    text when the caller has it (it spares serializing the schema again)."""
    productive = _productive_targets(schema, text)
    bound = _Bound(schema, productive)
    length = bound.length(schema, "", 0)
    if math.isinf(length):
        return None, _why_empty(schema, productive)
    return int(length), bound.widest


# ---- which subschemas have finite instances -----------------------------------------


def _ref_targets(root: Any) -> dict[str, Any]:
    targets: dict[str, Any] = {"": root}
    for node, _ in subschemas(root):
        found = local_ref(node, root)
        if found is not None:
            targets.setdefault(found[1], found[0])
    return targets


def _productive_targets(root: Any, text: str | None) -> dict[str, bool]:
    """For every ``$ref`` target (and the root): whether it has a finite instance. The
    least fixpoint: start from "none has" and iterate until nothing changes."""
    if '"$ref"' not in (json.dumps(root) if text is None else text):
        return {"": _Productive(root, {}).of(root)}
    targets = _ref_targets(root)
    known = dict.fromkeys(targets, False)
    for _ in range(len(targets) + 1):  # each pass settles at least one target
        changed = False
        check = _Productive(root, known)
        for pointer, node in targets.items():
            if not known[pointer] and check.of(node):
                known[pointer] = changed = True
        if not changed:
            break
    return known


class _Productive:
    def __init__(self, root: Any, known: dict[str, bool]) -> None:
        self.root, self.known = root, known

    def of(self, node: Any) -> bool:
        if node is False:
            return False
        if not isinstance(node, dict):
            return True
        if isinstance(node.get("enum"), list) and not node["enum"]:
            return False
        found = local_ref(node, self.root)
        if found is not None and not self.known.get(found[1], True):
            return False
        if any(not self.of(b) for b in _list(node, "allOf")):
            return False
        for keyword in ("anyOf", "oneOf"):
            branches = _list(node, keyword)
            if branches and not any(self.of(b) for b in branches):
                return False
        if "const" in node or "enum" in node:
            return True
        return any(self._type_ok(node, t) for t in _types(node))

    def _type_ok(self, node: dict[str, Any], t: str) -> bool:
        if t == "object":
            return all(self.of(_property_schema(node, name)) for name in _required(node))
        if t == "array":
            return all(self.of(_item_schema(node, i)) for i in range(min(_count(node, "minItems"), 64)))
        return True


def _why_empty(root: Any, productive: dict[str, bool]) -> str:
    """The pointer of the subschema that makes ``root`` empty: a ``false``, an empty
    ``enum``, or the target where a recursion without a base case closes."""
    check = _Productive(root, productive)
    node, pointer = root, ""
    seen: set[str] = set()
    while isinstance(node, dict):
        if isinstance(node.get("enum"), list) and not node["enum"]:
            return f"{pointer}/enum"
        found = local_ref(node, root)
        if found is not None and not productive.get(found[1], True):
            if found[1] in seen or found[1] == pointer:
                return found[1]
            seen.add(pointer)
            node, pointer = found
            continue
        step = _first_empty_part(node, pointer, check)
        if step is None:
            return pointer
        seen.add(pointer)
        node, pointer = step
    return pointer


def _first_empty_part(node: dict[str, Any], pointer: str, check: _Productive) -> tuple[Any, str] | None:
    for i, branch in enumerate(_list(node, "allOf")):
        if not check.of(branch):
            return branch, f"{pointer}/allOf/{i}"
    types = _types(node)
    if types == ["object"]:
        for name in _required(node):
            sub = _property_schema(node, name)
            if not check.of(sub):
                return sub, f"{pointer}/properties/{escape_pointer(name)}"
    if types == ["array"]:
        for i in range(min(_count(node, "minItems"), 64)):
            sub = _item_schema(node, i)
            if not check.of(sub):
                prefix = _list(node, "prefixItems")
                return sub, f"{pointer}/prefixItems/{i}" if i < len(prefix) else f"{pointer}/items"
    return None


# ---- the length bound ------------------------------------------------------------------


class _Bound:
    """Lower bounds, each ``$ref`` target computed once (a target met again while it is
    being computed counts as one character: still a lower bound)."""

    def __init__(self, root: Any, productive: dict[str, bool]) -> None:
        self.root, self.productive = root, productive
        #: Pointer of the keyword that contributes most to the bound.
        self.widest = ""
        self._widest_value = 0.0
        self._memo: dict[str, float] = {}
        self._open: set[str] = set()

    def length(self, node: Any, pointer: str, depth: int) -> float:
        if node is False:
            return math.inf
        if not isinstance(node, dict):
            return 1
        parts = [self._own(node, pointer, depth)]
        found = local_ref(node, self.root)
        if found is not None:
            target, target_pointer = found
            if not self.productive.get(target_pointer, True):
                return math.inf
            if target_pointer in self._memo:
                parts.append(self._memo[target_pointer])
            elif target_pointer in self._open or depth >= _REF_DEPTH:
                parts.append(1)
            else:
                self._open.add(target_pointer)
                value = self.length(target, target_pointer, depth + 1)
                self._open.discard(target_pointer)
                self._memo[target_pointer] = value
                parts.append(value)
        parts += [self.length(b, f"{pointer}/allOf/{i}", depth) for i, b in enumerate(_list(node, "allOf"))]
        for keyword in ("anyOf", "oneOf"):
            branches = _list(node, keyword)
            if branches:
                parts.append(
                    min(self.length(b, f"{pointer}/{keyword}/{i}", depth) for i, b in enumerate(branches))
                )
        return max(parts)

    def _own(self, node: dict[str, Any], pointer: str, depth: int) -> float:
        # A literal value is written in the schema itself, so it cannot make the answer
        # longer than a context holds the schema: one character is bound enough (and
        # costs nothing for an enum of 100,000 values).
        if "const" in node:
            return 1
        if isinstance(node.get("enum"), list):
            return 1 if node["enum"] else math.inf
        return min(self._typed(node, t, pointer, depth) for t in _types(node))

    def _typed(self, node: dict[str, Any], t: str, pointer: str, depth: int) -> float:
        if t == "string":
            n = _count(node, "minLength")
            self._note(n, f"{pointer}/minLength")
            return 2 + n
        if t == "array":
            n = _count(node, "minItems")
            items = sum(
                self.length(_item_schema(node, i), _item_pointer(node, pointer, i), depth)
                for i in range(min(n, 64))
            )
            if n > 64:  # the rest as long as the last one counted
                items += (n - 64) * self.length(_item_schema(node, n), _item_pointer(node, pointer, n), depth)
            self._note(n, f"{pointer}/minItems")
            return 2 + items + max(n - 1, 0)
        if t == "object":
            required = _required(node)
            members = sum(
                len(_compact(name))
                + 1
                + self.length(_property_schema(node, name), _property_pointer(node, pointer, name), depth)
                for name in required
            )
            extra = max(_count(node, "minProperties") - len(required), 0)
            count = len(required) + extra
            self._note(4 * extra, f"{pointer}/minProperties")
            return 2 + members + 4 * extra + max(count - 1, 0)
        return _SCALAR_LENGTH[t]

    def _note(self, own: float, pointer: str) -> None:
        # The keyword whose own demand is largest is the one to name.
        if own > self._widest_value and not math.isinf(own):
            self._widest_value, self.widest = own, pointer


# ---- a witness ----------------------------------------------------------------------------

#: Keywords :func:`witness` does not try to satisfy (it gives up on a node using them).
_HARD = frozenset(
    {
        "pattern", "format", "not", "if", "then", "else", "multipleOf", "uniqueItems", "contains",
        "patternProperties", "propertyNames", "dependencies", "dependentRequired",
        "dependentSchemas", "unevaluatedProperties", "unevaluatedItems", "exclusiveMinimum",
        "exclusiveMaximum", "$dynamicRef", "$recursiveRef", "additionalItems",
    }
)  # fmt: skip

NO_WITNESS = object()


def witness(schema: Any) -> Any:
    """A small instance that should satisfy ``schema``, or :data:`NO_WITNESS`."""
    found = witnesses(schema)
    return found[0] if found else NO_WITNESS


def witnesses(schema: Any) -> list[Any]:
    """Small instances that should satisfy ``schema``: one per JSON type the root allows
    (a backend may produce some types of a schema and not others), at most one when the
    root is a ``const``/``enum``/combination; ``[]`` when none is easy to build."""
    builder = _Witness(schema)
    out: list[Any] = []
    seen: set[str] = set()  # by JSON text: 0 == False in Python, not in JSON
    for node in _alternatives(schema, schema):
        root_types = _types(node) if isinstance(node, dict) and not _combined(node) else [None]
        for t in root_types:
            try:
                value = builder.of(node, 0) if t is None else builder.typed_root(node, t)
            except _GiveUp:
                continue
            text = _compact(value)
            if text not in seen:
                seen.add(text)
                out.append(value)
    return out


def _alternatives(node: Any, root: Any, depth: int = 0) -> list[Any]:
    """The root and, for a bare ``anyOf``/``oneOf``/``$ref`` root, its branches (each
    may give witnesses of its own)."""
    if depth > 4 or not isinstance(node, dict):
        return [node]
    found = local_ref(node, root)
    if found is not None and set(node) <= {"$ref", "$defs", "definitions", "$schema", "$id"}:
        return [node, *_alternatives(found[0], root, depth + 1)]
    for keyword in ("anyOf", "oneOf"):
        branches = _list(node, keyword)
        if branches and set(node) <= {keyword, "$defs", "definitions", "$schema", "$id"}:
            return [node, *(b for branch in branches[:16] for b in _alternatives(branch, root, depth + 1))]
    return [node]


def _combined(node: dict[str, Any]) -> bool:
    return bool({"const", "enum", "anyOf", "oneOf", "allOf", "$ref"} & node.keys()) or bool(
        _HARD & node.keys()
    )


def integral(value: Any) -> Any:
    """Integral floats written as integers (``-2.0`` is the integer -2 in JSON Schema, and
    the backends only take the integer spelling)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [integral(v) for v in value]
    if isinstance(value, dict):
        return {k: integral(v) for k, v in value.items()}
    return value


class _GiveUp(Exception):
    pass


class _Witness:
    def __init__(self, root: Any) -> None:
        self.root = root
        self.budget = 2000  # subschemas visited at most (anyOf retries multiply)

    def of(self, node: Any, depth: int) -> Any:
        self.budget -= 1
        if depth > 32 or node is False or self.budget < 0:
            raise _GiveUp
        if node is True or node == {}:
            return 0
        if not isinstance(node, dict) or _HARD.intersection(node):
            raise _GiveUp
        if "const" in node:
            return node["const"]
        if isinstance(node.get("enum"), list):
            if not node["enum"]:
                raise _GiveUp
            return node["enum"][0]
        if "allOf" in node:
            raise _GiveUp
        found = local_ref(node, self.root)
        if found is not None:
            if set(node) - {"$ref", "$defs", "definitions", "$id", "$schema", "title", "description"}:
                raise _GiveUp
            return self.of(found[0], depth + 1)
        for keyword in ("anyOf", "oneOf"):
            for branch in _list(node, keyword):
                try:
                    return self.of(branch, depth + 1)
                except _GiveUp:
                    continue
            if keyword in node:
                raise _GiveUp
        for t in _types(node):
            try:
                return self._typed(node, t, depth)
            except _GiveUp:
                continue
        raise _GiveUp

    def typed_root(self, node: dict[str, Any], t: str) -> Any:
        """A witness of type ``t`` for a root without combinations."""
        if node == {}:
            return {
                "null": None,
                "boolean": False,
                "integer": 0,
                "number": 0,
                "string": "",
                "array": [],
                "object": {},
            }[t]
        if not isinstance(node, dict) or _HARD.intersection(node):
            raise _GiveUp
        return self._typed(node, t, 0)

    def _typed(self, node: dict[str, Any], t: str, depth: int) -> Any:
        if t == "null":
            return None
        if t == "boolean":
            return False
        if t in ("integer", "number"):
            low, high = node.get("minimum"), node.get("maximum")
            value = math.ceil(low) if isinstance(low, (int, float)) else 0
            if isinstance(high, (int, float)) and value > high:
                value = math.floor(high)
                if isinstance(low, (int, float)) and value < low:
                    raise _GiveUp
            return value
        if t == "string":
            n = _count(node, "minLength")
            if n > 64:
                raise _GiveUp
            return "a" * n
        if t == "array":
            n = _count(node, "minItems")
            if n > 16:
                raise _GiveUp
            return [self.of(_item_schema(node, i), depth + 1) for i in range(n)]
        if t == "object":
            if _count(node, "minProperties") > len(_required(node)):
                raise _GiveUp
            raw = node.get("properties")
            properties: dict[str, Any] = raw if isinstance(raw, dict) else {}
            required = set(_required(node))
            if required - set(properties):
                raise _GiveUp
            # In the order of `properties`: the order every backend generates them in.
            return {name: self.of(sub, depth + 1) for name, sub in properties.items() if name in required}
        raise _GiveUp


# ---- helpers --------------------------------------------------------------------------------


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _list(node: dict[str, Any], keyword: str) -> list[Any]:
    value = node.get(keyword)
    return value if isinstance(value, list) else []


def _types(node: dict[str, Any]) -> list[str]:
    t = node.get("type")
    listed = [t] if isinstance(t, str) else t if isinstance(t, list) else list(_TYPES)
    known = [x for x in listed if x in _TYPES]
    if "number" in known and "integer" not in known:
        known.append("integer")
    return sorted(known, key=_TYPES.index) or list(_TYPES)


def _count(node: dict[str, Any], keyword: str) -> int:
    v = node.get(keyword, 0)
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 else 0


def _required(node: dict[str, Any]) -> list[str]:
    required = node.get("required")
    return [r for r in required if isinstance(r, str)] if isinstance(required, list) else []


def _property_schema(node: dict[str, Any], name: str) -> Any:
    properties = node.get("properties")
    if isinstance(properties, dict) and name in properties:
        return properties[name]
    if node.get("patternProperties"):
        return True  # may match a pattern: not provable here
    return node.get("additionalProperties", True)


def _property_pointer(node: dict[str, Any], pointer: str, name: str) -> str:
    properties = node.get("properties")
    if isinstance(properties, dict) and name in properties:
        return f"{pointer}/properties/{escape_pointer(name)}"
    return f"{pointer}/additionalProperties"


def _item_pointer(node: dict[str, Any], pointer: str, i: int) -> str:
    return f"{pointer}/prefixItems/{i}" if i < len(_list(node, "prefixItems")) else f"{pointer}/items"


def _item_schema(node: dict[str, Any], i: int) -> Any:
    prefix = _list(node, "prefixItems")
    if i < len(prefix):
        return prefix[i]
    items = node.get("items", True)
    if isinstance(items, list):  # draft 7 tuples
        return items[i] if i < len(items) else node.get("additionalItems", True)
    return items
