"""Checked keywords while decoding: :class:`ValueChecker`.

The grammar holds an answer to what its backend enforces; the keywords it cannot
(:mod:`thinkstruct.grammar.schema.checks`) are checked here, on the answer's text as it
is decoded. The checker follows the JSON structure (strings and their escapes, numbers,
literals, objects, arrays, keys, hence each value's instance location) and, when a value
at a checked location closes, validates it with ``jsonschema`` (format checker on)
against its subschema. It never looks at a model's thought: it is fed answer text only.

Units: every offset is a character offset (Python ``str`` index) into the answer text
fed so far, the first character of the answer being 0; a *piece* is one call's text,
normally one token's decoded text (possibly empty).

What the engine calls, and when:

1. ``ValueChecker(compiled.checks)`` once the answer starts (the thought, if any, closed),
   for a grammar with a :class:`~thinkstruct.grammar.schema.checks.CheckPlan`
   (``compiled.checks is not None``).
2. ``failure = checker.feed(text)`` once per answer token accepted by the grammar, with
   that token's decoded text (``""`` for a token whose bytes end mid-character: one piece
   per token keeps :meth:`~ValueChecker.rollback` in tokens).
3. On a failure: ``k = checker.pieces_since(failure.start)``; roll the grammar and the KV
   back ``k`` tokens (or fewer, down to a later drawn token of the failed part) and call
   ``checker.rollback(k)``; forbid the first undone token at that position and sample
   again (:mod:`thinkstruct.engine.output.checked_answer`; bounded tries; an exhausted
   part ends the choice with ``failure.describe()``, which names the keyword and the JSON
   pointer). A failure starts at the least that can mend it: the value, the member of it
   the error is about (:mod:`.failed_part`), an item, key or separator a container's
   prefix already breaks (:mod:`thinkstruct.grammar.schema.prefix_checks`), or the
   closing bracket of a container that wants more items or members. A rollback of the
   grammar for any other reason (speculation) rolls the checker back by the same number
   of tokens. The first piece may come from the token that also closed
   the thought (a text end tag such as SmolLM2's ``>`` with answer text after it): undoing
   it would reopen the thought, so the engine must not roll back past it (treat a failure
   whose ``k`` reaches it as exhausted, or re-feed that piece).
4. Stream only ``text[:checker.held_from()]`` (everything when it is ``None``): the rest
   belongs to an open value that may still be undone.
5. At the end of the answer (a stop token the grammar allows): ``checker.finish()``,
   which checks a number at the root (it closes only there); on a failure, as in 3.

Cost: one small tuple a piece for rollback; a value is parsed and validated only where a
check sits (on this machine, 38 µs a 4-character piece on average over a 2.8 KB answer
holding 40 checked arrays, their validations included).
"""

from __future__ import annotations

import bisect
import functools
import json
import re
import weakref
from dataclasses import dataclass
from typing import Any, NamedTuple

from thinkstruct.grammar.constraint import escape_pointer
from thinkstruct.grammar.runtime.failed_part import failed_part
from thinkstruct.grammar.schema.checks import CheckPlan, Wildcard
from thinkstruct.grammar.schema.prefix_checks import PrefixRules, prefix_rules

# Where the scanner is.
_OBJECT_FIRST = 0  # after "{": a key or "}"
_KEY_NEXT = 1  # after "," in an object: a key
_KEY = 2  # inside a key
_COLON = 3  # after a key
_VALUE = 4  # a value starts next
_ARRAY_FIRST = 5  # after "[": a value or "]"
_STRING = 6  # inside a string value
_NUMBER = 7
_LITERAL = 8  # true, false, null
_AFTER = 9  # after a value: ",", "}", "]" (only whitespace after the root value)

_SCALAR_MODES = frozenset({_STRING, _NUMBER, _LITERAL})
_WHITESPACE = frozenset(" \t\n\r")
_STRING_STOP = re.compile(r'["\\]')
_NUMBER_CHARS = re.compile(r"[0-9eE+\-.]*")
_LITERALS = {"t": "true", "f": "false", "n": "null"}


