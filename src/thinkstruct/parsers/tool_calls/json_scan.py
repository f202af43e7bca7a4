"""Scanning JSON text that may still be arriving.

:func:`scan_json` finds where a JSON value ends, or says that the text so far is a valid
beginning of one (``PARTIAL``) or cannot be (``INVALID``). Strings and numbers are matched
by regular expressions, so a long argument costs C-speed scanning, not a Python loop per
character. :func:`scan_call_object` reads one ``{"name": ..., "arguments": ...}`` object
member by member, reporting the name as soon as it is complete and the raw argument
text written so far.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

PARTIAL = -1
"""The text ends inside a value that is valid so far."""
INVALID = -2
"""The text cannot begin a JSON value at this point."""

_WS = re.compile(r"[ \t\n\r]*")
# Raw control characters are let through inside strings (a grammar backend may let a model
# write them); the argument text reported escapes them (see escape_controls).
_STRING = re.compile(r'"(?:[^"\\]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"')
# A string cut off by the end of the text (possibly inside an escape).
_STRING_START = re.compile(r'"(?:[^"\\]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*(?:\\(?:u[0-9a-fA-F]{0,3})?)?\Z')
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_NUMBER_START = re.compile(r"-?(?:(?:0|[1-9][0-9]*)(?:\.[0-9]*)?(?:[eE][+-]?[0-9]*)?)?\Z")
_LITERALS = ("true", "false", "null")


def skip_ws(text: str, i: int) -> int:
    """The index of the first non-whitespace character at or after ``i``."""
    return _WS.match(text, i).end()  # type: ignore[union-attr]


def scan_string(text: str, i: int) -> int:
    """End of the JSON string starting at ``text[i] == '"'``, or PARTIAL / INVALID."""
    m = _STRING.match(text, i)
    if m:
        return m.end()
    return PARTIAL if _STRING_START.match(text, i) else INVALID


def _scan_scalar(text: str, i: int) -> int:
    c = text[i]
    if c == '"':
        return scan_string(text, i)
    if c == "-" or "0" <= c <= "9":
        m = _NUMBER.match(text, i)
        if m and m.end() < len(text):
            return m.end()
        # A number that reaches the end of the text may go on.
        return PARTIAL if _NUMBER_START.match(text, i) else INVALID
    for literal in _LITERALS:
        if text.startswith(literal, i):
            return i + len(literal)
        if literal.startswith(text[i : i + len(literal)]) and i + len(literal) > len(text):
            return PARTIAL
    return INVALID


def scan_json(text: str, i: int) -> int:
    """End index of the JSON value that starts at ``text[i]`` (no leading whitespace), or
    :data:`PARTIAL` (the text ends inside a valid beginning) or :data:`INVALID`."""
    n = len(text)
    if i >= n:
        return PARTIAL
    closers: list[str] = []
    # expect: 0 a value, 1 a value or ']', 2 a key or '}', 3 a key, 4 ':', 5 ',' or the closer
    expect = 0
    while True:
        if closers:
            i = _WS.match(text, i).end()  # type: ignore[union-attr]
            if i >= n:
                return PARTIAL
        c = text[i]
        if expect == 0 or expect == 1:
            if expect == 1 and c == "]":
                closers.pop()
                i += 1
                expect = 5
            elif c == "{":
                closers.append("}")
                i += 1
                expect = 2
                continue
            elif c == "[":
                closers.append("]")
                i += 1
                expect = 1
                continue
            else:
                end = _scan_scalar(text, i)
                if end < 0:
                    return end
                i = end
                expect = 5
        elif expect == 2 or expect == 3:
            if expect == 2 and c == "}":
                closers.pop()
                i += 1
                expect = 5
            elif c == '"':
                end = scan_string(text, i)
                if end < 0:
                    return end
                i = end
                expect = 4
                continue
            else:
                return INVALID
        elif expect == 4:
            if c != ":":
                return INVALID
            i += 1
            expect = 0
            continue
        else:  # 5: after a value inside a container
            if c == ",":
                i += 1
                expect = 3 if closers[-1] == "}" else 0
                continue
            if c == closers[-1]:
                closers.pop()
                i += 1
            else:
                return INVALID
        # a value just ended
        if not closers:
            return i
        expect = 5


@dataclass(slots=True)
class CallObject:
    """What :func:`scan_call_object` found so far.

    Attributes:
        name: the function name, once its string is complete.
        arguments: the raw text of the arguments value written so far (``None`` before
            it starts, while a stringified value is incomplete, or when the object has
            no arguments member: :func:`call_arguments` then gives ``"{}"``).
        arguments_done: the arguments value is complete.
        end: the index after the closing ``}``; ``None`` while the object is open.
        error: the index where the text stopped being a call object, else ``None``.
    """

    name: str | None = None
    arguments: str | None = None
    arguments_done: bool = False
    end: int | None = None
    error: int | None = None


def scan_call_object(
    text: str,
    i: int,
    *,
    name_keys: tuple[str, ...] = ("name",),
    argument_keys: tuple[str, ...] = ("arguments", "parameters"),
) -> CallObject:
    """Read the call object starting at ``text[i] == '{'``.

    Arguments written as a JSON *string* holding JSON (``"arguments": "{\\"a\\": 1}"``)
    are decoded once complete.
    """
    found = CallObject()
    n = len(text)
    i += 1
    first = True
    while True:
        i = skip_ws(text, i)
        if i >= n:
            return found
        c = text[i]
        if c == "}" and first:
            found.end = i + 1
            break
        if not first:
            if c == "}":
                found.end = i + 1
                break
            if c != ",":
                found.error = i
                return found
            i = skip_ws(text, i + 1)
            if i >= n:
                return found
            c = text[i]
        if c != '"':
            found.error = i
            return found
        key_end = scan_string(text, i)
        if key_end < 0:
            if key_end == INVALID:
                found.error = i
            return found
        key = json.loads(text[i:key_end], strict=False)
        i = skip_ws(text, key_end)
        if i >= n:
            return found
        if text[i] != ":":
            found.error = i
            return found
        i = skip_ws(text, i + 1)
        if i >= n:
            return found
        start = i
        end = scan_json(text, i)
        if key in name_keys and found.name is None:
            if text[start] != '"':
                found.error = start
                return found
            if end < 0:
                if end == INVALID:
                    found.error = start
                return found
            found.name = json.loads(text[start:end], strict=False)
        elif key in argument_keys and found.arguments is None and not found.arguments_done:
            if end == INVALID:
                found.error = start
                return found
            if text[start] == '"':  # stringified JSON: only usable once complete
                if end < 0:
                    return found
                decoded = json.loads(text[start:end], strict=False)
                found.arguments = escape_controls(decoded if _is_json(decoded) else text[start:end])
            else:
                found.arguments = escape_controls(text[start:] if end < 0 else text[start:end])
                if end < 0:
                    return found
            found.arguments_done = True
        elif end < 0:
            if end == INVALID:
                found.error = start
            return found
        i = end
        first = False
    return found


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def call_arguments(found: CallObject) -> str:
    """The argument text to report for ``found``: ``"{}"`` for a complete object without
    arguments."""
    if found.arguments is None:
        return "{}" if found.end is not None else ""
    return found.arguments


def scan_arguments(text: str, i: int, closers: tuple[str, ...]) -> tuple[str, int | None, int | None]:
    """Arguments that should be JSON, starting at ``text[i]``, in a frame closed by one of
    ``closers``: ``(argument text so far, end of the arguments or None, index of the closer
    found or None)``.

    Valid JSON is reported as written, growing as it arrives. Text that is not JSON is
    reported raw up to the closer (a suffix that could begin one is held back), so a model
    that writes something else still yields its text.
    """
    end = scan_json(text, i)
    if end >= 0:
        return escape_controls(text[i:end]), end, None
    if end == PARTIAL:
        # Trailing whitespace is held: if the text turns out not to be JSON, the raw
        # reading below may end it there, before a closer.
        return escape_controls(text[i:].rstrip()), None, None
    best = -1
    for closer in closers:
        at = text.find(closer, i)
        if at >= 0 and (best < 0 or at < best):
            best = at
    if best >= 0:
        return text[i:best], best, best
    rest = text[i:]
    hold = 0
    for closer in closers:
        for k in range(min(len(closer) - 1, len(rest)), hold, -1):
            if rest.endswith(closer[:k]):
                hold = k
                break
    return rest[: len(rest) - hold], None, None


_CONTROL = re.compile(r"[\x00-\x1f]")
_STRING_EVENTS = re.compile(r'["\\\x00-\x1f]')
_ESCAPES = {"\t": "\\t", "\n": "\\n", "\r": "\\r", "\b": "\\b", "\f": "\\f"}


def escape_controls(text: str) -> str:
    """``text`` (JSON, possibly cut short) with raw control characters inside its strings
    escaped, so that it parses under strict JSON. Outside strings they are whitespace and
    stay. Works left to right, so the result for a prefix is a prefix of the result for
    the whole."""
    if not _CONTROL.search(text):
        return text
    out: list[str] = []
    pos = 0
    i = 0
    inside = False
    while True:
        m = _STRING_EVENTS.search(text, i)
        if m is None:
            break
        j = m.start()
        c = text[j]
        if c == '"':
            inside = not inside
            i = j + 1
        elif c == "\\":
            i = j + 2  # the escaped character is not an event
        else:
            if inside:
                out.append(text[pos:j])
                out.append(_ESCAPES.get(c) or f"\\u{ord(c):04x}")
                pos = j + 1
            i = j + 1
    out.append(text[pos:])
    return "".join(out)
