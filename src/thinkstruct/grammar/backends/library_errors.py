"""Turn a backend library's error into a user-facing InvalidConstraint.

Library messages are kept (they are often precise) but never shown alone: the error says
which backend refused which kind of constraint, and where a position can be read from
the message (``line 2, column 7``, ``at position 5``) and refers to the constraint's own
text (an EBNF grammar, a regex: not a pattern nested in a schema or a tag), it becomes a
character offset and, for grammars, line and column fields. Internal assertion text
(xgrammar's ``Check failed: (std::holds_alternative<Grammar>(result)) is false:``) is
dropped; the reason after it is what the user needs.
"""

from __future__ import annotations

import re

from thinkstruct.errors import InvalidConstraint
from thinkstruct.grammar.constraint import Constraint, ConstraintKind

_LINE_COL = re.compile(r"line (\d+),? column (\d+)", re.IGNORECASE)
_LINE = re.compile(r"\bat line (\d+)\b", re.IGNORECASE)
_POSITION = re.compile(r"(?:at position|at offset|at char(?:acter)?) (\d+)", re.IGNORECASE)
_MAX_MESSAGE = 600
# xgrammar prefixes its messages with "[13:23:16] /project/cpp/grammar_parser.cc:820: ".
_LOG_PREFIX = re.compile(r"\[\d\d:\d\d:\d\d\] \S+:\d+: ")
# xgrammar's C++ assertion wrapper around a structural tag's real error.
_CHECK_FAILED = re.compile(r"Check failed: \(.*?\) is false: ")
_INVALID_TAG = re.compile(r"^Invalid structural tag error: ", re.IGNORECASE)


def describe_library_error(error: BaseException, constraint: Constraint, backend: str) -> InvalidConstraint:
    return describe_message(str(error) or type(error).__name__, constraint, backend)


def describe_message(message: str, constraint: Constraint, backend: str) -> InvalidConstraint:
    message = " ".join(_LOG_PREFIX.sub("", message).split())
    message = _INVALID_TAG.sub("invalid structural tag: ", _CHECK_FAILED.sub("", message))
    if len(message) > _MAX_MESSAGE:
        message = message[: _MAX_MESSAGE - 3] + "..."
    position, line, column = _location(message, constraint)
    return InvalidConstraint(
        f"{backend} could not compile it: {message}",
        position=position,
        line=line,
        column=column,
        backend=backend,
        kind=constraint.kind.value,
    )


def _location(message: str, constraint: Constraint) -> tuple[int | None, int | None, int | None]:
    """``(offset, line, column)`` in the constraint's text, where the message gives them
    for that text (only an EBNF grammar or a regex is the text the library parsed)."""
    text = constraint.value
    if constraint.kind is ConstraintKind.EBNF:
        lines = text.split("\n")
        m = _LINE_COL.search(message)
        if m:
            line, col = int(m.group(1)), int(m.group(2))
            if 1 <= line <= len(lines):
                return sum(len(x) + 1 for x in lines[: line - 1]) + max(col - 1, 0), line, col
        m = _LINE.search(message)  # llguidance's GBNF conversion names the line only
        if m and 1 <= int(m.group(1)) <= len(lines):
            line = int(m.group(1))
            return sum(len(x) + 1 for x in lines[: line - 1]), line, None
    if constraint.kind in (ConstraintKind.EBNF, ConstraintKind.REGEX):
        m = _POSITION.search(message)
        if m and int(m.group(1)) <= len(text):
            offset = int(m.group(1))
            line = text.count("\n", 0, offset) + 1
            return offset, line, offset - (text.rfind("\n", 0, offset) + 1) + 1
    return None, None, None
