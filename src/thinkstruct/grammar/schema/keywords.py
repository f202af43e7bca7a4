"""What a JSON Schema asks of its instances: keyword scan and exact rewrites.

:func:`assertions` lists every assertion keyword a schema uses, with its JSON pointer,
so the backend choice can tell whether a backend would enforce all of it. :func:`normalize`
rewrites a schema into an equivalent one that more backends can compile exactly. Every
rewrite keeps the set of valid instances unchanged:

- ``format`` values no backend knows are dropped. In JSON Schema 2020-12 ``format`` is an
  annotation unless a format-assertion vocabulary is declared, so this changes nothing a
  validator would check.
- A subschema whose values form a finite set (``enum``/``const``, also inside ``allOf``)
  becomes the ``enum`` of the members that pass the whole subschema, checked by the
  reference validator (``jsonschema``) — whatever else it says (``not``, ``oneOf``,
  ``if``...) is then enforced exactly.
- ``dependentRequired``/``dependentSchemas``/``dependencies`` become ``anyOf`` of "the
  trigger property is absent" (``properties: {p: false}``) and "it is present with what
  it requires".
- ``not`` of ``required``, of a ``type`` list, of ``true``/``false``, of a pattern of
  whole strings of one character class (``^[S]+$``) becomes the equivalent positive form.
- ``$dynamicAnchor`` in a document without ``$dynamicRef`` becomes ``$anchor`` (the two
  then mean the same).
- ``oneOf`` whose branches provably cannot both match (disjoint types or literal values,
  different ``const``/``enum`` values of one required property, or a property one branch
  requires and the other forbids) becomes ``anyOf``.

A ``oneOf`` of numeric intervals becomes the ``anyOf`` of the intervals its numbers fall
in exactly one of.

One rewrite narrows instead: a ``oneOf`` whose branches can be made mutually exclusive
(a branch forbids a property another requires, and the like: :mod:`.one_of`) becomes the
``anyOf`` of the narrowed branches. Its values are a subset of the valid ones (never an
invalid one), and every backend then enforces it exactly.
- no-op assertions (``uniqueItems: false``, ``minItems: 0``, ``propertyNames`` of
  annotations only...) are dropped.
"""

from __future__ import annotations

import json
from typing import Any

from thinkstruct.grammar.constraint import escape_pointer
from thinkstruct.grammar.schema.one_of import (
    ALL_TYPES,
    Narrowing,
    exclusive_branches,
    interval_pieces,
    narrowed,
)
from thinkstruct.grammar.schema.walk import children, resolve, subschemas

#: Formats llguidance enforces (also known to xgrammar and outlines-core).
KNOWN_FORMATS = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uri", "uuid"}
)

#: Keywords that assert nothing (annotations, identifiers, structure handled elsewhere;
#: ``format`` is reported by :func:`assertions` for the formats backends know).
NON_ASSERTIONS = frozenset(
    {
        "$schema",
        "$id",
        "$anchor",
        "$dynamicAnchor",
        "$comment",
        "$vocabulary",
        "$defs",
        "definitions",
        "title",
        "description",
        "default",
        "examples",
        "deprecated",
        "readOnly",
        "writeOnly",
        "contentMediaType",
        "contentEncoding",
        "contentSchema",
        "format",
    }
)


def assertions(schema: Any) -> list[tuple[str, str]]:
    """``(keyword, pointer)`` for every assertion keyword in ``schema`` and its subschemas.

    ``oneOf`` is reported as ``"oneOf"`` only where its branches may overlap (see
    :func:`normalize`); ``format`` is reported as ``"format"`` for known formats.
    """
    found: list[tuple[str, str]] = []
    for node, pointer in subschemas(schema):
        for keyword, value in node.items():
            if keyword == "format":
                if value in KNOWN_FORMATS:
                    found.append(("format", f"{pointer}/format"))
            elif keyword not in NON_ASSERTIONS and not _is_noop(keyword, value):
                found.append((keyword, f"{pointer}/{escape_pointer(keyword)}"))
    return found


