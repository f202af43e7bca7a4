"""``backend="auto"``: which backend compiles which constraint.

The order (each backend's declared ``rank``) comes from ``benchmarks/coverage.py``
(MaskBench sample, 129k vocabulary), not from folklore: llguidance compiles in about a millisecond (xgrammar's median is
about a second) and refuses JSON Schema keywords it cannot enforce, so it goes first;
xgrammar masks faster per token but silently ignores several keywords and compiles
slowly, so it is tried only for schemas whose every keyword it enforces; outlines-core is
exact for a smaller set still and compiles slowest of all.

A backend is used for a JSON schema as exact only if it enforces every assertion keyword
in it (see :data:`INEXACT`). A schema no backend enforces exactly falls back to
llguidance's lenient mode and then xgrammar (where it is typed throughout), whose grammars
hold the answer to a superset of the schema. In strict mode (``strict=True``) the keywords
they skip are *checked*: the candidate carries a
:class:`~thinkstruct.grammar.schema.checks.CheckPlan` (what to validate where as each
value closes, :mod:`thinkstruct.grammar.runtime.value_checks`). In lenient mode they are
ignored and listed on the compiled grammar's ``ignored_keywords``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

from thinkstruct.errors import UnsupportedConstraint
from thinkstruct.grammar.backends import backend_classes
from thinkstruct.grammar.constraint import Constraint, ConstraintKind, escape_pointer
from thinkstruct.grammar.schema.checks import CheckPlan, plan_checks
from thinkstruct.grammar.schema.keywords import assertions, normalize
from thinkstruct.grammar.schema.relaxations import has_unparseable_patterns, relax
from thinkstruct.grammar.schema.tag_checks import TagChecks, plan_tag_checks
from thinkstruct.grammar.schema.walk import subschemas

# Every table below is derived from the backends' own declarations (the registry in
# thinkstruct.grammar.backends), which are measured by tests/grammar/test_conformance.py
# and the probes in docs/keyword_support.md.

#: Assertion keywords each backend does not enforce (it refuses them or silently lets
#: invalid instances through).
INEXACT: dict[str, frozenset[str]] = {cls.name: cls.inexact_keywords for cls in backend_classes()}

#: Keywords some backend cannot enforce directly (schema rewrites only pay off under them).
HARD_KEYWORDS: frozenset[str] = frozenset().union(*INEXACT.values())


def _order(kind: ConstraintKind) -> tuple[str, ...]:
    ranked = [
        (cls.rank[kind], cls.name) for cls in backend_classes() if kind in cls.kinds and kind in cls.rank
    ]
    return tuple(name for _, name in sorted(ranked))


#: Exact backends to try for JSON schemas, fastest time-to-first-mask first.
JSON_ORDER = _order(ConstraintKind.JSON_SCHEMA)

#: Backends per other kind, in order of preference.
KIND_ORDER: dict[ConstraintKind, tuple[str, ...]] = {
    kind: _order(kind) for kind in ConstraintKind if kind is not ConstraintKind.JSON_SCHEMA
}

#: Backends that may compile a schema they do not enforce exactly (its other keywords
#: ignored in lenient mode, checked in strict mode): with a lenient mode, or ignoring such
#: keywords by themselves.
LENIENT_ORDER = tuple(
    name
    for name in JSON_ORDER
    if (cls := next(c for c in backend_classes() if c.name == name)).lenient_mode or cls.ignores_inexact
)
_HAS_LENIENT_MODE = frozenset(cls.name for cls in backend_classes() if cls.lenient_mode)


@dataclass(frozen=True, slots=True)
class Candidate:
    """One attempt: a backend, its mode, the constraint it gets and what its grammar skips."""

    backend: str
    constraint: Constraint
    lenient: bool = False
    #: JSON pointers of keywords this attempt does not enforce (lenient fallbacks only).
    ignored: tuple[str, ...] = ()
    #: What is checked as values close, for the keywords its grammar skips (strict
    #: fallbacks only).
    checks: CheckPlan | TagChecks | None = None


def plan(constraint: Constraint, *, backend: str, strict: bool) -> Iterator[Candidate]:
    """The backends to try for ``constraint``, in order, worked out lazily: the common
    case (llguidance enforces the schema as it is) costs a scan of the schema text.

    In strict mode the fallbacks whose grammars skip keywords carry the checks of those
    keywords; in lenient mode they list them as ignored.
    """
    if backend != "auto":
        yield from _named(constraint, name=backend, strict=strict)
        return
    if constraint.kind is ConstraintKind.STRUCTURAL_TAG:
        yield from _tag_candidates(constraint, strict=strict)
        return
    if constraint.kind is not ConstraintKind.JSON_SCHEMA:
        for name in KIND_ORDER[constraint.kind]:
            yield Candidate(name, constraint)
        return
    first = JSON_ORDER[0]
    if not _mentions(constraint.value, _REWRITE_TRIGGERS | INEXACT[first]):
        yield Candidate(first, constraint)  # nothing to rewrite, nothing inexact
        used = assertions(constraint.document)
        rewritten = constraint
    else:
        schema = normalize(constraint.document, hard_keywords=HARD_KEYWORDS, text=constraint.value)
        rewritten = (
            constraint  # nothing rewritten: keep its parsed document
            if schema == constraint.document
            else Constraint(
                ConstraintKind.JSON_SCHEMA, json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
            )
        )
        used = assertions(schema)
        if not any(keyword in INEXACT[first] for keyword, _ in used):
            yield Candidate(first, rewritten)
    if strict and has_unparseable_patterns(rewritten.document):
        # No grammar runs these patterns (look-around...): only the relaxed fallbacks,
        # which check them, may hold this schema.
        yield from _relaxed(rewritten.document, lenient_mode=True)
        yield from _relaxed(rewritten.document, lenient_mode=False)
        return
    for name in JSON_ORDER[1:]:
        if not any(keyword in INEXACT[name] for keyword, _ in used) and _typed_throughout(rewritten.document):
            yield Candidate(name, rewritten)
    if not strict:
        for name in LENIENT_ORDER:
            ignored = tuple(p for k, p in used if k in INEXACT[name])
            if ignored:
                yield Candidate(name, rewritten, lenient=name in _HAS_LENIENT_MODE, ignored=ignored)
        return
    # Strict: the cheap in-process lenient compiles first (a backend compiling in a
    # worker may take the rest of the deadline), the schema as it is before its relaxation.
    for name in sorted(LENIENT_ORDER, key=lambda n: n not in _HAS_LENIENT_MODE):
        if any(k in INEXACT[name] for k, _ in used) and (
            name in _HAS_LENIENT_MODE or _typed_throughout(rewritten.document)
        ):
            # A backend that ignores keywords by itself guesses types where they are
            # missing (see _typed_throughout): checked this way only where it does not.
            checks = plan_checks(rewritten.document, inexact=INEXACT[name])
            if checks.runnable:
                yield Candidate(name, rewritten, lenient=name in _HAS_LENIENT_MODE, checks=checks)
        if name in _HAS_LENIENT_MODE:
            yield from _relaxed(rewritten.document, lenient_mode=True)
    yield from _relaxed(rewritten.document, lenient_mode=False)


def _named(constraint: Constraint, *, name: str, strict: bool) -> Iterator[Candidate]:
    """A backend asked for by name. One that compiles a JSON schema's keywords it does not
    enforce as if they were not there (xgrammar: ``multipleOf`` on a number, ``format``,
    ``not`` ...) gets them checked as values close in strict mode and listed as ignored
    otherwise, as ``auto``'s fallbacks do; one that refuses them says so when it compiles.

    Raises:
        UnsupportedConstraint: strict mode, and a check cannot run (a pattern Python's
            regex engine does not take).
    """
    cls = next(c for c in backend_classes() if c.name == name)
    if constraint.kind is not ConstraintKind.JSON_SCHEMA or not cls.ignores_inexact:
        yield Candidate(name, constraint)
        return
    document = constraint.document
    if not strict:
        ignored = tuple(p for k, p in assertions(document) if k in INEXACT[name])
        yield Candidate(name, constraint, ignored=ignored)
        return
    # It also skips the keywords of subschemas without a type (see _typed_throughout).
    checks = plan_checks(document, inexact=INEXACT[name], relaxed=_untyped(document))
    if not checks.checks:
        yield Candidate(name, constraint)
    elif checks.runnable:
        yield Candidate(name, constraint, checks=checks)
    else:
        raise UnsupportedConstraint(
            f"the {name} backend does not enforce some keywords of this schema, and their "
            "checks cannot run (a pattern Python's regex engine does not take)",
            kind=constraint.kind.value,
        )


def _tag_candidates(constraint: Constraint, *, strict: bool) -> Iterator[Candidate]:
    """The backends for a structural tag (a request's tool calls). A backend that ignores
    the keywords it does not enforce in the tag's schemas (xgrammar) takes it with them
    checked as each call's values close in strict mode (a
    :class:`~thinkstruct.grammar.schema.tag_checks.TagChecks`), ignored otherwise; one
    that refuses them (llguidance) only takes a tag without them.

    Raises:
        UnsupportedConstraint: strict mode, and some JSON needing checks cannot be
            checked (written in an XML-like style), naming its pointer.
    """
    problem: TagChecks | None = None
    for name in KIND_ORDER[ConstraintKind.STRUCTURAL_TAG]:
        cls = next(c for c in backend_classes() if c.name == name)
        tag = plan_tag_checks(
            constraint.document,
            inexact=INEXACT[name],
            # A backend guessing types skips keywords of untyped subschemas: checked too.
            relaxed=_untyped if strict and cls.ignores_inexact else lambda _: frozenset(),
        )
        if not tag.checked:
            yield Candidate(name, constraint)
        elif not cls.ignores_inexact:
            continue  # it would refuse them
        elif not strict:
            yield Candidate(name, constraint, ignored=tag.checked)
        elif tag.runnable:
            yield Candidate(name, constraint, checks=tag)
        else:
            problem = problem or tag
    if problem is not None:
        raise UnsupportedConstraint(
            problem.problem or "a check of the tag's schemas cannot run",
            pointer=problem.problem_at,
            kind=constraint.kind.value,
        )


def _untyped(schema: object) -> frozenset[str]:
    return frozenset(untyped_keywords(schema))


def _relaxed(schema: object, *, lenient_mode: bool) -> Iterator[Candidate]:
    """Strict mode's last resorts: the backends with a lenient mode on the schema without
    what their grammars cannot take (:func:`~thinkstruct.grammar.schema.relaxations.relax`),
    or those that guess types, on a schema not typed throughout; what is left out or
    skipped is checked against the schema as written."""
    relaxed_schema, removed = relax(schema)
    relaxed = (
        None
        if relaxed_schema == schema
        else Constraint(
            ConstraintKind.JSON_SCHEMA, json.dumps(relaxed_schema, ensure_ascii=False, separators=(",", ":"))
        )
    )
    for name in LENIENT_ORDER:
        if (name in _HAS_LENIENT_MODE) != lenient_mode:
            continue
        if lenient_mode:
            if relaxed is not None:
                checks = plan_checks(schema, inexact=INEXACT[name], relaxed=removed)
                if checks.runnable:
                    yield Candidate(name, relaxed, lenient=True, checks=checks)
            continue
        target = relaxed_schema if relaxed is not None else schema
        untyped = frozenset(untyped_keywords(target))
        if untyped or relaxed is not None:
            checks = plan_checks(schema, inexact=INEXACT[name], relaxed=removed | untyped)
            if not checks.runnable:
                continue
            constraint = relaxed or Constraint(
                ConstraintKind.JSON_SCHEMA, json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
            )
            yield Candidate(name, constraint, checks=checks)


# Keywords that apply to one type of value only.
_TYPED_KEYWORDS = frozenset(
    {
        "minLength",
        "maxLength",
        "pattern",
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "items",
        "prefixItems",
        "minItems",
        "maxItems",
        "contains",
        "uniqueItems",
        "properties",
        "required",
        "additionalProperties",
        "patternProperties",
        "minProperties",
        "maxProperties",
        "propertyNames",
    }
)


def _typed_throughout(schema: object) -> bool:
    """Whether every subschema using a type-specific keyword declares its ``type``, every
    ``required`` name is in ``properties``, and every ``$ref`` is a JSON pointer.

    xgrammar guesses one type where ``type`` is missing and then ignores the keywords of
    the others (``{"maxLength": 2}`` accepts ``"abc"``), and ignores ``required`` names
    missing from ``properties``; outlines-core refuses most untyped schemas. Only schemas
    passing this check may go to them as exact.
    """
    return next(untyped_keywords(schema), None) is None


def untyped_keywords(schema: object) -> Iterator[str]:
    """JSON pointers of the keywords that keep ``schema`` from being typed throughout
    (see :func:`_typed_throughout`): what a backend that guesses types may skip."""
    for node, pointer in subschemas(schema):
        keys = node.keys()
        if "type" not in keys:
            for keyword in sorted(keys & _TYPED_KEYWORDS):
                yield f"{pointer}/{escape_pointer(keyword)}"
        required = node.get("required")
        if required and not set(required) <= set(node.get("properties") or {}):
            yield f"{pointer}/required"
        ref = node.get("$ref")
        if isinstance(ref, str) and ref != "#" and not ref.startswith("#/"):
            yield f"{pointer}/$ref"  # xgrammar lets anchor references ("#name") through unchecked


# Besides llguidance's inexact keywords, what normalize() must see to help llguidance
# (unknown formats, which llguidance refuses).
_REWRITE_TRIGGERS = frozenset({"format", "$dynamicAnchor"})


def _mentions(text: str, keywords: frozenset[str]) -> bool:
    """Whether the schema text may use any of ``keywords`` (as a key; false positives
    only cost the slower path)."""
    return any(f'"{k}":' in text for k in keywords)
