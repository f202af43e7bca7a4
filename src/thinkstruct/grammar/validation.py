"""thinkstruct's own checks of a constraint, run before any backend sees it.

Backends report bad input in their own words, some only as a C++/Rust message without a
location, and some not at all (a dangling ``$ref`` or ``minItems > maxItems`` can compile
to a grammar that never completes). These checks name the offending part: a JSON pointer
into a schema, a character offset into a regex.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any, Iterator
from urllib.parse import urldefrag, urljoin

from thinkstruct.errors import InvalidConstraint
from thinkstruct.grammar.constraint import Constraint, ConstraintKind, escape_pointer

JSON_TYPES = frozenset({"string", "number", "integer", "boolean", "object", "array", "null"})

# Keywords whose value is one subschema / a map of subschemas / a list of subschemas.
_SCHEMA_VALUED = (
    "additionalProperties", "contains", "not", "if", "then", "else", "propertyNames",
    "unevaluatedItems", "unevaluatedProperties", "additionalItems",
)
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")

# (lower keyword, upper keyword, strict): the schema is unsatisfiable if lower > upper
# (or lower >= upper when strict).
_BOUND_PAIRS = (
    ("minItems", "maxItems", False),
    ("minLength", "maxLength", False),
    ("minProperties", "maxProperties", False),
    ("minContains", "maxContains", False),
    ("minimum", "maximum", False),
    ("exclusiveMinimum", "exclusiveMaximum", True),
    ("minimum", "exclusiveMaximum", True),
    ("exclusiveMinimum", "maximum", True),
)
# The types each bound keyword applies to.
_BOUND_TYPES = {
    "minItems": {"array"}, "minContains": {"array"}, "minLength": {"string"},
    "minProperties": {"object"}, "minimum": {"number", "integer"},
    "exclusiveMinimum": {"number", "integer"},
}


def _confined_to(node: dict[str, Any], types: set[str]) -> bool:
    """Whether ``node``'s ``type`` admits only values of ``types``."""
    t = node.get("type")
    listed = t if isinstance(t, list) else [t]
    return bool(listed) and all(x in types for x in listed)


_COUNTS_SET = frozenset(
    {
        "minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties",
        "minContains", "maxContains",
    }
)
_NUMBERS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})
# A node using none of these has nothing _check_node would look at.
_CHECKED_KEYWORDS = (
    _COUNTS_SET
    | _NUMBERS
    | {"type", "pattern", "patternProperties", "required", "enum", "$ref", "$dynamicRef"}
    | set(_SCHEMA_MAPS)
    | set(_SCHEMA_LISTS)
)


def check_constraint(constraint: Constraint, *, max_answer_tokens: int | None = None) -> None:
    """Raise :class:`InvalidConstraint` naming the first problem found, else return.

    Args:
        max_answer_tokens: also refuse a schema whose shortest valid instance provably
            needs more tokens than this (the model's context length).
    """
    if constraint.kind is ConstraintKind.JSON_SCHEMA:
        check_json_schema(constraint.document)
    elif constraint.kind is ConstraintKind.REGEX:
        problem = regex_problem(constraint.value)
        if problem:
            raise InvalidConstraint(problem[1], position=problem[0], kind="regex")
    elif constraint.kind is ConstraintKind.STRUCTURAL_TAG:
        _check_structural_tag(constraint.document)


def check_json_schema(schema: Any) -> None:
    """Check a parsed JSON Schema document (see the module docstring)."""
    nodes = list(_walk(schema))
    ids, anchors = _collect_ids(nodes)
    for node, pointer, base in nodes:
        if isinstance(node, bool):
            continue
        if not isinstance(node, dict):
            raise InvalidConstraint(
                f"a schema must be an object or a boolean, got {_type_name(node)}",
                pointer=pointer,
                kind="json_schema",
            )
        if node.keys() & _CHECKED_KEYWORDS:
            _check_node(node, pointer, base, schema, ids, anchors)


