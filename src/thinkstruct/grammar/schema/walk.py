"""One walker over a JSON Schema's subschemas, with their JSON pointers.

Everything in thinkstruct that reads a schema (the checks in :mod:`.validation`, the
keyword scan and rewrites in :mod:`.keywords`, the instance bounds in
:mod:`.instances`, backend pre-checks) finds subschemas here, so they agree on
which keywords hold schemas and on how pointers are written and read. Walks are
iterative: a hostile document cannot exhaust the Python stack.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote, urljoin

from thinkstruct.grammar.constraint import escape_pointer

#: The JSON Schema type names.
JSON_TYPES = frozenset({"string", "number", "integer", "boolean", "object", "array", "null"})

#: Keywords whose value is one subschema (``items`` may also be a list: draft 7's tuples).
SCHEMA_VALUED = (
    "additionalProperties", "contains", "not", "if", "then", "else", "propertyNames",
    "unevaluatedItems", "unevaluatedProperties", "additionalItems", "items",
)  # fmt: skip
#: Keywords whose value maps names to subschemas (``dependencies`` also holds name lists).
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies")
#: Keywords whose value is a list of subschemas.
SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")

#: Returned by :func:`resolve` for a pointer that leads nowhere.
MISSING = object()


#: Every keyword that holds subschemas: most nodes have none (``{"type": "string"}``).
_HOLDERS = frozenset(SCHEMA_VALUED + SCHEMA_MAPS + SCHEMA_LISTS)


def children(node: dict[str, Any], pointer: str) -> Iterator[tuple[Any, str]]:
    """The direct subschemas of ``node`` (any JSON value where a schema is expected, so a
    checker can refuse what is not one), with their pointers."""
    if _HOLDERS.isdisjoint(node):
        return
    for keyword in SCHEMA_VALUED:
        if keyword in node and not (keyword == "items" and isinstance(node[keyword], list)):
            yield node[keyword], f"{pointer}/{keyword}"
    for keyword in SCHEMA_MAPS:
        value = node.get(keyword)
        if isinstance(value, dict):
            for name, sub in value.items():
                if keyword == "dependencies" and not isinstance(sub, (dict, bool)):
                    continue  # the property-list form: names, not a schema
                yield sub, f"{pointer}/{keyword}/{escape_pointer(name)}"
    for keyword in SCHEMA_LISTS:
        value = node.get(keyword)
        if isinstance(value, list):
            for i, sub in enumerate(value):
                yield sub, f"{pointer}/{keyword}/{i}"


def walk(schema: Any) -> Iterator[tuple[Any, str, str]]:
    """Every subschema (the root first) with its JSON pointer and base URI (``$id``s
    joined from the root down, ``""`` when none)."""
    stack: list[tuple[Any, str, str]] = [(schema, "", "")]
    while stack:
        node, pointer, base = stack.pop()
        if isinstance(node, dict) and isinstance(node.get("$id"), str):
            base = urljoin(base, node["$id"])  # a resource's own $id is its refs' base
        yield node, pointer, base
        if isinstance(node, dict):
            stack.extend((child, child_pointer, base) for child, child_pointer in children(node, pointer))


def subschemas(schema: Any) -> Iterator[tuple[dict[str, Any], str]]:
    """Every object subschema (boolean ones left out) with its JSON pointer."""
    stack: list[tuple[Any, str]] = [(schema, "")]
    while stack:
        node, pointer = stack.pop()
        if isinstance(node, dict):
            yield node, pointer
            stack.extend(children(node, pointer))


def decode_token(raw: str) -> str:
    """One reference token of a JSON pointer taken from a URI fragment (``%25`` decoded,
    then ``~1`` and ``~0``, RFC 6901)."""
    return unquote(raw).replace("~1", "/").replace("~0", "~")


def resolve(doc: Any, pointer: str) -> Any:
    """The value at ``pointer`` (``"/$defs/a"``, ``""`` for the whole) in ``doc``, or
    :data:`MISSING`."""
    node = doc
    if not pointer:
        return node
    for raw in pointer.split("/")[1:]:
        token = decode_token(raw)
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return MISSING
    return node


def local_ref(schema: Any, root: Any) -> tuple[Any, str] | None:
    """``(target, pointer)`` of a schema's ``$ref`` when it is a JSON pointer into
    ``root`` (``"#"`` or ``"#/..."``) that resolves; ``None`` otherwise."""
    ref = schema.get("$ref") if isinstance(schema, dict) else None
    if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
        return None
    target = resolve(root, ref[1:])
    return None if target is MISSING else (target, ref[1:])


#: Keywords that say nothing about which values a schema takes.
ANNOTATIONS = frozenset({"description", "title", "$comment"})


def follow_bare_ref(schema: Any, root: Any, *, annotations_allowed: bool = False) -> Any:
    """What a bare ``$ref`` in ``root`` points to, followed up to 32 times. A ``$ref`` is
    bare without sibling keywords (with ``annotations_allowed``, :data:`ANNOTATIONS` may
    stand beside it); a schema that is not one, or whose ``$ref`` does not resolve, is
    returned as it is."""
    allowed = {"$ref", *ANNOTATIONS} if annotations_allowed else {"$ref"}
    for _ in range(32):
        if not isinstance(schema, dict) or "$ref" not in schema or set(schema) - allowed:
            return schema
        found = local_ref(schema, root)
        if found is None:
            return schema
        schema = found[0]
    return schema
