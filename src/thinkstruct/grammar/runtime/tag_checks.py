"""Checked keywords inside a structural tag while decoding: :class:`TagChecker`.

The same calls as :class:`~thinkstruct.grammar.runtime.value_checks.ValueChecker` (the
engine cannot tell them apart), over an answer held to a structural tag: a tool call's
arguments, each checked against its own tool's schema. The checker reads the answer's
text as the grammar writes it (:mod:`thinkstruct.grammar.schema.tag_checks` says where):
outside a call it searches for the begin of one (only inside a triggered tag where the
tag has triggers: free text is never read as a call); from the end of that begin, a
fresh ``ValueChecker`` follows the call's JSON until its root value closes, then the
search goes on after it. Every offset is a character offset into the answer text, as
the engine's; a failure names the call (:attr:`CheckFailure.where`: the tool, when the
caller says which begin names which tool) and pointers inside that call's JSON.

Above both checkers: :func:`answer_checker`, the one a plan needs (a
:class:`~thinkstruct.grammar.schema.tag_checks.TagChecks` or a schema's
:class:`~thinkstruct.grammar.schema.checks.CheckPlan`), and :func:`first_failed_check`,
a whole answer checked at once.
"""

from __future__ import annotations

import bisect
import dataclasses
import re
from collections.abc import Mapping
from typing import NamedTuple, Protocol

from thinkstruct.errors import InvalidConstraint
from thinkstruct.grammar.runtime.value_checks import CheckFailure, ValueChecker
from thinkstruct.grammar.schema.tag_checks import Checks, TagChecks, TagGroup, TagSegment, reach

_SEARCH = 0  # looking for where the next call (or group) begins
_JSON = 1  # inside a call's JSON
_DONE = 2  # nothing more is held (the first triggered tag has ended)

#: Marks a group's end among the alternatives a search looks for.
_END = "end"


class _Call:
    """One call's JSON: where it starts and its checker."""

    __slots__ = ("base", "checker", "group", "index", "segment")

    def __init__(self, segment: TagSegment, base: int, group: TagGroup | None, index: int) -> None:
        self.segment = segment
        self.base = base
        self.group = group
        self.index = index
        self.checker = ValueChecker(segment.plan, trailing=True)


class _Mark(NamedTuple):
    """The checker's own state before a piece (its calls' checkers roll back apart)."""

    phase: int
    scan_from: int
    group: TagGroup | None
    calls: int
    call_pieces: int


class _Search:
    """One regex over the alternatives a search may find, and what each stands for."""

    __slots__ = ("items", "reach", "regex")

    def __init__(self, items: list[tuple[str, TagSegment | TagGroup | str]]) -> None:
        self.items = [item for _, item in items]
        alternatives = "|".join(f"(?P<a{i}>{pattern})" for i, (pattern, _) in enumerate(items))
        self.regex = re.compile(alternatives) if items else None
        self.reach = max((reach(pattern) for pattern, _ in items), default=0)

    def find(self, text: str, start: int) -> tuple[re.Match[str], TagSegment | TagGroup | str] | None:
        found = None if self.regex is None else self.regex.search(text, start)
        if found is None:
            return None
        name = next(k for k, v in found.groupdict().items() if k.startswith("a") and v is not None)
        return found, self.items[int(name[1:])]


