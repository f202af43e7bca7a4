"""Checked keywords inside a structural tag: where each tag's JSON starts, and its checks.

A structural tag (a request's tool calls, or one a caller wrote) holds pieces of JSON to
schemas: a tool call's arguments. The keywords of those schemas the backend's grammar does
not enforce are checked as values close, as in a plain JSON answer
(:func:`~.checks.plan_checks` splits each schema; one source of truth), by
:class:`~thinkstruct.grammar.runtime.tag_checks.TagChecker`, which must find each piece
of JSON in the answer's text. :func:`plan_tag_checks` reads that from the tag:

- a *segment* is a ``tag`` whose content is JSON held to a schema (``json_schema``
  content in the ``json`` style, or a ``sequence`` of constant strings and regexes ending
  in one, Kimi-K2's call counter); its JSON starts right after its ``begin`` and those
  leading parts (a regex over the text); a legacy ``{structures, triggers}`` structure is
  one too;
- where the tag's format is ``triggered_tags`` (``tool_choice: "auto"``, the legacy
  form), calls start only inside a triggered tag: free text around them is never read as
  a call. A triggered tag is a segment itself or a *group* of segments ending at its
  ``end`` text; with ``stop_after_first`` only the first one holds calls. Elsewhere
  (``"required"``) a segment's begin starts one anywhere in the answer.

JSON written in another style (the XML-like parameter styles) or placed where this
reading does not find it cannot be checked: :attr:`TagChecks.problem` says so, naming
its pointer, when its schema needs checks (strict mode refuses it then).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from thinkstruct.grammar.constraint import escape_pointer
from thinkstruct.grammar.schema.checks import CheckPlan, KeywordEnforcement, plan_checks

#: Characters a regex part of a segment's begin is taken to match at most, for how far
#: back a search for a begin split across pieces must look.
_REGEX_REACH = 64


@dataclass(frozen=True, slots=True)
class TagSegment:
    """A tag whose content is JSON held to a schema (a tool call's arguments).

    Attributes:
        begin: the tag's begin text (it names the tool in a tool call).
        pattern: regex source matching the begin and the parts after it, up to where
            the JSON starts.
        pointer: JSON pointer of the schema in the structural tag.
        plan: what is checked in the JSON (the schema's own pointers).
    """

    begin: str
    pattern: str
    pointer: str
    plan: CheckPlan


@dataclass(frozen=True, slots=True)
class TagGroup:
    """A triggered tag holding calls: it starts at ``pattern`` and ends at ``end`` (``""``:
    never); its segments start anywhere inside."""

    pattern: str
    end: str
    segments: tuple[TagSegment, ...]


@dataclass(frozen=True, eq=False)
class TagChecks:
    """What is checked in one structural tag's JSON, and where to find it (shared,
    immutable).

    Attributes:
        tag: the structural tag (checks resolve against each segment's own schema).
        segments: every segment, in document order.
        openers: with :attr:`gated`, the triggered tags (a segment or a group).
        gated: JSON is held only inside a triggered tag; else segments start anywhere.
        first_only: only the first triggered tag holds calls (``stop_after_first``).
        enforcement: every assertion keyword of the segments' schemas and how it is
            enforced, as JSON pointers into the tag.
        problem: why some JSON that needs checks cannot be checked (naming its pointer),
            or ``None``.
        unchecked: pointers (into the tag) of the keywords that need checks where
            :attr:`problem` says they cannot run.
        problem_at: the pointer :attr:`problem` names.
    """

    tag: Any
    segments: tuple[TagSegment, ...]
    openers: tuple[TagSegment | TagGroup, ...]
    gated: bool
    first_only: bool
    enforcement: tuple[KeywordEnforcement, ...]
    problem: str | None = None
    unchecked: tuple[str, ...] = ()
    problem_at: str | None = None

    @property
    def needed(self) -> bool:
        """Whether any segment has a check (else nothing need follow the answer)."""
        return any(s.plan.checks for s in self.segments)

    @property
    def runnable(self) -> bool:
        """Whether every check can run (see :attr:`problem`)."""
        return self.problem is None and all(s.plan.runnable for s in self.segments)

    @property
    def checked(self) -> tuple[str, ...]:
        """Pointers (into the tag) of every keyword no grammar enforces here."""
        found = [e.pointer for e in self.enforcement if e.enforcement == "checked"]
        return tuple(sorted({*found, *self.unchecked}))


def plan_tag_checks(
    tag: Any,
    *,
    inexact: frozenset[str],
    relaxed: Callable[[Any], frozenset[str]] = lambda _: frozenset(),
) -> TagChecks:
    """Split the assertion keywords of every schema in structural tag ``tag`` between a
    backend's grammar and value checks, and say where each schema's JSON starts.

    Args:
        tag: the structural tag document (either form).
        inexact: the keywords the backend does not enforce exactly.
        relaxed: JSON pointers, in a schema, of further keywords its grammar skips
            (a backend that guesses types: the untyped ones).
    """

    def plan(schema: Any) -> CheckPlan:
        return plan_checks(schema, inexact=inexact, relaxed=relaxed(schema))

    if not isinstance(tag, dict):
        return TagChecks(tag, (), (), gated=False, first_only=False, enforcement=())
    if "structures" in tag:
        return _legacy(tag, plan)
    segments: list[TagSegment] = []
    problems: list[tuple[str, CheckPlan, str]] = []
    by_tag: dict[str, TagSegment] = {}
    begins: dict[str, str] = {}  # the begin of the tag around a schema not located
    for node, pointer in _dicts(tag.get("format"), "/format"):
        if node.get("type") == "tag":
            segment = _segment(node, pointer, plan)
            if segment is not None:
                segments.append(segment)
                by_tag[pointer] = segment
            elif isinstance(node.get("begin"), str):
                begins[f"{pointer}/content/json_schema"] = node["begin"]
    located = {s.pointer for s in segments}
    for node, pointer in _dicts(tag.get("format"), "/format"):
        schema_pointer = f"{pointer}/json_schema"
        if node.get("type") == "json_schema" and schema_pointer not in located:
            style = node.get("style", "json")
            after = f" after {begins[schema_pointer]!r}" if schema_pointer in begins else ""
            why = (
                f"its JSON{after} is written in the {style!r} style, not as JSON text"
                if style != "json"
                else "it is not where a tag's JSON starts"
            )
            problems.append((schema_pointer, plan(node.get("json_schema")), why))
    top = tag.get("format")
    triggered = top if isinstance(top, dict) and top.get("type") == "triggered_tags" else None
    openers: list[TagSegment | TagGroup] = []
    for i, node in enumerate((triggered or {}).get("tags") or []):
        opener = _opener(node, f"/format/tags/{i}", by_tag)
        if opener is not None:
            openers.append(opener)
    return _checks(
        tag,
        segments,
        openers,
        gated=triggered is not None,
        first_only=triggered is not None and bool(triggered.get("stop_after_first")),
        problems=problems,
    )


def _legacy(tag: dict[str, Any], plan: Callable[[Any], CheckPlan]) -> TagChecks:
    segments = [
        TagSegment(s["begin"], re.escape(s["begin"]), f"/structures/{i}/schema", plan(s.get("schema") or {}))
        for i, s in enumerate(tag.get("structures") or [])
        if isinstance(s, dict) and isinstance(s.get("begin"), str)
    ]
    return _checks(tag, segments, list(segments), gated=True, first_only=False, problems=[])


def _checks(
    tag: Any,
    segments: list[TagSegment],
    openers: list[TagSegment | TagGroup],
    *,
    gated: bool,
    first_only: bool,
    problems: list[tuple[str, CheckPlan, str]],
) -> TagChecks:
    enforcement = [
        KeywordEnforcement(e.keyword, s.pointer + e.pointer, e.enforcement, e.location)
        for s in segments
        for e in s.plan.enforcement
    ]
    unchecked: list[str] = []
    problem = problem_at = None
    for pointer, plan, why in problems:
        checked = [pointer + e.pointer for e in plan.enforcement if e.enforcement == "checked"]
        if checked and problem is None:
            problem = (
                f"the schema at {pointer} has keywords no grammar enforces ({', '.join(checked)}), "
                f"which cannot be checked as values close: {why}"
            )
            problem_at = pointer
        unchecked += checked
    if gated and not openers and any(s.plan.checks for s in segments) and problem is None:
        problem, problem_at = "no triggered tag holds the tag's JSON", "/format"
    return TagChecks(
        tag,
        tuple(segments),
        tuple(openers),
        gated=gated,
        first_only=first_only,
        enforcement=tuple(enforcement),
        problem=problem,
        unchecked=tuple(unchecked),
        problem_at=problem_at,
    )


def _segment(node: dict[str, Any], pointer: str, plan: Callable[[Any], CheckPlan]) -> TagSegment | None:
    """The segment ``node`` (a ``tag``) is, or ``None`` when its content is not JSON."""
    begin = node.get("begin")
    content = node.get("content")
    if not isinstance(begin, str) or not isinstance(content, dict):
        return None
    parts: list[str] = []
    where = f"{pointer}/content"
    if content.get("type") == "sequence":
        elements = content.get("elements")
        if not isinstance(elements, list) or not elements:
            return None
        for element in elements[:-1]:
            part = _part(element)
            if part is None:
                return None
            parts.append(part)
        where = f"{where}/elements/{len(elements) - 1}"
        content = elements[-1]
        if not isinstance(content, dict):
            return None
    if content.get("type") != "json_schema" or content.get("style", "json") != "json":
        return None
    pattern = re.escape(begin) + "".join(parts)
    try:
        re.compile(pattern)
    except re.error:
        return None
    return TagSegment(begin, pattern, f"{where}/json_schema", plan(content.get("json_schema")))


def _part(element: Any) -> str | None:
    """A regex for one leading part of a sequence (a constant string or a regex)."""
    if not isinstance(element, dict):
        return None
    value = element.get("value")
    if element.get("type") == "const_string" and isinstance(value, str):
        return re.escape(value)
    if element.get("type") == "regex" and isinstance(element.get("pattern"), str):
        return f"(?:{element['pattern']})"
    return None


def _opener(node: Any, pointer: str, by_tag: dict[str, TagSegment]) -> TagSegment | TagGroup | None:
    """What the triggered tag ``node`` is: a segment (``by_tag``: the segments by their
    tag's pointer), or a group of the segments inside it."""
    if not isinstance(node, dict) or not isinstance(node.get("begin"), str):
        return None
    if pointer in by_tag:
        return by_tag[pointer]  # its content (or its sequence) is the JSON
    inside = tuple(s for p, s in by_tag.items() if p.startswith(f"{pointer}/"))
    if not inside:
        return None
    end = node.get("end")
    return TagGroup(re.escape(node["begin"]), end if isinstance(end, str) else "", inside)


def reach(pattern: str) -> int:
    """How many characters a match of a segment's ``pattern`` may span (at most)."""
    return len(pattern) + _REGEX_REACH * pattern.count("(?:")


def _dicts(node: Any, pointer: str) -> Iterator[tuple[dict[str, Any], str]]:
    """Every object in ``node`` (depth first) with its JSON pointer; schemas not entered."""
    stack: list[tuple[Any, str]] = [(node, pointer)]
    while stack:
        current, where = stack.pop()
        if isinstance(current, dict):
            yield current, where
            for key, value in reversed(list(current.items())):
                if key != "json_schema":
                    stack.append((value, f"{where}/{escape_pointer(key)}"))
        elif isinstance(current, list):
            stack.extend((v, f"{where}/{i}") for i, v in reversed(list(enumerate(current))))


#: A compiled grammar's checks: a JSON schema's, or those inside a structural tag.
Checks = CheckPlan | TagChecks

__all__ = ["Checks", "TagChecks", "TagGroup", "TagSegment", "plan_tag_checks", "reach"]