def normalize(schema: Any, *, hard_keywords: frozenset[str], text: str | None = None) -> Any:
    """An equivalent schema that more backends compile exactly (see the module doc).

    Args:
        hard_keywords: the keywords some backend cannot enforce (finite value sets are
            narrowed only under them, where it pays off).
        text: ``schema``'s JSON text when the caller has it (spares serializing it).
    """
    if not isinstance(schema, dict):
        return schema
    if text is None:
        text = json.dumps(schema)
    out = json.loads(text)  # a private copy, much faster than deepcopy
    if '"oneOf"' in text and _exclusive_one_of(out, json.loads(text)):
        text = json.dumps(out)
    if _narrow_finite(out, text, hard_keywords):
        text = json.dumps(out)
    dynamic = '"$dynamicRef"' in text
    for node, _ in subschemas(out):
        fmt = node.get("format")
        if fmt is not None and fmt not in KNOWN_FORMATS:
            del node["format"]
        for keyword in [k for k, v in node.items() if _is_noop(k, v)]:
            del node[keyword]
        if not dynamic and "$dynamicAnchor" in node and "$anchor" not in node:
            # With no $dynamicRef anywhere, a dynamic anchor is a plain anchor.
            node["$anchor"] = node.pop("$dynamicAnchor")
        _rewrite_dependencies(node)
        _rewrite_not(node)
        branches = node.get("oneOf")
        if isinstance(branches, list) and len(branches) == 1:
            _add_constraint(node, node.pop("oneOf")[0])
        elif isinstance(branches, list) and (pieces := interval_pieces(branches)) is not None:
            del node["oneOf"]
            _add_constraint(node, {"anyOf": pieces} if pieces else False)
    return out


def _add_constraint(node: dict[str, Any], extra: Any) -> None:
    """Require ``extra`` of ``node`` too (as one more ``allOf`` member, or in place)."""
    if isinstance(extra, dict) and len(extra) == 1 and "anyOf" in extra and "anyOf" not in node:
        node["anyOf"] = extra["anyOf"]
    else:
        node.setdefault("allOf", []).append(extra)


# ---- oneOf ---------------------------------------------------------------------------


def _exclusive_one_of(out: dict[str, Any], pristine: dict[str, Any]) -> bool:
    """Make each ``oneOf`` of ``out`` whose branches are (or are narrowed to be) mutually
    exclusive an ``anyOf`` (:mod:`.one_of`), judged on ``pristine`` (``out`` as given);
    whether anything changed.

    Narrowing a subschema narrows the document only where the subschema is used
    positively: not under ``not``, ``if`` or ``contains``, not in a branch of a ``oneOf``
    left as it is, and not reached by a ``$ref`` from such a place (:func:`_negative`).
    A narrowing is kept only there, and only in documents whose references are all JSON
    pointers (an anchor's target is not followed here)."""
    targets = _ref_targets(pristine)
    validator: Any = None

    def make_validator() -> Any:
        nonlocal validator
        if validator is None:
            validator = _validator(pristine)
        return validator

    found: dict[str, list[Narrowing] | None] = {}
    triggers: dict[str, str] = {}  # a dependent schema's pointer -> its trigger property
    for node, pointer in subschemas(pristine):
        for keyword in ("dependencies", "dependentSchemas"):
            if isinstance(node.get(keyword), dict):
                for name, sub in node[keyword].items():
                    if isinstance(sub, dict) and f"{pointer}/{keyword}/{escape_pointer(name)}" not in targets:
                        triggers[f"{pointer}/{keyword}/{escape_pointer(name)}"] = name
        if not isinstance(node.get("oneOf"), list) or len(node["oneOf"]) < 2:
            continue
        if any(t.startswith(f"{pointer}/oneOf/") for t in targets):
            found[pointer] = None  # a $ref points into a branch: its pointer must stay
        else:
            # A dependent schema applies to objects with its trigger property.
            context = ({"type": "object", "required": [triggers[pointer]]},) if pointer in triggers else ()
            found[pointer] = exclusive_branches(node, pristine, make_validator, context)
    pointers_only = not _other_references(pristine)
    changed = True
    while changed:  # a narrowing dropped leaves its oneOf as it is, which may drop others
        negative = _negative(pristine, {p for p, v in found.items() if v is not None})
        changed = False
        for pointer, views in found.items():
            narrows = views is not None and any(v.narrows() for v in views)
            if narrows and (not pointers_only or pointer in negative):
                found[pointer] = None
                changed = True
    rewritten = [(p, v) for p, v in found.items() if v is not None]
    # Deepest first: a rewrite moves the branches below it, not the ones above.
    for pointer, views in sorted(rewritten, key=lambda f: -f[0].count("/")):
        node = resolve(out, pointer)
        branches = node.pop("oneOf")
        _add_constraint(node, {"anyOf": [narrowed(b, v) for b, v in zip(branches, views, strict=True)]})
    return bool(rewritten)


