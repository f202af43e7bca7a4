"""Turn a backend library's error into a user-facing InvalidConstraint.

Library messages are kept (they are often precise) but never shown alone: the error says
which backend refused which kind of constraint, and where a position can be read from
the message (``line 2, column 7``, ``at position 5``) it is converted to a character
offset into the constraint text.
"""

from __future__ import annotations

import re

from thinkstruct.errors import InvalidConstraint
from thinkstruct.grammar.constraint import Constraint

_LINE_COL = re.compile(r"line (\d+),? column (\d+)", re.IGNORECASE)
_POSITION = re.compile(r"(?:at position|at offset|at char(?:acter)?) (\d+)", re.IGNORECASE)
_MAX_MESSAGE = 600
# xgrammar prefixes its messages with "[13:23:16] /project/cpp/grammar_parser.cc:820: ".
_LOG_PREFIX = re.compile(r"\[\d\d:\d\d:\d\d\] \S+:\d+: ")


def describe_library_error(error: BaseException, constraint: Constraint, backend: str) -> InvalidConstraint:
    return describe_message(str(error) or type(error).__name__, constraint, backend)


def describe_message(message: str, constraint: Constraint, backend: str) -> InvalidConstraint:
    message = " ".join(_LOG_PREFIX.sub("", message).split())
    if len(message) > _MAX_MESSAGE:
        message = message[: _MAX_MESSAGE - 3] + "..."
    return InvalidConstraint(
        f"{backend} could not compile it: {message}",
        position=_position(message, constraint.value),
        backend=backend,
        kind=constraint.kind.value,
    )


def _position(message: str, text: str) -> int | None:
    m = _LINE_COL.search(message)
    if m:
        line, col = int(m.group(1)), int(m.group(2))
        lines = text.split("\n")
        if 1 <= line <= len(lines):
            return sum(len(x) + 1 for x in lines[: line - 1]) + max(col - 1, 0)
    m = _POSITION.search(message)
    if m:
        return int(m.group(1))
    return None
