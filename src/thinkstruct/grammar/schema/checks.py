"""Checked keywords: what a backend's grammar enforces, and what is checked as values close.

No grammar library enforces all of JSON Schema (``uniqueItems``, ``not``, ``if``...: the
backends' ``inexact_keywords``). :func:`plan_checks` splits a schema for one backend:
every assertion keyword (:func:`~.keywords.assertions`) the backend enforces is
``"grammar"``; every other one is ``"checked"``: a :class:`ValueCheck` says which
subschema the value at which instance location must satisfy, validated by ``jsonschema``
(format checker on) when that value closes (see
:mod:`thinkstruct.grammar.runtime.value_checks`).

Where a check sits. A keyword applies to a value the schema reaches *unconditionally*
from the root through ``properties``, ``items``, ``prefixItems``, ``additionalProperties``
(on an object with nothing else naming its properties), ``allOf`` and local ``$ref``s; a
keyword found there is checked by validating that subschema at that location (a
*pattern* when it passes ``items``: "every item of /tags"). A keyword inside a
conditional applicator (``anyOf``, ``oneOf``, ``not``, ``if``, ``contains``,
``patternProperties``...) is checked at the deepest such value above it, with the whole
subschema there, which decides the condition too. Recursion (a ``$ref`` back into its own
chain) is checked at the first value the recursive subschema applies to, which covers
every level below; schemas that resolve references in ways this walk does not follow
(embedded ``$id`` resources, ``$dynamicRef``, anchors) are checked as a whole document.
A check validates a whole subschema, so it may also re-check what the grammar enforced:
never wrong, only a little more work.
"""

from __future__ import annotations

import contextlib
import enum
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from thinkstruct.errors import InvalidConstraint
from thinkstruct.grammar.constraint import escape_pointer
from thinkstruct.grammar.schema.keywords import assertions
from thinkstruct.grammar.schema.walk import children, decode_token, local_ref, subschemas

Enforcement = Literal["grammar", "checked", "ignored"]


class Wildcard(enum.Enum):
    """A location step that matches many values."""

    #: Every item of an array.
    ITEM = "item"
    #: Every property value of an object.
    PROPERTY = "property"


#: A step of an instance location: a property name, an array index, or a wildcard.
Step = str | int | Wildcard
#: An instance location (pattern): the steps from the root value.
Location = tuple[Step, ...]


def location_text(location: Location) -> str:
    """``location`` as a JSON pointer, each wildcard step written ``*`` (``"/tags/*"``:
    every item of ``/tags``; ``""``: the whole answer)."""
    return "".join("/*" if isinstance(s, Wildcard) else f"/{escape_pointer(str(s))}" for s in location)


@dataclass(frozen=True, slots=True)
class KeywordEnforcement:
    """How one assertion keyword of a schema is enforced.

    Attributes:
        keyword: the keyword (``"uniqueItems"``).
        pointer: its JSON pointer in the schema the backend compiled (after ``auto``'s
            equivalent rewrites).
        enforcement: ``"grammar"`` (the backend's grammar enforces it token by token),
            ``"checked"`` (validated as each value it applies to closes) or
            ``"ignored"`` (a lenient compile: nothing enforces it).
        location: for a checked keyword, where the check runs, as :func:`location_text`
            writes it.
    """

    keyword: str
    pointer: str
    enforcement: Enforcement
    location: str | None = None


@dataclass(frozen=True, slots=True)
class ValueCheck:
    """One check: the value at ``location`` must satisfy the subschema at ``schema_pointer``.

    Attributes:
        location: where the value is (a pattern when it has wildcard steps).
        schema_pointer: the subschema's JSON pointer (``""``: the whole schema).
        keywords: JSON pointers of the checked keywords this check covers.
    """

    location: Location
    schema_pointer: str
    keywords: tuple[str, ...]