#: Keywords under which a narrower subschema does not make the document narrower.
_NEGATIVE = frozenset({"not", "if", "contains"})


def _negative(root: Any, exclusive: set[str]) -> set[str]:
    """Pointers of the subschemas of ``root`` used where a narrower subschema could widen
    the document: under a :data:`_NEGATIVE` keyword or a ``oneOf`` not in ``exclusive``,
    directly or through local ``$ref``s."""
    seen: set[tuple[str, bool]] = set()
    negative: set[str] = set()
    stack = [("", True)]
    while stack:
        pointer, positive = stack.pop()
        if (pointer, positive) in seen:
            continue
        seen.add((pointer, positive))
        if not positive:
            negative.add(pointer)
        node = resolve(root, pointer)
        if not isinstance(node, dict):
            continue
        ref = node.get("$ref")
        if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
            stack.append((ref[1:], positive))
        for _, child in children(node, pointer):
            keyword = child[len(pointer) + 1 :].split("/", 1)[0]
            stack.append(
                (
                    child,
                    positive and keyword not in _NEGATIVE and (keyword != "oneOf" or pointer in exclusive),
                )
            )
    return negative


def _other_references(root: Any) -> bool:
    """Whether ``root`` has a reference that is not a local JSON pointer."""
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for keyword in ("$ref", "$dynamicRef", "$recursiveRef"):
                ref = node.get(keyword)
                if isinstance(ref, str) and not (ref == "#" or ref.startswith("#/")):
                    return True
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


# ---- dependencies ---------------------------------------------------------------------

#: Most alternatives the dependency rewrite may multiply into (2 per dependency).
_MAX_DEPENDENCY_PRODUCT = 64


def _rewrite_dependencies(node: dict[str, Any]) -> None:
    rules: list[tuple[str, Any]] = []
    for keyword in ("dependentRequired", "dependentSchemas", "dependencies"):
        value = node.get(keyword)
        if not isinstance(value, dict):
            continue
        for prop, need in value.items():
            if isinstance(need, list) and all(isinstance(x, str) for x in need):
                rules.append((prop, {"required": [prop, *need]}))
            elif isinstance(need, (dict, bool)):
                rules.append((prop, {"allOf": [{"required": [prop]}, need]}))
            else:
                return  # malformed: leave it to the backends to refuse
    if not rules or 2 ** len(rules) > _MAX_DEPENDENCY_PRODUCT:
        return
    for keyword in ("dependentRequired", "dependentSchemas", "dependencies"):
        node.pop(keyword, None)
    for prop, present in rules:
        _add_constraint(node, {"anyOf": [{"properties": {prop: False}}, present]})


# ---- not ------------------------------------------------------------------------------


def _rewrite_not(node: dict[str, Any]) -> None:
    if "not" not in node:
        return
    negated = node["not"]
    if negated is False or negated == {"not": True}:
        del node["not"]
    elif negated is True or negated == {}:
        node.pop("not")
        _add_constraint(node, False)
    elif isinstance(negated, dict) and set(negated) == {"required"} and _strings(negated["required"]):
        del node["not"]
        absent = [{"properties": {p: False}} for p in negated["required"]]
        _add_constraint(node, absent[0] if len(absent) == 1 else {"anyOf": absent})
    elif (
        isinstance(negated, dict)
        and set(negated) == {"pattern"}
        and "pattern" not in node
        and node.get("type", "string") in ("string", ["string"])
        and (outside := _outside_class(negated["pattern"])) is not None
    ):
        # Not a string of the class: a string (a pattern passes anything else, so "not"
        # fails it) that is empty or has a character outside it.
        del node["not"]
        node["type"] = "string"
        node["pattern"] = outside
    elif isinstance(negated, dict) and set(negated) == {"type"}:
        types = negated["type"] if isinstance(negated["type"], list) else [negated["type"]]
        if not _strings(types) or ("integer" in types and "number" not in types):
            return  # "not integer" leaves non-integral numbers: no positive form
        excluded = set(types) | ({"integer"} if "number" in types else set())
        del node["not"]
        _add_constraint(node, {"type": sorted(ALL_TYPES - excluded)} if ALL_TYPES - excluded else False)


