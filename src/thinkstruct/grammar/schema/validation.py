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
from typing import Any
from urllib.parse import urldefrag, urljoin

from thinkstruct.errors import InvalidConstraint
from thinkstruct.grammar.constraint import Constraint, ConstraintKind, escape_pointer
from thinkstruct.grammar.schema.walk import JSON_TYPES, MISSING, SCHEMA_MAPS, resolve, walk

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
}  # fmt: skip

_COUNTS = frozenset(
    {
        "minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties",
        "minContains", "maxContains",
    }
)  # fmt: skip
_NUMBERS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})


class _Node:
    """One subschema being checked, and how to name its keywords in errors."""

    __slots__ = ("anchors", "base", "ids", "node", "pointer", "python_patterns", "root")

    def __init__(
        self,
        node: dict[str, Any],
        pointer: str,
        base: str,
        root: Any,
        ids: dict[str, Any],
        anchors: set[str],
        *,
        python_patterns: bool,
    ) -> None:
        self.node, self.pointer, self.base = node, pointer, base
        self.root, self.ids, self.anchors = root, ids, anchors
        self.python_patterns = python_patterns

    def fail(self, keyword: str, reason: str, *, position: int | None = None) -> None:
        raise InvalidConstraint(
            reason, pointer=f"{self.pointer}/{escape_pointer(keyword)}", position=position, kind="json_schema"
        )


def _check_type(n: _Node) -> None:
    types = n.node["type"]
    listed = types if isinstance(types, list) else [types]
    if not listed:
        n.fail("type", "type must not be an empty list")
    for t in listed:
        if not isinstance(t, str) or t not in JSON_TYPES:
            n.fail("type", f"unknown type {t!r}; JSON Schema types are {', '.join(sorted(JSON_TYPES))}")


def _check_counts(n: _Node) -> None:
    for keyword in sorted(n.node.keys() & _COUNTS):  # sorted: the same first error every run
        v = n.node[keyword]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or v != int(v):
            n.fail(keyword, f"{keyword} must be a non-negative integer, got {v!r}")


def _check_numbers(n: _Node) -> None:
    for keyword in sorted(n.node.keys() & _NUMBERS):
        v = n.node[keyword]
        # draft 4's boolean exclusiveMinimum/Maximum modifies minimum/maximum
        if keyword.startswith("exclusive") and isinstance(v, bool):
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            n.fail(keyword, f"{keyword} must be a number, got {v!r}")
    if "multipleOf" in n.node and n.node["multipleOf"] <= 0:
        n.fail("multipleOf", f"multipleOf must be greater than 0, got {n.node['multipleOf']!r}")


def _check_bounds(n: _Node) -> None:
    node = n.node
    for low, high, strict in _BOUND_PAIRS:
        if low not in node or high not in node or not _confined_to(node, _BOUND_TYPES[low]):
            continue  # other types of value satisfy the schema whatever the bounds
        lo, hi = node[low], node[high]
        if _is_number(lo) and _is_number(hi) and (lo >= hi if strict else lo > hi):
            n.fail(low, f"unsatisfiable: {low} {lo} {'≥' if strict else '>'} {high} {hi}")


def _check_patterns(n: _Node) -> None:
    node = n.node
    if "pattern" in node:
        if not isinstance(node["pattern"], str):
            n.fail("pattern", "pattern must be a string")
        _check_regex(node["pattern"], f"{n.pointer}/pattern", "invalid regex", python=n.python_patterns)
    if isinstance(node.get("patternProperties"), dict):
        for key in node["patternProperties"]:
            _check_regex(
                key,
                f"{n.pointer}/patternProperties/{escape_pointer(key)}",
                "invalid regex in a patternProperties key",
                python=n.python_patterns,
            )


def _check_shapes(n: _Node) -> None:
    node = n.node
    if "required" in node:
        req = node["required"]
        if not isinstance(req, list) or not all(isinstance(r, str) for r in req):
            n.fail("required", "required must be a list of property names")
    if "enum" in node and not isinstance(node["enum"], list):
        n.fail("enum", "enum must be a list")
    for keyword in SCHEMA_MAPS:
        if keyword in node and not isinstance(node[keyword], dict):
            n.fail(keyword, f"{keyword} must be an object mapping names to schemas")
    for keyword in ("allOf", "anyOf", "oneOf", "prefixItems"):
        if keyword in node and (not isinstance(node[keyword], list) or not node[keyword]):
            n.fail(keyword, f"{keyword} must be a non-empty list of schemas")


def _check_refs(n: _Node) -> None:
    for keyword in ("$ref", "$dynamicRef"):
        if keyword in n.node:
            ref = n.node[keyword]
            if not isinstance(ref, str):
                n.fail(keyword, f"{keyword} must be a string")
            if not _ref_resolves(ref, n.base, n.root, n.ids, n.anchors):
                n.fail(
                    keyword,
                    f"cannot resolve {keyword} {ref!r}: it points to nothing in this schema "
                    "(remote references are not fetched)",
                )


