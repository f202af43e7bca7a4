"""Errors raised by the text-protocol layer (reasoning families, FIM and chat templates).

Each names the offending part: an unknown name lists the known ones, a bad chat-template
argument names the argument, a template failure names the template and the line.
"""

from __future__ import annotations

from typing import Iterable

from thinkstruct.errors import ThinkstructError


class UnknownName(ThinkstructError, KeyError):
    """A registry lookup for a name that is not registered.

    Attributes:
        kind: what was looked up (``"reasoning family"``, ``"completion template"``).
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


class InvalidTemplateSpec(ThinkstructError, ValueError):
    """A completion template or reasoning family whose definition is malformed.

    The message names the source (file, entry) and the field at fault.
    """


class ChatTemplateError(ThinkstructError, ValueError):
    """A chat template that cannot be loaded or rendered.

    Attributes:
        template: a short label of the template (its source or family).
        line: the 1-based template line where rendering failed, when known.
    """

    def __init__(self, message: str, *, template: str = "", line: int | None = None) -> None:
        self.template = template
        self.line = line
        where = template
        if line is not None:
            where = f"{where}, line {line}" if where else f"line {line}"
        super().__init__(f"{where}: {message}" if where else message)


class InvalidChatRequest(ThinkstructError, ValueError):
    """A chat request the parsers layer cannot honour (bad ``chat_template_kwargs`` value,
    messages that do not fit ``continue_final_message``, ...). The message names the field."""