def _check_node(
    node: dict[str, Any], pointer: str, base: str, root: Any, ids: dict[str, Any], anchors: set[str]
) -> None:
    def fail(keyword: str, reason: str) -> None:
        raise InvalidConstraint(reason, pointer=f"{pointer}/{escape_pointer(keyword)}", kind="json_schema")

    if "type" in node:
        types = node["type"]
        listed = types if isinstance(types, list) else [types]
        if not listed:
            fail("type", "type must not be an empty list")
        for t in listed:
            if not isinstance(t, str) or t not in JSON_TYPES:
                fail("type", f"unknown type {t!r}; JSON Schema types are {', '.join(sorted(JSON_TYPES))}")
    keys = node.keys()
    for keyword in sorted(keys & _COUNTS_SET):  # sorted: the same first error every run
        v = node[keyword]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or v != int(v):
            fail(keyword, f"{keyword} must be a non-negative integer, got {v!r}")
    for keyword in sorted(keys & _NUMBERS):
        v = node[keyword]
        # draft 4's boolean exclusiveMinimum/Maximum modifies minimum/maximum
        if keyword.startswith("exclusive") and isinstance(v, bool):
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            fail(keyword, f"{keyword} must be a number, got {v!r}")
    if "multipleOf" in node and node["multipleOf"] <= 0:
        fail("multipleOf", f"multipleOf must be greater than 0, got {node['multipleOf']!r}")
    for low, high, strict in _BOUND_PAIRS:
        if low not in keys or high not in keys or not _confined_to(node, _BOUND_TYPES[low]):
            continue  # other types of value satisfy the schema whatever the bounds
        lo, hi = node[low], node[high]
        if _is_number(lo) and _is_number(hi) and (lo >= hi if strict else lo > hi):
            fail(low, f"unsatisfiable: {low} {lo} {'≥' if strict else '>'} {high} {hi}")
    if "pattern" in node:
        if not isinstance(node["pattern"], str):
            fail("pattern", "pattern must be a string")
        _check_regex(node["pattern"], f"{pointer}/pattern", "invalid regex")
    if "patternProperties" in node and isinstance(node["patternProperties"], dict):
        for key in node["patternProperties"]:
            _check_regex(
                key,
                f"{pointer}/patternProperties/{escape_pointer(key)}",
                "invalid regex in a patternProperties key",
            )
    if "required" in node:
        req = node["required"]
        if not isinstance(req, list) or not all(isinstance(r, str) for r in req):
            fail("required", "required must be a list of property names")
    if "enum" in node and not isinstance(node["enum"], list):
        fail("enum", "enum must be a list")
    for keyword in _SCHEMA_MAPS:
        if keyword in node and not isinstance(node[keyword], dict):
            fail(keyword, f"{keyword} must be an object mapping names to schemas")
    for keyword in _SCHEMA_LISTS:
        if keyword in node and (not isinstance(node[keyword], list) or not node[keyword]):
            fail(keyword, f"{keyword} must be a non-empty list of schemas")
    for keyword in ("$ref", "$dynamicRef"):
        if keyword in node:
            ref = node[keyword]
            if not isinstance(ref, str):
                fail(keyword, f"{keyword} must be a string")
            if not _ref_resolves(ref, base, root, ids, anchors):
                fail(
                    keyword,
                    f"cannot resolve {keyword} {ref!r}: it points to nothing in this schema "
                    "(remote references are not fetched)",
                )


def _check_regex(pattern: str, pointer: str, what: str) -> None:
    problem = regex_problem(pattern)
    if problem:
        raise InvalidConstraint(
            f"{what}: {problem[1]}", pointer=pointer, position=problem[0], kind="json_schema"
        )


def _walk(schema: Any) -> Iterator[tuple[Any, str, str]]:
    """Every subschema with its JSON pointer and base URI, iteratively."""
    stack: list[tuple[Any, str, str]] = [(schema, "", "")]
    while stack:
        node, pointer, base = stack.pop()
        if isinstance(node, dict) and isinstance(node.get("$id"), str):
            base = urljoin(base, node["$id"])  # a resource's own $id is its refs' base
        yield node, pointer, base
        if not isinstance(node, dict):
            continue
        for keyword in _SCHEMA_VALUED:
            if keyword in node:
                stack.append((node[keyword], f"{pointer}/{keyword}", base))
        for keyword in _SCHEMA_MAPS:
            value = node.get(keyword)
            if isinstance(value, dict):
                for name, sub in value.items():
                    stack.append((sub, f"{pointer}/{keyword}/{escape_pointer(name)}", base))
        for keyword in _SCHEMA_LISTS:
            value = node.get(keyword)
            if isinstance(value, list):
                for i, sub in enumerate(value):
                    stack.append((sub, f"{pointer}/{keyword}/{i}", base))
        items = node.get("items")
        if isinstance(items, list):  # draft 7 tuple form
            for i, sub in enumerate(items):
                stack.append((sub, f"{pointer}/items/{i}", base))
        elif items is not None:
            stack.append((items, f"{pointer}/items", base))
        deps = node.get("dependencies")
        if isinstance(deps, dict):
            for name, sub in deps.items():
                if isinstance(sub, (dict, bool)):
                    stack.append((sub, f"{pointer}/dependencies/{escape_pointer(name)}", base))