class TagChecker:
    """Follows one answer held to a structural tag and checks each call's JSON as its
    values close.

    Args:
        plan: the compiled grammar's checks (``CompiledGrammar.checks``, a
            :class:`~thinkstruct.grammar.schema.tag_checks.TagChecks`).
        names: the tool each segment's begin text names (``ToolCallReading.names``), for
            failures; a begin not found here is quoted instead.
    """

    def __init__(self, plan: TagChecks, *, names: Mapping[str, str] | None = None) -> None:
        self._plan = plan
        self._names = names or {}
        self._text = ""
        self._phase = _SEARCH
        self._scan_from = 0
        self._group: TagGroup | None = None
        self._calls: list[_Call] = []
        self._marks: list[_Mark] = []
        self._lengths: list[int] = []
        self._searches: dict[int, _Search] = {}

    # ---- the engine's calls (as ValueChecker's) -------------------------------------------

    @property
    def pieces(self) -> int:
        """Pieces fed so far (and not rolled back)."""
        return len(self._marks)

    @property
    def text(self) -> str:
        """The answer text fed so far."""
        return self._text

    def feed(self, piece: str) -> CheckFailure | None:
        """Take the next piece of answer text; the first checked value of a call it closes
        that fails, or ``None`` (then :meth:`rollback` before feeding again).

        Raises:
            InvalidConstraint: a check cannot run (see ``ValueChecker.feed``).
        """
        current = self._calls[-1] if self._phase == _JSON else None
        self._marks.append(
            _Mark(
                self._phase,
                self._scan_from,
                self._group,
                len(self._calls),
                current.checker.pieces if current is not None else 0,
            )
        )
        self._lengths.append(len(self._text))
        self._text += piece
        return self._scan()

    def finish(self) -> CheckFailure | None:
        """The answer ended here: a number at the root of a call's JSON closes."""
        if self._phase != _JSON:
            return None
        call = self._calls[-1]
        failure = call.checker.finish()
        return None if failure is None else self._named(failure, call)

    def rollback(self, pieces: int) -> None:
        """Undo the last ``pieces`` pieces.

        Raises:
            ValueError: more pieces than were fed, or a negative count.
        """
        if not 0 <= pieces <= len(self._marks):
            raise ValueError(f"cannot roll back {pieces} pieces: {len(self._marks)} were fed")
        if pieces == 0:
            return
        mark = self._marks[-pieces]
        self._text = self._text[: self._lengths[-pieces]]
        del self._marks[-pieces:]
        del self._lengths[-pieces:]
        del self._calls[mark.calls :]
        self._phase, self._scan_from, self._group = mark.phase, mark.scan_from, mark.group
        if mark.phase == _JSON:
            checker = self._calls[-1].checker
            checker.rollback(checker.pieces - mark.call_pieces)

    def pieces_since(self, offset: int) -> int:
        """How many of the last pieces to undo so that the text kept ends at or before
        character ``offset``."""
        if len(self._text) <= offset:
            return 0
        kept = bisect.bisect_right(self._lengths, offset) - 1
        return len(self._marks) - max(kept, 0)

    def held_from(self) -> int | None:
        """Offset from which the text belongs to an open checked value of a call, or
        ``None``."""
        if self._phase != _JSON:
            return None
        call = self._calls[-1]
        held = call.checker.held_from()
        return None if held is None else call.base + held

    # ---- scanning -------------------------------------------------------------------------

    def _scan(self) -> CheckFailure | None:
        text = self._text
        while self._phase != _DONE:
            if self._phase == _JSON:
                call = self._calls[-1]
                rest = text[call.base + len(call.checker.text) :]
                if not rest:
                    return None
                try:
                    failure = call.checker.feed(rest)
                except InvalidConstraint:
                    raise  # a check that cannot run: the request ends with it
                except ValueError:
                    # Not JSON a grammar holds (text a tag leaves free): not a call.
                    call.checker.rollback(1)
                    self._after(call, call.base)
                    continue
                if failure is not None:
                    return self._named(failure, call)
                ended = call.checker.ended_at
                if ended is None:
                    return None
                self._after(call, call.base + ended)
                continue
            search = self._search()
            found = search.find(text, self._scan_from)
            if found is None:
                self._scan_from = max(self._scan_from, len(text) - search.reach)
                return None
            match, item = found
            self._scan_from = match.end()
            if isinstance(item, str):  # the group's end
                self._group = None
                self._phase = _DONE if self._plan.first_only else _SEARCH
            elif isinstance(item, TagGroup):
                self._group = item
            else:
                self._calls.append(_Call(item, match.end(), self._group, len(self._calls)))
                self._phase = _JSON
        return None

    def _after(self, call: _Call, end: int) -> None:
        """A call's JSON ended at ``end``: back to the search it came from."""
        self._scan_from = end
        self._group = call.group
        first_over = self._plan.gated and call.group is None and self._plan.first_only
        self._phase = _DONE if first_over else _SEARCH

    def _search(self) -> _Search:
        """What the search looks for now: where the tag has no triggers, every segment;
        outside a triggered tag, the triggered tags; inside a group, its segments and its end."""
        group = self._group
        key = id(group) if group is not None else (0 if self._plan.gated else 1)
        search = self._searches.get(key)
        if search is None:
            items: list[tuple[str, TagSegment | TagGroup | str]]
            if group is not None:
                items = [(s.pattern, s) for s in group.segments]
                if group.end:
                    items.append((re.escape(group.end), _END))
            elif self._plan.gated:
                items = [(o.pattern, o) for o in self._plan.openers]
            else:
                items = [(s.pattern, s) for s in self._plan.segments]
            search = self._searches[key] = _Search(items)
        return search

    def _named(self, failure: CheckFailure, call: _Call) -> CheckFailure:
        """``failure`` (offsets in the call's JSON) in the answer's terms, naming the call."""
        name = self._names.get(call.segment.begin)
        where = (
            f"the arguments of {name} (call {call.index})"
            if name is not None
            else f"the JSON after {call.segment.begin!r} (call {call.index})"
        )
        return dataclasses.replace(
            failure, start=call.base + failure.start, end=call.base + failure.end, where=where
        )


class AnswerChecker(Protocol):
    """What the engine calls on a checker (:class:`ValueChecker` or :class:`TagChecker`)."""

    @property
    def pieces(self) -> int: ...

    def feed(self, piece: str) -> CheckFailure | None: ...

    def finish(self) -> CheckFailure | None: ...

    def rollback(self, pieces: int) -> None: ...

    def pieces_since(self, offset: int) -> int: ...

    def held_from(self) -> int | None: ...


def answer_checker(plan: Checks, *, names: Mapping[str, str] | None = None) -> AnswerChecker:
    """A fresh checker of one answer under ``plan`` (``names``: see :class:`TagChecker`)."""
    if isinstance(plan, TagChecks):
        return TagChecker(plan, names=names)
    return ValueChecker(plan)


def first_failed_check(plan: Checks, text: str) -> CheckFailure | None:
    """The first failure of a whole answer ``text`` under ``plan`` (a schema's: the text
    is JSON; a structural tag's: each call's JSON is checked), or ``None``.

    Raises:
        ValueError: ``text`` is not JSON (a schema's plan).
    """
    checker = answer_checker(plan)
    return checker.feed(text) or checker.finish()


__all__ = ["AnswerChecker", "TagChecker", "answer_checker", "first_failed_check"]