def _outside_class(pattern: Any) -> str | None:
    """For a pattern ``^[S]+$`` or ``^[S]*$`` (whole strings of a character class), the
    pattern of the strings it does not match: empty (for ``+``) or with a character
    outside the class; ``None`` for any other pattern."""
    if not isinstance(pattern, str) or not pattern.startswith("^[") or pattern[2:3] in ("^", "]", ""):
        return None
    i = 2
    while i < len(pattern) and pattern[i] != "]":
        if pattern[i] == "[":
            return None
        i += 2 if pattern[i] == "\\" else 1
    body, rest = pattern[2:i], pattern[i + 1 :]
    if rest == "+$":
        return f"^$|[^{body}]"
    if rest == "*$":
        return f"[^{body}]"
    return None


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(x, str) for x in value)


# ---- finite value sets ----------------------------------------------------------------


def _narrow_finite(root: dict[str, Any], pristine: str, hard: frozenset[str]) -> bool:
    """Replace each outermost subschema with a finite value set by its valid members;
    ``pristine`` is ``root`` as JSON text (for the validator's ``$ref``s). Whether anything
    was replaced."""
    root_validator: Any = None
    refs: list[str] | None = None
    changed = False
    stack: list[tuple[Any, str]] = [(root, "")]
    while stack:
        node, pointer = stack.pop()
        if not isinstance(node, dict):
            continue
        found = _finite_values(node)
        if found is not None and (len(found[0]) > _MAX_NARROWED_VALUES or not _has_hard_keyword(node, hard)):
            found = None
        if found is not None:
            if refs is None:
                refs = _ref_targets(root)
            if any(r.startswith(pointer + "/") and not _in_definitions(r[len(pointer) :]) for r in refs):
                found = None  # a $ref points inside: replacing the node would break it
        if found is not None:
            values, rest = found
            try:
                if root_validator is None:
                    root_validator = _validator(json.loads(pristine))
                sub = root_validator.evolve(schema=rest)
                valid = [v for v in values if sub.is_valid(v)]
            except Exception:  # noqa: BLE001 - a validator error leaves the set as it is
                valid = None
            if valid is not None:
                keep = {
                    k: v
                    for k, v in node.items()
                    if k in ("$defs", "definitions", "$id", "$schema", "$anchor")
                }
                node.clear()
                node.update(keep)
                node["enum"] = valid
                changed = True
                continue
        stack.extend(children(node, pointer))
    return changed


#: Largest value set narrowed (each member is validated against the subschema).
_MAX_NARROWED_VALUES = 256


def _has_hard_keyword(node: dict[str, Any], hard: frozenset[str]) -> bool:
    return any(hard.intersection(sub) for sub, _ in subschemas(node))


def _validator(root: Any) -> Any:
    import jsonschema

    cls = jsonschema.validators.validator_for(root, default=jsonschema.Draft202012Validator)
    return cls(root)


def _finite_values(node: dict[str, Any]) -> tuple[list[Any], dict[str, Any]] | None:
    """The finite value set a subschema draws from, and the subschema without the
    keyword that gave it (every value satisfies that keyword by construction)."""
    if "const" in node:
        return [node["const"]], {k: v for k, v in node.items() if k != "const"}
    if isinstance(node.get("enum"), list):
        return list(node["enum"]), {k: v for k, v in node.items() if k != "enum"}
    branches = node.get("allOf")
    if not isinstance(branches, list):
        return None
    for i, branch in enumerate(branches):
        if isinstance(branch, dict) and not (set(branch) - {"enum", "const"} - NON_ASSERTIONS):
            found = _finite_values(branch)
            if found is not None:
                rest = dict(node)
                rest["allOf"] = [b for j, b in enumerate(branches) if j != i]
                if not rest["allOf"]:
                    del rest["allOf"]
                return found[0], rest
    return None


def _in_definitions(relative: str) -> bool:
    return relative.startswith(("/$defs/", "/definitions/"))


def _ref_targets(root: Any) -> list[str]:
    targets = []
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#"):
                targets.append(ref[1:])
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return targets


def _is_noop(keyword: str, value: Any) -> bool:
    if keyword == "uniqueItems":
        return value is False
    if keyword == "propertyNames":  # names checked by nothing but annotations
        return value is True or (
            isinstance(value, dict)
            and all(
                k in NON_ASSERTIONS and (k != "format" or v not in KNOWN_FORMATS) for k, v in value.items()
            )
        )
    if keyword in ("minItems", "minLength", "minProperties", "minContains"):
        return value == 0 and keyword != "minContains"
    return False