@functools.cache
def _unique_items() -> Any:
    """Checks an array prefix for repeated items (JSON equality as the validator defines it)."""
    import jsonschema

    return jsonschema.Draft202012Validator({"uniqueItems": True})


@dataclass(frozen=True, slots=True)
class CheckFailure:
    """A value that closed and broke a checked keyword.

    Attributes:
        start: offset in the answer text of the first character of the failed part:
            the value, or the member of it the error is about (``then`` failing on a
            sibling's ``legs``: that value); roll back to the token that holds it.
        end: offset just past its last character.
        value_pointer: the failed value's instance JSON pointer (``""``: the whole answer).
        pointer: the instance JSON pointer where the keyword failed (the value itself or
            a part of it).
        keyword: the keyword that failed (``"uniqueItems"``).
        schema_pointer: the failed keyword's place in the schema, as the validator took
            it (through ``$ref``s, the path inside the referenced subschema).
        message: the validator's message.
        where: the JSON document the pointers are in, where it is not the whole answer
            (``"the arguments of paint (call 0)"``); ``""``: the answer.
        expected: the scalars the part at ``start`` must be one of to mend the failure
            (a ``const`` or ``enum`` the error names, or the values an item must match
            to make up ``minContains``), or ``None`` where any other value may do.
    """

    start: int
    end: int
    value_pointer: str
    pointer: str
    keyword: str
    schema_pointer: str
    message: str
    where: str = ""
    expected: tuple[Any, ...] | None = None

    def describe(self) -> str:
        """One line for an error naming the keyword and the JSON pointer."""
        at = f"{self.pointer or '/'} of {self.where}" if self.where else self.pointer or "/"
        return f"{self.keyword} at {at} (schema {self.schema_pointer or '/'}): {self.message}"


class _Node:
    """A node of the check locations' trie: the checks at one location pattern."""

    __slots__ = ("checks", "indexes", "item", "keys", "property")

    def __init__(self) -> None:
        self.keys: dict[str, _Node] = {}
        self.indexes: dict[int, _Node] = {}
        self.item: _Node | None = None
        self.property: _Node | None = None
        self.checks: tuple[int, ...] = ()

    def child(self, step: object) -> _Node:
        if step is Wildcard.ITEM:
            self.item = self.item or _Node()
            return self.item
        if step is Wildcard.PROPERTY:
            self.property = self.property or _Node()
            return self.property
        if isinstance(step, int):
            return self.indexes.setdefault(step, _Node())
        assert isinstance(step, str)  # a Location's steps, built by checks.py
        return self.keys.setdefault(step, _Node())


_tries: weakref.WeakKeyDictionary[CheckPlan, _Node] = weakref.WeakKeyDictionary()


def _trie(plan: CheckPlan) -> _Node:
    root = _tries.get(plan)
    if root is None:
        root = _Node()
        for index, check in enumerate(plan.checks):
            node = root
            for step in check.location:
                node = node.child(step)
            node.checks = (*node.checks, index)
        _tries[plan] = root
    return root


def _children(nodes: tuple[_Node, ...], step: str | int) -> tuple[_Node, ...]:
    found: list[_Node] = []
    for node in nodes:
        if isinstance(step, str):
            named = node.keys.get(step)
            wild = node.property
        else:
            named = node.indexes.get(step)
            wild = node.item
        if named is not None:
            found.append(named)
        if wild is not None:
            found.append(wild)
    return tuple(found)


class _Frame(NamedTuple):
    """An open object or array (immutable: a snapshot shares it)."""

    parent: _Frame | None
    is_object: bool
    start: int
    nodes: tuple[_Node, ...]
    #: Where the held text starts: this value's start if it or an enclosing one is checked.
    held: int | None
    #: The current child's key (``None`` before the first key) or index.
    step: str | int | None
    #: The prefix rules of its checks (check index, rules).
    rules: tuple[tuple[int, PrefixRules], ...] = ()
    #: Items so far that match each ``contains`` of ``rules``, in order.
    matched: tuple[int, ...] = ()
    #: Where the current member's key starts (an object).
    key_start: int = 0
    #: Where the separator before the current child is (``None``: the first child).
    comma: int | None = None


