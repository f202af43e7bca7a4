"""``oneOf`` branches that no value can match two of: :func:`exclusive_branches` (and
:func:`interval_pieces` for numeric intervals).

A grammar enforces ``anyOf`` exactly but cannot count how many branches a value matches,
so ``oneOf`` is enforced exactly only where its branches are made mutually exclusive;
then ``anyOf`` of them takes only values that match exactly one original branch. Each
pair of branches is either proved disjoint as it stands, or narrowed until it is; a pair
that is neither leaves the ``oneOf`` as it is (checked at run time).

A branch is reasoned about as the conjunction of its *parts*: the ``oneOf``'s own
subschema without the ``oneOf`` (its siblings apply to every branch), the branch, and the
members of their ``allOf``; a local ``$ref`` is followed to its target and the keywords
beside it are left out (draft 7 ignores them, 2020-12 adds them: leaving them out knows
less, never wrong). A part's ``anyOf``/``oneOf`` tells its types (the union of its
branches') and its required properties (those every branch requires); a property's
subschema is its ``properties`` entry, or ``additionalProperties`` where no
``patternProperties`` could claim the name. Two branches are disjoint when:

- their types are disjoint, or their ``const``/``enum`` value sets are;
- one is a value set (``const``/``enum``) none of whose members the other takes (checked
  with the reference validator, ``jsonschema``);
- on objects (one branch takes only objects): one requires a property the other forbids
  (``properties: {p: false}``, or ``additionalProperties: false`` with ``p`` not among its
  ``properties`` and no ``patternProperties``), or a property one of them requires has
  ``const``/``enum`` values or types none of which the other takes there.

Otherwise each branch of the pair is narrowed until no value of it matches the other
branch as given (so every value of a narrowed branch matches that branch alone, and the
rewritten schema takes a subset of the valid values, never an invalid one):

- a branch that says nothing of its type is narrowed to objects first;
- on objects, when the other branch requires a property ``p`` this one does not: this one
  forbids ``p`` (``properties: {p: false}``);
- on objects, when a property this one describes takes values here that it cannot take
  in the other (disjoint types or value sets): this one requires it;
- on objects, when the other branch forbids properties this one describes (``{}`` of two
  closed objects with no name in common): this one requires at least one of them;
- on arrays whose ``items`` take disjoint types, where only ``[]`` matches both: this one
  requires an item (``minItems: 1``).

A dependent schema's ``oneOf`` knows its object has the trigger property (``context``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from thinkstruct.grammar.schema.walk import local_ref

#: The JSON Schema type names.
ALL_TYPES = frozenset({"string", "number", "integer", "boolean", "object", "array", "null"})
#: Most branches compared pairwise (pairs grow as the square).
_MAX_BRANCHES = 256
#: Most members of a value set checked against another branch with the validator.
_MAX_CHECKED_VALUES = 64


def exclusive_branches(
    node: dict[str, Any], root: Any, validator: Any, context: tuple[dict[str, Any], ...] = ()
) -> list[Narrowing] | None:
    """What each of ``node``'s ``oneOf`` branches must be narrowed by so that no value
    matches two (see the module doc; :func:`narrowed` applies it), or ``None`` where that
    is not shown. ``node`` and ``root`` are the document as given (reasoning over an
    already narrowed document could claim branches disjoint that are not).

    Args:
        root: the whole document (for local ``$ref``s).
        validator: a callable giving the reference validator of ``root`` (called at most
            once, only when a value set is checked).
        context: what every value reaching ``node`` satisfies besides (a dependent
            schema's object has its trigger property).
    """
    branches = node.get("oneOf")
    if not isinstance(branches, list) or not 1 < len(branches) <= _MAX_BRANCHES:
        return None
    if any(not isinstance(b, dict) for b in branches):
        return None
    shared = [*context, *_parts({k: v for k, v in node.items() if k != "oneOf"}, root)]
    views = [Narrowing(shared + _parts(b, root), root) for b in branches]
    checker = _Checker(validator)
    for i in range(len(views)):
        for j in range(i + 1, len(views)):
            # Each narrowed branch must exclude every other branch as given.
            for x, y in ((views[i], views[j]), (views[j], views[i])):
                if not _excludes(x, y, checker) and not _narrow(x, y, checker):
                    return None
    return views


# ---- a branch as the conjunction of its parts -----------------------------------------


@dataclass
class Narrowing:
    """What is known of the values of one branch (every part holds), and what it is
    narrowed by. Methods with ``own`` count the narrowing (``False``: the branch as
    given)."""

    parts: list[dict[str, Any]]
    root: Any
    object_only: bool = False  # narrowed to objects
    forbidden: set[str] = field(default_factory=set)  # narrowed: properties it may not have
    also_required: set[str] = field(default_factory=set)  # narrowed: properties it must have
    need_one_of: list[list[str]] = field(default_factory=list)  # narrowed: has one of each
    nonempty: bool = False  # narrowed: an array with an item

    def narrows(self) -> bool:
        """Whether anything is added to the branch."""
        return (
            self.object_only
            or bool(self.forbidden or self.also_required or self.need_one_of)
            or self.nonempty
        )

    def types(self, own: bool = True) -> frozenset[str] | None:
        found: frozenset[str] | None = frozenset({"object"}) if own and self.object_only else None
        t = _types_of_parts(self.parts, self.root)
        if t is not None:
            found = t if found is None else found & t
        return found

    def only(self, kind: str, own: bool = True) -> bool:
        t = self.types(own)
        return t is not None and t <= {kind}

    def required(self, own: bool = True) -> set[str]:
        found: set[str] = set(self.also_required) if own else set()
        for part in self.parts:
            found |= _required(part)
            for branches in _alternatives(part):
                # What every branch of an anyOf/oneOf requires, the part requires.
                found |= set.intersection(
                    *(set().union(*map(_required, _parts(b, self.root))) for b in branches)
                )
        return found

    def forbids(self, prop: str, own: bool = True) -> bool:
        if own and prop in self.forbidden:
            return True
        for part in self.parts:
            props = _properties(part)
            if props.get(prop) is False or (_closed(part) and prop not in props):
                return True
        return False

    def described(self) -> list[str]:
        """The property names the branch's parts describe (``properties``), in order."""
        return list(dict.fromkeys(p for part in self.parts for p in _properties(part)))

    def property_schemas(self, prop: str) -> list[Any]:
        """The subschemas that a value of property ``prop`` must pass."""
        return [s for part in self.parts if (s := _property_schema(part, prop)) is not None]

    def property_values(self, prop: str) -> set[str] | None:
        """The values property ``prop`` may take at most, from ``const``/``enum`` (in an
        ``anyOf``/``oneOf``, the union over its branches where each says)."""
        found = _values([part for s in self.property_schemas(prop) for part in _parts(s, self.root)])
        for part in self.parts:
            for branches in _alternatives(part):
                union: set[str] | None = set()
                for branch in branches:
                    v = _values(
                        [
                            q
                            for b in _parts(branch, self.root)
                            for s in [_property_schema(b, prop)]
                            if s is not None
                            for q in _parts(s, self.root)
                        ]
                    )
                    union = None if v is None or union is None else union | v
                if union is not None:
                    found = union if found is None else found & union
        return found

    def property_types(self, prop: str) -> frozenset[str] | None:
        """The types property ``prop`` may take at most."""
        found: frozenset[str] | None = None
        for part in (part for s in self.property_schemas(prop) for part in _parts(s, self.root)):
            t = types_of(part)
            if t is not None:
                found = t if found is None else found & t
        return found

    def item_types(self) -> frozenset[str] | None:
        found: frozenset[str] | None = None
        for part in self.parts:
            items = part.get("items")
            if isinstance(items, dict) and "prefixItems" not in part:
                t = types_of(items)
                if t is not None:
                    found = t if found is None else found & t
        return found


def _parts(schema: Any, root: Any) -> list[dict[str, Any]]:
    """``schema`` and its ``allOf`` members, local ``$ref``s followed (up to 32)."""
    found: list[dict[str, Any]] = []
    stack = [schema]
    for _ in range(32):
        if not stack:
            break
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        if "$ref" in node:
            target = local_ref(node, root)
            if target is not None:
                stack.append(target[0])
            continue
        found.append(node)
        members = node.get("allOf")
        if isinstance(members, list):
            stack.extend(members)
    return found


def _types_of_parts(parts: list[dict[str, Any]], root: Any, depth: int = 0) -> frozenset[str] | None:
    """The types a value passing every one of ``parts`` can take (an ``anyOf``/``oneOf``
    takes the union of its branches' where each says), or ``None`` if unsure."""
    found: frozenset[str] | None = None
    for part in parts:
        known = [types_of(part)]
        if depth < 3:
            for branches in _alternatives(part):
                union: frozenset[str] | None = frozenset()
                for branch in branches:
                    t = _types_of_parts(_parts(branch, root), root, depth + 1)
                    union = None if t is None or union is None else union | t
                known.append(union)
        for t in known:
            if t is not None:
                found = t if found is None else found & t
    return found


def _required(part: dict[str, Any]) -> set[str]:
    r = part.get("required")
    return {x for x in r if isinstance(x, str)} if isinstance(r, list) else set()


def _alternatives(part: dict[str, Any]) -> list[list[Any]]:
    return [part[k] for k in ("anyOf", "oneOf") if isinstance(part.get(k), list) and part[k]]


def _property_schema(part: dict[str, Any], prop: str) -> Any:
    """The subschema ``part`` holds a value of property ``prop`` to (``properties``, or
    ``additionalProperties`` where no ``patternProperties`` could claim the name), or
    ``None``."""
    props = _properties(part)
    if prop in props:
        return props[prop]
    additional = part.get("additionalProperties")
    if isinstance(additional, dict) and not part.get("patternProperties"):
        return additional
    return None


def _properties(part: dict[str, Any]) -> dict[str, Any]:
    props = part.get("properties")
    return props if isinstance(props, dict) else {}


def _closed(part: dict[str, Any]) -> bool:
    return part.get("additionalProperties") is False and not part.get("patternProperties")


def _values(schemas: list[Any]) -> set[str] | None:
    """The JSON texts of the values every one of ``schemas`` allows at most (from their
    ``const``/``enum``), or ``None`` when none of them says."""
    found: set[str] | None = None
    for s in schemas:
        v = literal_values(s)
        if v is not None:
            found = v if found is None else found & v
    return found


# ---- exclusion ------------------------------------------------------------------------


class _Checker:
    """Whether none of a few values passes some subschemas, by the reference validator."""

    def __init__(self, validator: Any) -> None:
        self._make = validator
        self._validator: Any = None

    def none_pass(self, values: set[str] | None, schemas: list[Any]) -> bool:
        if values is None or len(values) > _MAX_CHECKED_VALUES or not schemas:
            return False
        try:
            if self._validator is None:
                self._validator = self._make()
            subs = [self._validator.evolve(schema=s) for s in schemas]
            return not any(all(sub.is_valid(json.loads(v)) for sub in subs) for v in values)
        except Exception:  # noqa: BLE001 - a validator error proves nothing
            return False


def _excludes(x: Narrowing, y: Narrowing, checker: _Checker) -> bool:
    """Whether no value of ``x`` (narrowed) matches ``y`` (as given)."""
    tx, ty = x.types(), y.types(own=False)
    if tx is not None and ty is not None and not (tx & ty):
        return True
    vx, vy = _values(x.parts), _values(y.parts)
    if vx is not None and vy is not None and not (vx & vy):
        return True
    if checker.none_pass(vx, y.parts) or checker.none_pass(vy, x.parts):
        return True
    if x.only("object") or y.only("object", own=False):
        if any(y.forbids(p, own=False) for p in x.required()):
            return True
        if any(x.forbids(p) for p in y.required(own=False)):
            return True
        if any(all(y.forbids(p, own=False) for p in names) for names in x.need_one_of):
            return True
        for prop in sorted(x.required() | y.required(own=False)):
            tx_p, ty_p = x.property_types(prop), y.property_types(prop)
            if tx_p is not None and ty_p is not None and not (tx_p & ty_p):
                return True
            px, py = x.property_values(prop), y.property_values(prop)
            if px is not None and py is not None and not (px & py):
                return True
            if checker.none_pass(px, y.property_schemas(prop)) or checker.none_pass(
                py, x.property_schemas(prop)
            ):
                return True
    if x.nonempty and (x.only("array") or y.only("array", own=False)):
        ix, iy = x.item_types(), y.item_types()
        if ix is not None and iy is not None and not (ix & iy):
            return True
    return False


def _narrow(x: Narrowing, y: Narrowing, checker: _Checker) -> bool:
    """Narrow ``x`` until no value of it matches ``y`` (as given); whether that was done
    (if not, ``x`` is left as it was)."""
    typed = x.types() is None
    if typed:
        x.object_only = True  # not an object's type said: narrowed to objects
        if _excludes(x, y, checker):
            return True
    if x.only("object") or y.only("object", own=False):
        described = set(x.described())
        missing = sorted(y.required(own=False) - x.required(), key=lambda p: (p in described, p))
        if missing:
            # One that ``x`` does not describe, if there is one (its values lose least).
            x.forbidden.add(missing[0])
            return True
        for prop in x.described():
            if prop in x.required() or x.forbids(prop):
                continue
            x.also_required.add(prop)  # a value there that ``y`` cannot take?
            if _excludes(x, y, checker):
                return True
            x.also_required.discard(prop)
        names = [p for p in x.described() if y.forbids(p, own=False) and not x.forbids(p)]
        if names:
            x.need_one_of.append(names)
            if _excludes(x, y, checker):
                return True
            x.need_one_of.pop()
    if x.only("array"):
        x.nonempty = True
        if _excludes(x, y, checker):
            return True
        x.nonempty = False
    if typed:
        x.object_only = False
    return False


def narrowed(branch: Any, view: Narrowing) -> Any:
    """``branch`` with the narrowing of ``view`` added (a new schema where anything is)."""
    extra: dict[str, Any] = {}
    if view.object_only:
        extra["type"] = "object"
    if view.forbidden:
        extra["properties"] = dict.fromkeys(sorted(view.forbidden), False)
    if view.nonempty:
        extra["minItems"] = 1
    required = sorted({names[0] for names in view.need_one_of if len(names) == 1} | view.also_required)
    alternatives: list[dict[str, Any]] = [
        {"anyOf": [{"required": [p]} for p in names]} for names in view.need_one_of if len(names) > 1
    ]
    if required:
        alternatives.append({"required": required})
    if not extra and not alternatives:
        return branch
    if not isinstance(branch, dict) or "$ref" in branch:
        return {**extra, "allOf": [branch, *alternatives]}
    out = dict(branch)
    if "type" in extra and "type" not in out:
        out["type"] = "object"
    elif "type" in extra:
        alternatives.append({"type": "object"})
    if view.forbidden:
        props = dict(_properties(out))
        props.update(extra["properties"])  # "absent" implies whatever the branch said of it
        out["properties"] = props
    if view.nonempty:
        current = out.get("minItems")
        out["minItems"] = max(current, 1) if isinstance(current, int) else 1
    if alternatives:
        out["allOf"] = [*(out["allOf"] if isinstance(out.get("allOf"), list) else []), *alternatives]
    return out


# ---- numbers in intervals -------------------------------------------------------------

_BOUNDS = ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")
_ANNOTATIONS = frozenset({"title", "description", "$comment", "default", "examples"})


def interval_pieces(branches: list[Any]) -> list[dict[str, Any]] | None:
    """The numbers in exactly one branch of a ``oneOf`` whose branches are numeric
    intervals (``minimum``... and at most ``type: number``), as ``anyOf`` branches of
    disjoint intervals (the same values: an exact rewrite); ``None`` for other branches.
    A value that is not a number is in every untyped branch, so in none or in two or more:
    with exactly one untyped branch the rewrite is not made."""
    intervals = []
    untyped = 0
    for branch in branches:
        if not isinstance(branch, dict) or set(branch) - {*_BOUNDS, "type"} - _ANNOTATIONS:
            return None
        if "type" not in branch:
            untyped += 1
        elif branch["type"] != "number":
            return None
        bounds = [branch.get(k) for k in _BOUNDS]
        if any(b is not None and (isinstance(b, bool) or not isinstance(b, (int, float))) for b in bounds):
            return None  # draft 4's boolean exclusive bounds, or not a number
        low, low_open, high, high_open = -math.inf, True, math.inf, True
        if bounds[0] is not None:
            low, low_open = bounds[0], False
        if bounds[1] is not None and bounds[1] >= low:
            low, low_open = bounds[1], True
        if bounds[2] is not None:
            high, high_open = bounds[2], False
        if bounds[3] is not None and bounds[3] <= high:
            high, high_open = bounds[3], True
        intervals.append((low, low_open, high, high_open))
    if untyped == 1:
        return None

    def count(x: float) -> int:
        return sum(
            (lo < x or (lo == x and not lo_open)) and (x < hi or (x == hi and not hi_open))
            for lo, lo_open, hi, hi_open in intervals
        )

    points = sorted({e for lo, _, hi, _ in intervals for e in (lo, hi) if math.isfinite(e)})
    # Pieces in order: (-inf, p0), {p0}, (p0, p1), {p1}, ..., (pn, inf); each is in the
    # same intervals throughout.
    edges = [-math.inf, *points, math.inf]
    pieces: list[tuple[float, bool, float, bool]] = []
    for i in range(len(edges) - 1):
        lo, hi = edges[i], edges[i + 1]
        inside = (
            (lo + hi) / 2
            if math.isfinite(lo) and math.isfinite(hi)
            else (hi - 1 if math.isfinite(hi) else lo + 1)
        )
        if not points:
            inside = 0.0
        if count(inside) == 1:
            _extend(pieces, (lo, True, hi, True))
        if math.isfinite(hi) and count(hi) == 1:
            _extend(pieces, (hi, False, hi, False))
    return [_interval(*piece) for piece in pieces]


def _extend(pieces: list[tuple[float, bool, float, bool]], piece: tuple[float, bool, float, bool]) -> None:
    """Append ``piece``, joined to the last one where they touch."""
    if pieces:
        lo, lo_open, hi, hi_open = pieces[-1]
        if hi == piece[0] and not (hi_open and piece[1]):
            pieces[-1] = (lo, lo_open, piece[2], piece[3])
            return
    pieces.append(piece)


def _interval(lo: float, lo_open: bool, hi: float, hi_open: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "number"}
    if math.isfinite(lo):
        out["exclusiveMinimum" if lo_open else "minimum"] = lo
    if math.isfinite(hi):
        out["exclusiveMaximum" if hi_open else "maximum"] = hi
    return out


# ---- types and value sets -------------------------------------------------------------


def types_of(schema: Any) -> frozenset[str] | None:
    """The JSON types a schema can match, where that is evident; ``None`` if unsure."""
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return frozenset({type_of(schema["const"])})
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return frozenset(type_of(v) for v in schema["enum"])
    t = schema.get("type")
    if isinstance(t, str):
        t = [t]
    if isinstance(t, list) and all(isinstance(x, str) for x in t):
        s = set(t)
        if "number" in s:
            s.add("integer")  # integers are numbers
        return frozenset(s)
    return None


def type_of(value: Any) -> str:
    """The JSON type of a value (``integer`` for a number without a fraction)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def literal_values(schema: Any) -> set[str] | None:
    """The JSON texts of a schema's ``const``/``enum`` values, or ``None``."""
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return {json.dumps(schema["const"], sort_keys=True)}
    if isinstance(schema.get("enum"), list):
        return {json.dumps(v, sort_keys=True) for v in schema["enum"]}
    return None


__all__ = [
    "ALL_TYPES",
    "Narrowing",
    "exclusive_branches",
    "interval_pieces",
    "literal_values",
    "narrowed",
    "type_of",
    "types_of",
]
