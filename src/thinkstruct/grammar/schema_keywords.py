"""What a JSON Schema asks of its instances: keyword scan and exact rewrites.

:func:`assertions` lists every assertion keyword a schema uses, with its JSON pointer,
so the backend choice can tell whether a backend would enforce all of it. :func:`normalize`
rewrites a schema into an equivalent one that more backends can compile exactly:

- ``format`` values no backend knows are dropped. In JSON Schema 2020-12 ``format`` is an
  annotation unless a format-assertion vocabulary is declared, so this changes nothing a
  validator would check.
- ``oneOf`` whose branches provably cannot both match (disjoint types, or different
  ``const``/``enum`` values of one required property) becomes ``anyOf``, which every
  backend enforces; overlapping ``oneOf`` stays and is reported as such.
- no-op assertions (``uniqueItems: false``, ``minItems: 0``, ``minLength: 0``,
  ``minProperties: 0``) are dropped.
"""

from __future__ import annotations

import copy
from typing import Any, Iterator

from thinkstruct.grammar.constraint import escape_pointer

#: Formats llguidance enforces (also known to xgrammar and outlines-core).
KNOWN_FORMATS = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uri", "uuid"}
)

# Keywords that assert nothing (annotations, identifiers, structure handled elsewhere).
_NON_ASSERTIONS = frozenset(
    {
        "$schema", "$id", "$anchor", "$dynamicAnchor", "$comment", "$vocabulary", "$defs",
        "definitions", "title", "description", "default", "examples", "deprecated",
        "readOnly", "writeOnly", "contentMediaType", "contentEncoding", "contentSchema",
        "format",
    }
)
_SUBSCHEMA = ("additionalProperties", "contains", "not", "if", "then", "else", "propertyNames",
              "unevaluatedItems", "unevaluatedProperties", "additionalItems", "items")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")


def assertions(schema: Any) -> list[tuple[str, str]]:
    """``(keyword, pointer)`` for every assertion keyword in ``schema`` and its subschemas.

    ``oneOf`` is reported as ``"oneOf"`` only where its branches may overlap (see
    :func:`normalize`); ``format`` is reported as ``"format"`` for known formats.
    """
    found: list[tuple[str, str]] = []
    for node, pointer in _subschemas(schema):
        for keyword, value in node.items():
            if keyword == "format":
                if value in KNOWN_FORMATS:
                    found.append(("format", f"{pointer}/format"))
            elif keyword not in _NON_ASSERTIONS and not _is_noop(keyword, value):
                found.append((keyword, f"{pointer}/{escape_pointer(keyword)}"))
    return found


def normalize(schema: Any) -> Any:
    """An equivalent schema that more backends compile exactly (see the module doc)."""
    if not isinstance(schema, dict):
        return schema
    out = copy.deepcopy(schema)
    for node, _ in _subschemas(out):
        fmt = node.get("format")
        if fmt is not None and fmt not in KNOWN_FORMATS:
            del node["format"]
        for keyword in [k for k, v in node.items() if _is_noop(k, v)]:
            del node[keyword]
        branches = node.get("oneOf")
        if isinstance(branches, list) and len(branches) > 1 and _pairwise_disjoint(branches, out):
            if "anyOf" in node:
                node.setdefault("allOf", []).append({"anyOf": node.pop("oneOf")})
            else:
                node["anyOf"] = node.pop("oneOf")
        elif isinstance(branches, list) and len(branches) == 1:
            node.setdefault("allOf", []).append(node.pop("oneOf")[0])
    return out


def _is_noop(keyword: str, value: Any) -> bool:
    if keyword == "uniqueItems":
        return value is False
    if keyword in ("minItems", "minLength", "minProperties", "minContains"):
        return value == 0 and keyword != "minContains"
    return False


def _subschemas(schema: Any) -> Iterator[tuple[dict[str, Any], str]]:
    stack: list[tuple[Any, str]] = [(schema, "")]
    while stack:
        node, pointer = stack.pop()
        if not isinstance(node, dict):
            continue
        yield node, pointer
        for keyword in _SUBSCHEMA:
            value = node.get(keyword)
            if isinstance(value, dict):
                stack.append((value, f"{pointer}/{keyword}"))
        for keyword in _SUBSCHEMA_MAPS:
            value = node.get(keyword)
            if isinstance(value, dict):
                for name, sub in value.items():
                    stack.append((sub, f"{pointer}/{keyword}/{escape_pointer(name)}"))
        for keyword in _SUBSCHEMA_LISTS:
            value = node.get(keyword)
            if isinstance(value, list):
                for i, sub in enumerate(value):
                    stack.append((sub, f"{pointer}/{keyword}/{i}"))
        deps = node.get("dependencies")
        if isinstance(deps, dict):
            for name, sub in deps.items():
                if isinstance(sub, dict):
                    stack.append((sub, f"{pointer}/dependencies/{escape_pointer(name)}"))


# ---- oneOf disjointness -----------------------------------------------------------------

_ALL_TYPES = frozenset({"string", "number", "integer", "boolean", "object", "array", "null"})


def _pairwise_disjoint(branches: list[Any], root: Any) -> bool:
    resolved = [_resolve(b, root) for b in branches]
    if any(not isinstance(b, dict) for b in resolved):
        return False
    types = [_types(b) for b in resolved]
    if all(t is not None for t in types):
        if all(not (types[i] & types[j]) for i in range(len(types)) for j in range(i + 1, len(types))):
            return True
    return _discriminated(resolved, root)


def _resolve(schema: Any, root: Any, depth: int = 0) -> Any:
    while isinstance(schema, dict) and isinstance(schema.get("$ref"), str) and depth < 16:
        ref = schema["$ref"]
        if not ref.startswith("#/") or len(schema) > 1:
            return schema
        node = root
        for raw in ref[2:].split("/"):
            token = raw.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or token not in node:
                return schema
            node = node[token]
        schema, depth = node, depth + 1
    return schema


def _types(schema: dict[str, Any]) -> frozenset[str] | None:
    """The JSON types a schema can match, where that is evident; ``None`` if unsure."""
    if "const" in schema:
        return frozenset({_type_of(schema["const"])})
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return frozenset(_type_of(v) for v in schema["enum"])
    t = schema.get("type")
    if isinstance(t, str):
        t = [t]
    if isinstance(t, list) and all(isinstance(x, str) for x in t):
        s = set(t)
        if "number" in s:
            s.add("integer")  # integers are numbers
        return frozenset(s)
    return None


def _type_of(value: Any) -> str:
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


def _discriminated(branches: list[dict[str, Any]], root: Any) -> bool:
    """Objects told apart by one required property with disjoint const/enum values."""
    candidates: set[str] | None = None
    for b in branches:
        required = b.get("required")
        props = b.get("properties")
        if not isinstance(required, list) or not isinstance(props, dict):
            return False
        keys = {k for k in required if isinstance(k, str) and k in props}
        candidates = keys if candidates is None else candidates & keys
    for prop in sorted(candidates or ()):
        value_sets: list[set[str]] = []
        for b in branches:
            sub = _resolve(b["properties"][prop], root)
            values = _literal_values(sub)
            if values is None:
                break
            value_sets.append(values)
        else:
            if all(
                not (value_sets[i] & value_sets[j])
                for i in range(len(value_sets))
                for j in range(i + 1, len(value_sets))
            ):
                return True
    return False


def _literal_values(schema: Any) -> set[str] | None:
    import json

    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return {json.dumps(schema["const"], sort_keys=True)}
    if isinstance(schema.get("enum"), list):
        return {json.dumps(v, sort_keys=True) for v in schema["enum"]}
    return None
