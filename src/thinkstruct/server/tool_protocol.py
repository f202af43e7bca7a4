"""The OpenAI wire format of tool calls in answers: ``message.tool_calls`` and the streamed
``delta.tool_calls`` pieces. (Requests' ``tools`` and ``tool_choice`` are read and checked
in :mod:`thinkstruct.server.tools`.)"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class FunctionCall(BaseModel):
    """The function a call names and its arguments, a JSON text."""

    name: str
    arguments: str


class ToolCallOut(BaseModel):
    """One element of ``message.tool_calls``."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionCallPiece(BaseModel):
    """A streamed piece of a call: the name on its first piece, then argument text."""

    name: str | None = None
    arguments: str | None = None


class ToolCallPiece(BaseModel):
    """One element of a streamed ``delta.tool_calls``: the first piece of a call carries its
    ``id``, ``type`` and ``function.name``; later ones only ``index`` and more arguments."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallPiece
