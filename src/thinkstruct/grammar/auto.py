"""``backend="auto"``: which backend compiles which constraint.

The order comes from ``benchmarks/coverage.py`` (MaskBench sample, 129k vocabulary),
not from folklore: llguidance compiles in about a millisecond (xgrammar's median is
about a second) and refuses JSON Schema keywords it cannot enforce, so it goes first;
xgrammar masks faster per token but silently ignores several keywords and compiles
slowly, so it is tried only for schemas whose every keyword it enforces; outlines-core is
exact for a smaller set still and compiles slowest of all.

A backend is used for a JSON schema only if it enforces every assertion keyword in it
(see :data:`INEXACT`). In lenient mode (``strict=False``) a schema no backend enforces
exactly falls back to llguidance's lenient mode and then xgrammar, and the keywords they
skip are listed on the compiled grammar's ``ignored_keywords``; in strict mode it is
refused with those keywords and their JSON pointers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from thinkstruct.errors import UnsupportedConstraint
from thinkstruct.grammar.constraint import Constraint, ConstraintKind
from thinkstruct.grammar.schema_keywords import assertions, normalize

#: Assertion keywords each backend does not enforce (it refuses them or silently lets
#: invalid instances through). Measured by tests/grammar/test_conformance.py and the
#: probes in docs/keyword_support.md.
INEXACT: dict[str, frozenset[str]] = {
    "llguidance": frozenset(
        {
            "not", "uniqueItems", "contains", "minContains", "maxContains", "if", "then",
            "else", "dependentRequired", "dependentSchemas", "dependencies",
            "propertyNames", "unevaluatedProperties", "unevaluatedItems", "oneOf",
            "$dynamicRef", "$recursiveRef",
        }
    ),
    "xgrammar": frozenset(
        {
            "not", "uniqueItems", "contains", "minContains", "maxContains", "if", "then",
            "else", "dependentRequired", "dependentSchemas", "dependencies",
            "propertyNames", "unevaluatedProperties", "unevaluatedItems", "oneOf",
            "allOf", "$dynamicRef", "$recursiveRef", "multipleOf", "format",
            "minProperties", "maxProperties", "patternProperties",
        }
    ),
    "outlines": frozenset(
        {
            "not", "uniqueItems", "contains", "minContains", "maxContains", "if", "then",
            "else", "dependentRequired", "dependentSchemas", "dependencies",
            "propertyNames", "unevaluatedProperties", "unevaluatedItems", "oneOf",
            "allOf", "$dynamicRef", "$recursiveRef", "multipleOf", "format",
            "minProperties", "maxProperties", "patternProperties", "additionalProperties",
        }
    ),
}

#: Exact backends to try for JSON schemas, fastest time-to-first-mask first.
JSON_ORDER = ("llguidance", "xgrammar", "outlines")

#: Backends per other kind, in order of preference.
KIND_ORDER: dict[ConstraintKind, tuple[str, ...]] = {
    ConstraintKind.JSON_OBJECT: ("llguidance", "xgrammar"),
    ConstraintKind.REGEX: ("llguidance", "xgrammar", "outlines"),
    ConstraintKind.CHOICE: ("llguidance", "xgrammar", "outlines"),
    ConstraintKind.EBNF: ("llguidance", "xgrammar"),
    ConstraintKind.STRUCTURAL_TAG: ("xgrammar", "llguidance"),
}


@dataclass(frozen=True, slots=True)
class Candidate:
    """One attempt: a backend, its mode, the constraint it gets and what it will skip."""

    backend: str
    constraint: Constraint
    lenient: bool = False
    #: JSON pointers of keywords this attempt does not enforce (lenient fallbacks only).
    ignored: tuple[str, ...] = ()


def plan(constraint: Constraint, *, backend: str, strict: bool) -> list[Candidate]:
    """The backends to try for ``constraint``, in order.

    Raises:
        UnsupportedConstraint: ``strict`` and some keyword no backend enforces.
    """
    if backend != "auto":
        return [Candidate(backend, constraint)]
    if constraint.kind is not ConstraintKind.JSON_SCHEMA:
        return [Candidate(name, constraint) for name in KIND_ORDER[constraint.kind]]
    schema = normalize(constraint.document)
    rewritten = Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(schema, ensure_ascii=False, separators=(",", ":")))
    used = assertions(schema)
    exact = [
        Candidate(name, rewritten)
        for name in JSON_ORDER
        if not any(keyword in INEXACT[name] for keyword, _ in used)
    ]
    unenforceable = [
        (keyword, pointer)
        for keyword, pointer in used
        if all(keyword in INEXACT[name] for name in JSON_ORDER)
    ]
    if strict:
        if unenforceable:
            listed = ", ".join(f"{k} at {p}" for k, p in unenforceable)
            raise UnsupportedConstraint(
                f"no backend enforces these keywords exactly: {listed}",
                pointer=unenforceable[0][1],
                kind="json_schema",
            )
        return exact
    fallbacks = [
        Candidate(
            name,
            rewritten,
            lenient=name == "llguidance",
            ignored=tuple(p for k, p in used if k in INEXACT[name]),
        )
        for name in ("llguidance", "xgrammar")
        if any(keyword in INEXACT[name] for keyword, _ in used)
    ]
    return exact + fallbacks