#: One checker per keyword group, run on a node that uses any of the group's keywords.
_CHECKERS: tuple[tuple[frozenset[str], Any], ...] = (
    (frozenset({"type"}), _check_type),
    (_COUNTS, _check_counts),
    (_NUMBERS, _check_numbers),
    (frozenset(low for low, _, _ in _BOUND_PAIRS), _check_bounds),
    (frozenset({"pattern", "patternProperties"}), _check_patterns),
    (frozenset({"required", "enum", "allOf", "anyOf", "oneOf", "prefixItems", *SCHEMA_MAPS}), _check_shapes),
    (frozenset({"$ref", "$dynamicRef"}), _check_refs),
)
_CHECKED = frozenset().union(*(keys for keys, _ in _CHECKERS))


def _confined_to(node: dict[str, Any], types: set[str]) -> bool:
    """Whether ``node``'s ``type`` admits only values of ``types``."""
    t = node.get("type")
    listed = t if isinstance(t, list) else [t]
    return bool(listed) and all(x in types for x in listed)


def check_constraint(
    constraint: Constraint, *, max_answer_tokens: int | None = None, python_patterns: bool = False
) -> None:
    """Raise :class:`InvalidConstraint` naming the first problem found, else return.

    Args:
        max_answer_tokens: also refuse a schema whose shortest valid instance provably
            needs more tokens than this (the model's context length).
        python_patterns: take a schema's patterns that only the reference validator's
            regex engine runs (look-around, back-references): strict ``auto`` checks them
            as values close rather than in the grammar.
    """
    if constraint.kind is ConstraintKind.JSON_SCHEMA:
        check_json_schema(constraint.document, python_patterns=python_patterns)
        check_instances_exist(constraint.document, max_answer_tokens=max_answer_tokens, text=constraint.value)
    elif constraint.kind is ConstraintKind.REGEX:
        problem = regex_problem(constraint.value)
        if problem:
            raise InvalidConstraint(problem[1], position=problem[0], kind="regex")
    elif constraint.kind is ConstraintKind.STRUCTURAL_TAG:
        _check_structural_tag(constraint.document)


def check_json_schema(schema: Any, *, python_patterns: bool = False) -> None:
    """Check a parsed JSON Schema document (see the module docstring and
    :func:`check_constraint` for ``python_patterns``)."""
    nodes = list(walk(schema))
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
        keys = node.keys() & _CHECKED
        if keys:
            checked = _Node(node, pointer, base, schema, ids, anchors, python_patterns=python_patterns)
            for group, checker in _CHECKERS:
                if not group.isdisjoint(keys):
                    checker(checked)


def check_instances_exist(
    schema: Any, *, max_answer_tokens: int | None = None, text: str | None = None
) -> None:
    """Refuse a schema no finite answer satisfies (``{"$ref": "#"}``, a recursion without
    a base case), or whose shortest instance needs more than ``max_answer_tokens`` tokens
    (counted generously: every token as long as the longest in any vocabulary)."""
    from thinkstruct.grammar.schema.instances import shortest_instance

    length, pointer = shortest_instance(schema, text)
    if length is None:
        raise InvalidConstraint(
            f"schema has no finite instance at {pointer or '/'} (a recursion without a base case, "
            "or a subschema nothing satisfies)",
            pointer=pointer,
            kind="json_schema",
        )
    if max_answer_tokens is not None and length > max_answer_tokens * MAX_TOKEN_CHARS:
        raise InvalidConstraint(
            f"the shortest valid instance is at least {length:,} characters long: more than "
            f"{max_answer_tokens:,} tokens can hold",
            pointer=pointer,
            kind="json_schema",
        )


#: Characters one token stands for at most, generously (the longest tokens of the 129k
#: DeepSeek-V4 vocabulary are runs of 128 spaces or punctuation).
MAX_TOKEN_CHARS = 256


def _check_regex(pattern: str, pointer: str, what: str, *, python: bool) -> None:
    problem = regex_problem(pattern)
    if problem and python and _python_compiles(pattern):
        return
    if problem:
        raise InvalidConstraint(
            f"{what}: {problem[1]}", pointer=pointer, position=problem[0], kind="json_schema"
        )


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
        return resolve(resource, fragment) is not MISSING
    return fragment in anchors


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
        if (
            not isinstance(triggers, list)
            or not triggers
            or not all(isinstance(t, str) and t for t in triggers)
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
            reason = line[len("error: ") :].strip()
            break
    for i, line in enumerate(lines[:-1]):
        if "regex parse error" in line:
            caret = _CARET.match(lines[i + 2]) if i + 2 < len(lines) else None
            if caret:  # the pattern is printed indented by 4 spaces, carets under it
                position = max(len(caret.group(1)) - 4, 0)
            break
    return position, reason


def _python_compiles(pattern: str) -> bool:
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError):
        return False
    return True


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _type_name(v: Any) -> str:
    return {list: "array", str: "string", int: "number", float: "number", type(None): "null"}.get(
        type(v), type(v).__name__
    )
