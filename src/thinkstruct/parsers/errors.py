"""Errors raised by the text-protocol layer (reasoning families, FIM and chat templates).

Each names the offending part: an unknown name lists the known ones, a bad chat-template
argument names the argument, a template failure names the template and the line.
"""

from __future__ import annotations

from thinkstruct.errors import DuplicateName, ThinkstructError, UnknownName

# The registry errors live beside the package-level Registry; re-exported here.
__all__ = [
    "ChatTemplateError",
    "DuplicateName",
    "InvalidChatRequest",
    "InvalidTemplateSpec",
    "UnknownName",
]


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