@dataclass(frozen=True, eq=False)
class CheckPlan:
    """What is checked for one schema and one backend (shared, immutable).

    Attributes:
        schema: the schema checks resolve ``$ref``s against (the one compiled).
        checks: the value checks, in no particular order.
        enforcement: every assertion keyword of the schema and how it is enforced.
        runnable: the reference validator can run the checks: every regex of the schema
            is one Python's engine compiles (llguidance also takes Unicode property classes, which
            it does not).
    """

    schema: Any
    checks: tuple[ValueCheck, ...]
    enforcement: tuple[KeywordEnforcement, ...]
    runnable: bool = True
    _validators: dict[str | None, Any] = field(default_factory=dict, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def first_error(self, index: int, value: Any) -> Any:
        """The most relevant ``jsonschema.ValidationError`` of ``value`` against
        ``checks[index]``'s subschema (format checker on), or ``None`` if it is valid.

        Raises:
            InvalidConstraint: the reference validator cannot resolve a ``$ref`` this
                value leads to (the check cannot run), naming the subschema.
        """
        import jsonschema

        pointer = self.checks[index].schema_pointer
        with self._running(pointer):
            return jsonschema.exceptions.best_match(self._validator(pointer).iter_errors(value))

    def error_of(self, index: int, value: Any, keyword: str) -> Any:
        """The first error of ``value`` against ``checks[index]``'s subschema that its
        ``keyword`` reports about ``value`` itself, or ``None``.

        Raises:
            InvalidConstraint: as :meth:`first_error`.
        """
        pointer = self.checks[index].schema_pointer
        with self._running(pointer):
            errors = self._validator(pointer).iter_errors(value)
            return next((e for e in errors if e.validator == keyword and not e.absolute_path), None)

    def valid_at(self, pointer: str, value: Any) -> bool:
        """Whether ``value`` is valid against the subschema at ``pointer`` (one the plan's
        checks hold, such as a ``contains`` subschema).

        Raises:
            InvalidConstraint: as :meth:`first_error`.
        """
        with self._running(pointer):
            return bool(self._validator(pointer).is_valid(value))

    def subschema(self, pointer: str) -> Any:
        """The subschema at ``pointer`` (a plain JSON pointer the plan wrote)."""
        return _at(self.schema, pointer)

    @contextlib.contextmanager
    def _running(self, pointer: str) -> Iterator[None]:
        import referencing.exceptions  # type: ignore[import-not-found,unused-ignore]

        try:
            yield
        except (
            referencing.exceptions.Unresolvable,
            RecursionError,
            AttributeError,
            TypeError,
            re.error,
        ) as e:
            # The reference validator fails on what it cannot follow (or misreads: a
            # draft's form under another draft's rules): said, never taken as valid.
            raise InvalidConstraint(
                f"the check of the subschema at {pointer or '/'} cannot run: {e}",
                pointer=pointer,
                kind="json_schema",
            ) from None

    def _validator(self, pointer: str) -> Any:
        validator = self._validators.get(pointer)
        if validator is None:
            import jsonschema

            cls = jsonschema.validators.validator_for(self.schema, default=_default_dialect(self.schema))
            with self._lock:
                root = self._validators.get(None)
                if root is None:
                    root = self._validators[None] = cls(self.schema, format_checker=cls.FORMAT_CHECKER)
            validator = self._validators[pointer] = root.evolve(schema=_at(self.schema, pointer))
        return validator


def _default_dialect(schema: Any) -> Any:
    """The validator class for a schema without ``$schema``: draft 2020-12, unless it uses
    draft 7's forms (``items`` as a list, a ``"#name"`` ``$id``), which thinkstruct's walker
    also reads so."""
    import jsonschema

    for node, _ in subschemas(schema):
        if isinstance(node.get("items"), list) or str(node.get("$id", "")).startswith("#"):
            return jsonschema.Draft7Validator
    return jsonschema.Draft202012Validator


def plan_checks(schema: Any, *, inexact: frozenset[str], relaxed: frozenset[str] = frozenset()) -> CheckPlan:
    """Split ``schema``'s assertion keywords between a backend's grammar and value checks.

    Args:
        schema: the schema the answer must satisfy (auto's equivalent rewrite of it).
        inexact: the keywords the backend does not enforce exactly (its
            ``inexact_keywords``): each use of one becomes ``"checked"``.
        relaxed: JSON pointers of keywords left out of the schema the backend compiles
            (:func:`~.relaxations.relax`, keywords a guessing backend skips): they and
            every keyword inside them become ``"checked"`` too.
    """
    used = assertions(schema)
    checked = {pointer for keyword, pointer in used if keyword in inexact or _within(pointer, relaxed)}
    anchors: dict[tuple[str, Location], set[str]] = {}
    if checked:
        found = _anchors(schema, checked) if _walkable(schema) else None
        anchors = {("", ()): set(checked)} if found is None else found
    where: dict[str, Location] = {}
    for (_, location), keywords in sorted(anchors.items(), key=lambda a: len(a[0][1]), reverse=True):
        for pointer in keywords:
            where.setdefault(pointer, location)
    enforcement = tuple(
        KeywordEnforcement(keyword, pointer, "checked", location_text(where.get(pointer, ())))
        if pointer in checked
        else KeywordEnforcement(keyword, pointer, "grammar")
        for keyword, pointer in sorted(used, key=lambda u: u[1])
    )
    checks = tuple(
        ValueCheck(location, pointer, tuple(sorted(keywords)))
        for (pointer, location), keywords in sorted(anchors.items(), key=lambda a: (a[0][0], str(a[0][1])))
    )
    return CheckPlan(schema, checks, enforcement, runnable=not checks or _python_regexes(schema))


def _python_regexes(schema: Any) -> bool:
    """Whether Python's ``re`` compiles every ``pattern`` and ``patternProperties`` key."""
    for node, _ in subschemas(schema):
        patterns = [node.get("pattern"), *(node.get("patternProperties") or {})]
        for pattern in patterns:
            if isinstance(pattern, str):
                try:
                    re.compile(pattern)
                except (re.error, RecursionError, OverflowError):
                    return False
    return True


def _within(pointer: str, relaxed: frozenset[str]) -> bool:
    """Whether ``pointer`` is one of ``relaxed`` or inside one."""
    if not relaxed:
        return False
    cut = len(pointer)
    while cut > 0:
        if pointer[:cut] in relaxed:
            return True
        cut = pointer.rfind("/", 0, cut)
    return False


def _walkable(schema: Any) -> bool:
    """Whether every reference is a local JSON pointer resolved against the root (no
    embedded resources, dynamic references or anchors)."""
    for node, pointer in subschemas(schema):
        if pointer and "$id" in node:
            return False
        if "$dynamicRef" in node or "$recursiveRef" in node:
            return False
        ref = node.get("$ref")
        if ref is not None and not (isinstance(ref, str) and (ref == "#" or ref.startswith("#/"))):
            return False
    return True


#: Most (subschema, anchor) states the walk visits before checking the whole document.
_MAX_STATES = 20_000


def _anchors(schema: Any, checked: set[str]) -> dict[tuple[str, Location], set[str]] | None:
    """Checked keyword pointers by the (subschema pointer, location) whose check covers
    them, or ``None`` where the walk gives up (the caller checks the whole document)."""
    anchors: dict[tuple[str, Location], set[str]] = {}
    # (node, pointer, location, anchor, unconditional, chain of $ref targets -> location)
    stack: list[tuple[Any, str, Location, tuple[str, Location], bool, dict[str, Location]]] = [
        (schema, "", (), ("", ()), True, {"": ()})
    ]
    seen: set[tuple[str, tuple[str, Location]]] = set()
    while stack:
        node, pointer, location, anchor, unconditional, chain = stack.pop()
        if not isinstance(node, dict):
            continue
        if unconditional:
            anchor = (pointer, location)
        if (pointer, anchor) in seen:
            continue
        seen.add((pointer, anchor))
        if len(seen) > _MAX_STATES:
            return None
        for keyword in node:
            keyword_pointer = f"{pointer}/{escape_pointer(keyword)}"
            if keyword_pointer in checked:
                anchors.setdefault(anchor, set()).add(keyword_pointer)
        for child, child_pointer, child_location, still in _applied(node, pointer, location):
            stack.append((child, child_pointer, child_location, anchor, unconditional and still, chain))
        found = local_ref(node, schema)
        if found is None:
            continue
        target, fragment = found
        target_pointer = _plain(fragment)
        if target_pointer in chain:
            if unconditional:
                # Recursion: the subschema's first value covers every level below it.
                first = (target_pointer, chain[target_pointer])
                covered = _reachable_checked(target, target_pointer, schema, checked)
                if covered:
                    anchors.setdefault(first, set()).update(covered)
            continue
        stack.append(
            (target, target_pointer, location, anchor, unconditional, chain | {target_pointer: location})
        )
    return anchors


def _applied(
    node: dict[str, Any], pointer: str, location: Location
) -> Iterator[tuple[Any, str, Location, bool]]:
    """Each subschema of ``node`` that evaluation applies (definitions left out), with its
    pointer, the instance location it applies to and whether it applies unconditionally."""
    tuple_items = isinstance(node.get("items"), list)
    has_prefix = "prefixItems" in node or tuple_items
    names_properties = "properties" in node or "patternProperties" in node
    for child, child_pointer in children(node, pointer):
        relative = child_pointer[len(pointer) + 1 :].split("/")
        keyword = relative[0]
        if keyword in ("$defs", "definitions"):
            continue
        if keyword == "properties":
            yield child, child_pointer, (*location, _unescape(relative[1])), True
        elif keyword == "prefixItems" or (keyword == "items" and tuple_items):
            yield child, child_pointer, (*location, int(relative[1])), True
        elif keyword == "items" and not has_prefix:
            yield child, child_pointer, (*location, Wildcard.ITEM), True
        elif keyword == "additionalProperties" and not names_properties:
            yield child, child_pointer, (*location, Wildcard.PROPERTY), True
        elif keyword == "allOf":
            yield child, child_pointer, location, True
        else:
            yield child, child_pointer, location, False


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _reachable_checked(node: Any, pointer: str, root: Any, checked: set[str]) -> set[str]:
    """The checked keyword pointers evaluation can reach from ``node`` (through ``$ref``s)."""
    found: set[str] = set()
    seen: set[str] = set()
    stack: list[tuple[Any, str]] = [(node, pointer)]
    while stack:
        current, current_pointer = stack.pop()
        if not isinstance(current, dict) or current_pointer in seen:
            continue
        seen.add(current_pointer)
        found.update(p for k in current if (p := f"{current_pointer}/{escape_pointer(k)}") in checked)
        stack.extend((child, child_pointer) for child, child_pointer in children(current, current_pointer))
        ref = local_ref(current, root)
        if ref is not None:
            stack.append((ref[0], _plain(ref[1])))
    return found


def _plain(fragment: str) -> str:
    """A pointer from a URI fragment (``%25`` decoded) as a plain JSON pointer."""
    return "".join(f"/{escape_pointer(decode_token(t))}" for t in fragment.split("/")[1:])


def _at(doc: Any, pointer: str) -> Any:
    """The value at the plain JSON pointer ``pointer`` (one :func:`plan_checks` wrote)."""
    node = doc
    for token in pointer.split("/")[1:]:
        key = token.replace("~1", "/").replace("~0", "~")
        node = node[int(key)] if isinstance(node, list) else node[key]
    return node


__all__ = [
    "CheckPlan",
    "Enforcement",
    "KeywordEnforcement",
    "Location",
    "Step",
    "ValueCheck",
    "Wildcard",
    "location_text",
    "plan_checks",
]