class _State(NamedTuple):
    mode: int
    frame: _Frame | None
    length: int
    value_start: int
    value_nodes: tuple[_Node, ...]
    value_held: int | None
    escape: bool
    key_start: int
    literal_end: int
    root_done: bool
    ended: int | None


class ValueChecker:
    """Follows one answer's JSON text and checks each value at a checked location as it
    closes (see the module doc for what the engine calls when).

    Args:
        plan: the compiled grammar's checks (``CompiledGrammar.checks``).
        trailing: text after the root value is someone else's (a tool call's closing
            syntax): it is not read, and :attr:`ended_at` says where the value ended.
            Otherwise only whitespace may follow it.
    """

    def __init__(self, plan: CheckPlan, *, trailing: bool = False) -> None:
        self._plan = plan
        self._trailing = trailing
        self._ended: int | None = None
        self._root: tuple[_Node, ...] = (_trie(plan),)
        self._text = ""
        self._mode = _VALUE
        self._frame: _Frame | None = None
        self._value_start = 0
        self._value_nodes: tuple[_Node, ...] = ()
        self._value_held: int | None = None
        self._escape = False
        self._key_start = 0
        self._literal_end = 0
        self._root_done = False
        self._failed = False
        #: The state before each piece fed (``_snapshots[i]``: before piece ``i``).
        self._snapshots: list[_State] = []
        self._lengths: list[int] = []

    # ---- the engine's calls -------------------------------------------------------------

    @property
    def pieces(self) -> int:
        """Pieces fed so far (and not rolled back)."""
        return len(self._snapshots)

    @property
    def text(self) -> str:
        """The answer text fed so far."""
        return self._text

    @property
    def ended_at(self) -> int | None:
        """Offset just past the root value once it has closed, else ``None``."""
        return self._ended

    def feed(self, piece: str) -> CheckFailure | None:
        """Take the next piece of answer text; the first checked value it closes that
        fails, or ``None``. After a failure, :meth:`rollback` (at least the piece that
        failed) before feeding again.

        Raises:
            ValueError: the text is not JSON (the grammar lets only JSON through, so
                this is a caller's mistake), or a failure was not rolled back.
            InvalidConstraint: a check cannot run (the reference validator cannot
                resolve a ``$ref`` of its subschema): end the request with it.
        """
        if self._failed:
            raise ValueError("a failed value must be rolled back before feeding more text")
        self._snapshots.append(self._state())
        self._lengths.append(len(self._text))
        start = len(self._text)
        self._text += piece
        failure = self._scan(start)
        self._failed = failure is not None
        return failure

    def finish(self) -> CheckFailure | None:
        """The answer ended here: a number at the root closes (and is checked). Changes
        nothing, so a failure rolls back as one from :meth:`feed`."""
        if self._frame is None and self._mode == _NUMBER and not self._failed:
            return self._validate(self._value_nodes, self._value_start, len(self._text), None)
        return None

    def rollback(self, pieces: int) -> None:
        """Undo the last ``pieces`` pieces (a failure among them included).

        Raises:
            ValueError: more pieces than were fed, or a negative count.
        """
        if not 0 <= pieces <= len(self._snapshots):
            raise ValueError(f"cannot roll back {pieces} pieces: {len(self._snapshots)} were fed")
        if pieces == 0:
            return
        state = self._snapshots[-pieces]
        del self._snapshots[-pieces:]
        del self._lengths[-pieces:]
        self._restore(state)

    def pieces_since(self, offset: int) -> int:
        """How many of the last pieces to undo so that the text kept ends at or before
        character ``offset`` (a failure's ``start``)."""
        if len(self._text) <= offset:
            return 0
        kept = bisect.bisect_right(self._lengths, offset) - 1
        return len(self._snapshots) - max(kept, 0)

    @property
    def scanning(self) -> str:
        """What the next character continues: ``"string"`` (inside a string value or
        key), ``"number"``, ``"literal"`` (``true``, ``false``, ``null``) or
        ``"structure"`` (between values)."""
        mode = self._mode
        if mode in (_STRING, _KEY):
            return "string"
        if mode == _NUMBER:
            return "number"
        if mode == _LITERAL:
            return "literal"
        return "structure"

    def held_from(self) -> int | None:
        """Offset from which the text belongs to an open value that holds checked
        keywords (it may still be undone: do not stream it), or ``None``."""
        if self._mode in _SCALAR_MODES:
            return self._value_held
        return None if self._frame is None else self._frame.held

    # ---- state ----------------------------------------------------------------------------

    def _state(self) -> _State:
        return _State(
            self._mode,
            self._frame,
            len(self._text),
            self._value_start,
            self._value_nodes,
            self._value_held,
            self._escape,
            self._key_start,
            self._literal_end,
            self._root_done,
            self._ended,
        )

    def _restore(self, state: _State) -> None:
        self._mode = state.mode
        self._frame = state.frame
        self._text = self._text[: state.length]
        self._value_start = state.value_start
        self._value_nodes = state.value_nodes
        self._value_held = state.value_held
        self._escape = state.escape
        self._key_start = state.key_start
        self._literal_end = state.literal_end
        self._root_done = state.root_done
        self._ended = state.ended
        self._failed = False

    # ---- scanning -------------------------------------------------------------------------

    def _scan(self, i: int) -> CheckFailure | None:
        text = self._text
        n = len(text)
        while i < n:
            if self._ended is not None and self._trailing:
                return None  # what follows the value is not this checker's
            mode = self._mode
            if mode in (_STRING, _KEY):
                if self._escape:
                    self._escape = False
                    i += 1
                    continue
                found = _STRING_STOP.search(text, i)
                if found is None:
                    return None
                j = found.start()
                if text[j] == "\\":
                    self._escape = True
                    i = j + 1
                    continue
                i = j + 1
                if mode == _KEY:
                    frame = self._frame
                    assert frame is not None  # a key is inside an object
                    frame = self._frame = frame._replace(
                        step=json.loads(text[self._key_start : i]), key_start=self._key_start
                    )
                    self._mode = _COLON
                    failure = self._key_closed(frame, i)
                    if failure is not None:
                        return failure
                    continue
                failure = self._close_scalar(i)
                if failure is not None:
                    return failure
                continue
            if mode == _NUMBER:
                i = _NUMBER_CHARS.match(text, i).end()  # type: ignore[union-attr]
                if i == n:
                    return None
                failure = self._close_scalar(i)
                if failure is not None:
                    return failure
                continue
            if mode == _LITERAL:
                i = min(n, self._literal_end)
                if i < self._literal_end:
                    return None
                if text[self._value_start : i] not in _LITERALS.values():
                    raise self._malformed(self._value_start)
                failure = self._close_scalar(i)
                if failure is not None:
                    return failure
                continue
            c = text[i]
            if c in _WHITESPACE:
                i += 1
                continue
            if mode in (_VALUE, _ARRAY_FIRST):
                if mode == _ARRAY_FIRST and c == "]":
                    failure = self._close_container(i + 1)
                    if failure is not None:
                        return failure
                    i += 1
                    continue
                self._open_value(c, i)
                i += 1
            elif mode in (_OBJECT_FIRST, _KEY_NEXT):
                if c == '"':
                    self._key_start = i
                    self._mode = _KEY
                elif c == "}" and mode == _OBJECT_FIRST:
                    failure = self._close_container(i + 1)
                    if failure is not None:
                        return failure
                else:
                    raise self._malformed(i)
                i += 1
            elif mode == _COLON:
                if c != ":":
                    raise self._malformed(i)
                self._mode = _VALUE
                i += 1
            else:  # _AFTER
                frame = self._frame
                if frame is None:
                    raise self._malformed(i)  # text after the root value
                if c == ",":
                    if frame.is_object:
                        self._frame = frame._replace(comma=i)
                        self._mode = _KEY_NEXT
                    else:
                        assert isinstance(frame.step, int)  # arrays count items
                        self._frame = frame._replace(step=frame.step + 1, comma=i)
                        self._mode = _VALUE
                elif c == ("}" if frame.is_object else "]"):
                    failure = self._close_container(i + 1)
                    if failure is not None:
                        return failure
                else:
                    raise self._malformed(i)
                i += 1
        return None

    def _open_value(self, c: str, i: int) -> None:
        frame = self._frame
        if frame is None:
            if self._root_done:
                raise self._malformed(i)
            nodes = self._root
            held = None
        else:
            assert frame.step is not None  # a value follows a key or in an array
            nodes = _children(frame.nodes, frame.step)
            held = frame.held
        if held is None and any(node.checks for node in nodes):
            held = i
        if c == "{" or c == "[":
            rules = tuple(
                (index, rules)
                for node in nodes
                for index in node.checks
                if (rules := prefix_rules(self._plan, index))
            )
            matched = (0,) * sum(len(r.contains) for _, r in rules)
            self._frame = _Frame(frame, c == "{", i, nodes, held, None if c == "{" else 0, rules, matched)
            self._mode = _OBJECT_FIRST if c == "{" else _ARRAY_FIRST
            return
        self._value_start = i
        self._value_nodes = nodes
        self._value_held = held
        if c == '"':
            self._mode = _STRING
        elif c == "-" or c.isdigit():
            self._mode = _NUMBER
        elif c in _LITERALS:
            self._mode = _LITERAL
            self._literal_end = i + len(_LITERALS[c])
        else:
            raise self._malformed(i)

    def _close_scalar(self, end: int) -> CheckFailure | None:
        self._mode = _AFTER
        if self._frame is None:
            self._root_done = True
            self._ended = end
        failure = self._validate(self._value_nodes, self._value_start, end, self._frame)
        return failure or self._child_closed(self._value_start, end)

    def _close_container(self, end: int) -> CheckFailure | None:
        frame = self._frame
        assert frame is not None  # only an open container closes
        self._frame = frame.parent
        self._mode = _AFTER
        if frame.parent is None:
            self._root_done = True
            self._ended = end
        failure = self._validate(frame.nodes, frame.start, end, frame.parent, closing=True)
        return failure or self._child_closed(frame.start, end)

    # ---- what a prefix already breaks (see thinkstruct.grammar.schema.prefix_checks) ----

    def _child_closed(self, start: int, end: int) -> CheckFailure | None:
        """The child ``text[start:end]`` of the open container just closed: the first
        prefix rule of the container it breaks (failing at that child), else ``None``."""
        parent = self._frame
        if parent is None or not parent.rules:
            return None
        if parent.is_object:
            return self._member_closed(parent, end)
        return self._item_closed(parent, start, end)

    def _item_closed(self, parent: _Frame, start: int, end: int) -> CheckFailure | None:
        index = parent.step
        assert isinstance(index, int)  # arrays count items
        plan = self._plan
        item = json.loads(self._text[start:end])
        matched = list(parent.matched)
        k = 0
        for check, rules in parent.rules:
            if rules.unique and index > 0:
                items = json.loads(self._text[parent.start : end] + "]")
                error = next(iter(_unique_items().iter_errors(items)), None)
                if error is not None:
                    array = _pointer(parent.parent)
                    return self._part_failed(
                        parent, start, end, rules.unique,
                        f"item {index} repeats an earlier item of {array or '/'}: {error.message}",
                    )  # fmt: skip
            for rule in rules.contains:
                hit = plan.valid_at(rule.subschema, item)
                matched[k] += hit
                count = matched[k]
                k += 1
                if hit and rule.maximum is not None and count > rule.maximum:
                    return self._part_failed(
                        parent, start, end, rule.max_keyword,
                        f"item {index} is match {count} of the contains subschema; at most {rule.maximum} may match",
                    )  # fmt: skip
                left = None if rule.max_items is None else rule.max_items - index - 1
                if not hit and left is not None and rule.minimum - count > left:
                    return self._part_failed(
                        parent, start, end, rule.min_keyword,
                        f"item {index} does not match the contains subschema: {rule.minimum - count} more "
                        f"matches are needed and at most {left} more items may follow",
                        expected=rule.finite(plan),
                    )  # fmt: skip
            if rules.unevaluated and rules.unevaluated.endswith("/unevaluatedItems"):
                failure = self._unevaluated(parent, check, rules.unevaluated, start, end)
                if failure is not None:
                    return failure
        self._frame = parent._replace(matched=tuple(matched))
        return None

    def _member_closed(self, parent: _Frame, end: int) -> CheckFailure | None:
        for check, rules in parent.rules:
            if rules.unevaluated and rules.unevaluated.endswith("/unevaluatedProperties"):
                failure = self._unevaluated(parent, check, rules.unevaluated, parent.key_start, end)
                if failure is not None:
                    return failure
        return None

    def _key_closed(self, frame: _Frame, end: int) -> CheckFailure | None:
        """A key of ``frame`` (an object) closed at ``end``: its ``propertyNames``."""
        for _, rules in frame.rules:
            if rules.names and not self._plan.valid_at(rules.names, frame.step):
                return self._part_failed(
                    frame, frame.key_start, end, rules.names,
                    f"the key {frame.step!r} is not valid under the propertyNames subschema",
                )  # fmt: skip
        return None

    def _unevaluated(
        self, parent: _Frame, check: int, keyword: str, start: int, end: int
    ) -> CheckFailure | None:
        """The container's prefix through its child ``text[start:end]`` leaves that
        child unevaluated: fail from the separator before it (the child itself, the
        first), so that the container may close there instead."""
        prefix = json.loads(self._text[parent.start : end] + ("}" if parent.is_object else "]"))
        error = self._plan.error_of(check, prefix, keyword.rpartition("/")[2])
        if error is None:
            return None
        return self._part_failed(
            parent, start if parent.comma is None else parent.comma, end, keyword, error.message
        )

    def _part_failed(
        self, parent: _Frame, start: int, end: int, keyword_pointer: str, message: str,
        *, expected: tuple[Any, ...] | None = None,
    ) -> CheckFailure:  # fmt: skip
        """A failure of container ``parent`` at its current child, ``text[start:end]``."""
        return CheckFailure(
            start=start,
            end=end,
            value_pointer=_pointer(parent),
            pointer=_pointer(parent.parent),
            keyword=keyword_pointer.rpartition("/")[2],
            schema_pointer=keyword_pointer,
            message=message,
            expected=expected,
        )

    def _validate(
        self, nodes: tuple[_Node, ...], start: int, end: int, parent: _Frame | None, *, closing: bool = False
    ) -> CheckFailure | None:
        """Check the value ``text[start:end]`` (a child of ``parent``; ``closing``: a
        container that just closed) against the checks at its location."""
        checks = [index for node in nodes for index in node.checks]
        if not checks:
            return None
        text = self._text[start:end]
        value = json.loads(text)
        for index in checks:
            error = self._plan.first_error(index, value)
            if error is not None:
                value_pointer = _pointer(parent)
                offset, expected = failed_part(text, error, closing=closing)
                return CheckFailure(
                    start=start + offset,
                    end=end,
                    value_pointer=value_pointer,
                    pointer=value_pointer
                    + "".join(f"/{escape_pointer(str(p))}" for p in error.absolute_path),
                    keyword=str(error.validator),
                    schema_pointer=self._plan.checks[index].schema_pointer
                    + "".join(f"/{escape_pointer(str(p))}" for p in error.absolute_schema_path),
                    message=error.message,
                    expected=expected,
                )
        return None

    def _malformed(self, offset: int) -> ValueError:
        return ValueError(
            f"the answer is not JSON at character {offset}: {self._text[offset : offset + 20]!r}"
        )


def _pointer(frame: _Frame | None) -> str:
    """The instance pointer of the child value ``frame`` is at (``""``: the root)."""
    steps: list[str] = []
    while frame is not None:
        steps.append(f"/{escape_pointer(str(frame.step))}")
        frame = frame.parent
    return "".join(reversed(steps))


__all__ = ["CheckFailure", "ValueChecker"]