def _collect_ids(nodes: list[tuple[Any, str, str]]) -> tuple[dict[str, Any], set[str]]:
    """Every resource by its absolute ``$id`` (without fragment), and every anchor name."""
    resources: dict[str, Any] = {}
    anchors: set[str] = set()
    for node, _, base in nodes:
        if isinstance(node, dict):
            if isinstance(node.get("$id"), str):
                target, frag = urldefrag(base)
                if target:
                    resources.setdefault(target, node)
                if frag and not frag.startswith("/"):
                    anchors.add(frag)  # draft 7's "$id": "#name"
            for key in ("$anchor", "$dynamicAnchor"):
                if isinstance(node.get(key), str):
                    anchors.add(node[key])
    return resources, anchors


def _ref_resolves(ref: str, base: str, root: Any, resources: dict[str, Any], anchors: set[str]) -> bool:
    target, fragment = urldefrag(urljoin(base, ref) if base else ref)
    if target:
        resource = resources.get(target)
        if resource is None:
            return False  # not a resource of this document: it would have to be fetched
    else:
        resource = root
    if not fragment:
        return True
    if fragment.startswith("/"):
        return _pointer_exists(resource, fragment)
    return fragment in anchors


def _pointer_exists(doc: Any, pointer: str) -> bool:
    from urllib.parse import unquote

    node = doc
    for raw in pointer.split("/")[1:]:
        token = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return False
    return True


def _check_structural_tag(tag: dict[str, Any]) -> None:
    if "structures" in tag or "triggers" in tag:
        structures = tag.get("structures")
        if not isinstance(structures, list) or not structures:
            raise InvalidConstraint(
                "structures must be a non-empty list", pointer="/structures", kind="structural_tag"
            )
        for i, s in enumerate(structures):
            for key in ("begin", "end"):
                if not isinstance(s, dict) or not isinstance(s.get(key), str):
                    raise InvalidConstraint(
                        f"each structure needs a string {key!r}",
                        pointer=f"/structures/{i}",
                        kind="structural_tag",
                    )
            if "schema" in s:
                try:
                    check_json_schema(s["schema"])
                except InvalidConstraint as e:
                    raise InvalidConstraint(
                        e.reason,
                        pointer=f"/structures/{i}/schema{e.pointer or ''}",
                        position=e.position,
                        kind="structural_tag",
                    ) from None
        triggers = tag.get("triggers")
        if not isinstance(triggers, list) or not triggers or not all(
            isinstance(t, str) and t for t in triggers
        ):
            raise InvalidConstraint(
                "triggers must be a non-empty list of non-empty strings",
                pointer="/triggers",
                kind="structural_tag",
            )
    elif not isinstance(tag.get("format"), dict):
        raise InvalidConstraint(
            "a structural tag needs either {structures, triggers} or a {format} object",
            pointer="",
            kind="structural_tag",
        )


_CARET = re.compile(r"^( *)\^+\s*$")


# Constructs Python's re accepts and the backends' regex engines do not (look-around,
# back-references, conditionals, possessive quantifiers): such patterns go to the
# backends' own parser.
_PYTHON_ONLY = re.compile(r"\(\?|\\[1-9]|[*+?}]\+")


@functools.lru_cache(maxsize=4096)
def regex_problem(pattern: str) -> tuple[int | None, str] | None:
    """``(position, message)`` if ``pattern`` is not a regex the backends can parse.

    Python's parser answers most patterns in tens of microseconds; the rest (those it
    refuses, and constructs only Python accepts) go to llguidance's Rust regex parser,
    which takes about a millisecond and also knows ``\\p{L}``-style classes.
    """
    if not _PYTHON_ONLY.search(pattern):
        try:
            re.compile(pattern)
            return None
        except (re.error, RecursionError, OverflowError):
            pass
    import llguidance

    message = llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_regex(pattern))
    if not message:
        return None
    lines = message.split("\n")
    position = None
    reason = "invalid regular expression"
    for line in lines:
        if line.startswith("error: "):
            reason = line[len("error: "):].strip()
            break
    for i, line in enumerate(lines[:-1]):
        if "regex parse error" in line:
            caret = _CARET.match(lines[i + 2]) if i + 2 < len(lines) else None
            if caret:  # the pattern is printed indented by 4 spaces, carets under it
                position = max(len(caret.group(1)) - 4, 0)
            break
    return position, reason


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _type_name(v: Any) -> str:
    return {list: "array", str: "string", int: "number", float: "number", type(None): "null"}.get(
        type(v), type(v).__name__
    )
