"""Errors that reach users of thinkstruct.

Bad user input (a schema, regex, grammar or request) is reported with
:class:`InvalidConstraint`, whose message names the offending part: a JSON pointer
into a schema, or a character position in a regex or grammar. Internal library errors
are wrapped so that a user never sees only a raw C++/Rust error string.
"""

from __future__ import annotations

from collections.abc import Iterable


class ThinkstructError(Exception):
    """Base class of every error thinkstruct raises on purpose."""


class InvalidConstraint(ThinkstructError, ValueError):
    """A constraint that cannot be compiled, with where and why.

    Attributes:
        reason: what is wrong, in one sentence.
        pointer: JSON pointer into the schema (``"/properties/age/type"``), or ``None``.
        position: 0-based character offset into the regex, grammar or raw JSON text, or ``None``.
        backend: the backend that refused it, or ``None`` when thinkstruct's own checks did.
        kind: the constraint kind (``"json_schema"``, ``"regex"``, ...), or ``None``.
        line, column: 1-based line and column of ``position`` in the constraint text (EBNF
            grammars and raw JSON text), or ``None``.
    """

    def __init__(
        self,
        reason: str,
        *,
        pointer: str | None = None,
        position: int | None = None,
        backend: str | None = None,
        kind: str | None = None,
        line: int | None = None,
        column: int | None = None,
    ) -> None:
        self.reason = reason
        self.pointer = pointer
        self.position = position
        self.backend = backend
        self.kind = kind
        self.line = line
        self.column = column
        super().__init__(reason)

    def __str__(self) -> str:
        return self._format()

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only fields would be lost by Exception's default pickling (compile
        # workers send these across processes).
        return (
            _rebuild,
            (
                type(self),
                self.reason,
                self.pointer,
                self.position,
                self.backend,
                self.kind,
                self.line,
                self.column,
            ),
        )

    def _format(self) -> str:
        where = []
        if self.kind:
            where.append(self.kind)
        if self.pointer is not None:
            where.append(f"at {self.pointer or '/'}")
        if self.line is not None:
            where.append(
                f"at line {self.line}" + (f", column {self.column}" if self.column is not None else "")
            )
        elif self.position is not None:
            where.append(f"at character {self.position}")
        if self.backend:
            where.append(f"(backend {self.backend})")
        prefix = " ".join(where)
        return f"{prefix}: {self.reason}" if prefix else self.reason


class CompileTimeout(InvalidConstraint):
    """A compile that ran past its time limit; its work was stopped."""


class UnsupportedConstraint(InvalidConstraint):
    """A backend cannot enforce this kind of constraint (or one of its keywords)."""


class InternalCompileError(ThinkstructError, RuntimeError):
    """Compiling failed for a reason that is not the constraint's (a compile worker that
    died twice, say): an internal error to report as such, never remembered as the
    constraint's failure."""


class UnknownName(ThinkstructError, KeyError):
    """A registry lookup for a name that is not registered.

    Attributes:
        kind: what was looked up (``"reasoning family"``, ``"grammar backend"``).
        name: the name asked for.
        known: the registered names, sorted.
    """

    def __init__(self, kind: str, name: object, known: Iterable[str]) -> None:
        self.kind = kind
        self.name = name
        self.known = tuple(sorted(known))
        super().__init__(f"unknown {kind} {name!r}; known: {', '.join(self.known)}")

    def __str__(self) -> str:  # KeyError would otherwise show the message in quotes
        return str(self.args[0])


class DuplicateName(ThinkstructError, ValueError):
    """A registration under a name that is taken, without ``override=True``."""


def _rebuild(
    cls: type[InvalidConstraint],
    reason: str,
    pointer: str | None,
    position: int | None,
    backend: str | None,
    kind: str | None,
    line: int | None = None,
    column: int | None = None,
) -> InvalidConstraint:
    return cls(
        reason, pointer=pointer, position=position, backend=backend, kind=kind, line=line, column=column
    )
