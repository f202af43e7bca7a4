"""The engine's deltas -> a response's output items and the Responses stream's typed events.

:class:`OutputBuilder` is the one place output items are made, streamed or not: fed the
deltas of a choice (a whole answer is fed as one delta), it opens an item when the kind of
output changes (the thought: ``reasoning``; text: ``message``; each call:
``function_call``), closes the one before, and returns the events that say so, in
OpenAI's order: ``response.output_item.added``, ``response.content_part.added``, the
deltas (``response.reasoning_text.delta``, ``response.reasoning_summary_text.delta`` when
a summary was asked for, ``response.output_text.delta``,
``response.function_call_arguments.delta``), then the ``.done`` events and
``response.output_item.done``. Every event carries a ``sequence_number``.

Whitespace alone between the thought and a call is not a message: text is held until it
has more than whitespace (or the answer ends without calls).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from thinkstruct.server.responses_protocol import (
    FunctionCallItem,
    ItemStatus,
    MessageItem,
    OutputItem,
    OutputText,
    ReasoningItem,
    ReasoningText,
    ResponseObject,
    SummaryText,
)
from thinkstruct.server.streaming import named_event
from thinkstruct.server.tools import call_id

if TYPE_CHECKING:
    from thinkstruct.parsers.tool_calls.types import ToolCallDelta


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass(slots=True)
class _Open:
    """The item being written."""

    kind: Literal["reasoning", "message", "function_call"]
    id: str
    index: int
    text: str = ""
    name: str = ""
    call_id: str = ""


@dataclass(slots=True)
class OutputBuilder:
    """A response's output items, built from a choice's deltas (see the module docstring).

    Attributes:
        summary: the thought is also the reasoning item's ``summary``.
        output: the closed items, in order.
    """

    summary: bool = False
    output: list[OutputItem] = field(default_factory=list)
    _open: _Open | None = None
    _held: str = ""
    _calls: dict[int, _Open] = field(default_factory=dict)
    _seq: int = 0

    def event(self, kind: str, **payload: Any) -> bytes:
        """One typed event with the next sequence number."""
        body = {"type": kind, "sequence_number": self._seq, **payload}
        self._seq += 1
        return named_event(kind, body)

    def lifecycle(self, kind: str, response: ResponseObject) -> bytes:
        """``response.created`` / ``in_progress`` / ``completed`` / ``incomplete`` / ``failed``."""
        return self.event(kind, response=response.model_dump(mode="json"))

    def feed(self, *, reasoning: str, content: str, calls: Sequence[ToolCallDelta]) -> list[bytes]:
        """The events of one delta's thought, text and call pieces."""
        out: list[bytes] = []
        if reasoning:
            out += self._text("reasoning", reasoning)
        if content:
            if self._open is not None and self._open.kind == "message":
                out += self._text("message", content)
            elif content.strip():
                out += self._text("message", self._held + content)
                self._held = ""
            else:
                self._held += content
        for piece in calls:
            known = self._calls.get(piece.index)
            if known is None:
                out += self._close()
                self._held = ""
                known = self._calls[piece.index] = _Open(
                    "function_call", item_id("fc"), len(self.output), name=piece.name or "", call_id=call_id()
                )
                self._open = known
                out.append(
                    self.event(
                        "response.output_item.added",
                        output_index=known.index,
                        item=self._item(known, "in_progress"),
                    )
                )
            if piece.arguments:
                known.text += piece.arguments
                out.append(
                    self.event(
                        "response.function_call_arguments.delta",
                        item_id=known.id,
                        output_index=known.index,
                        delta=piece.arguments,
                    )
                )
        return out

    def finish(self, *, status: ItemStatus = "completed") -> list[bytes]:
        """Close the last item; an answer without calls always has a message."""
        out: list[bytes] = []
        writing = self._open is not None and self._open.kind == "message"
        if not self._calls and not writing and not any(isinstance(i, MessageItem) for i in self.output):
            out += self._text("message", self._held)
        return out + self._close(status)

    def _text(self, kind: Literal["reasoning", "message"], text: str) -> list[bytes]:
        out: list[bytes] = []
        item = self._open
        if item is None or item.kind != kind:
            out += self._close()
            item = self._open = _Open(kind, item_id("rs" if kind == "reasoning" else "msg"), len(self.output))
            out.append(
                self.event(
                    "response.output_item.added",
                    output_index=item.index,
                    item=self._item(item, "in_progress"),
                )
            )
            out.append(self.event("response.content_part.added", **self._part(item, "")))
            if kind == "reasoning" and self.summary:
                out.append(
                    self.event("response.reasoning_summary_part.added", **self._summary_part(item, ""))
                )
        item.text += text
        where = {"item_id": item.id, "output_index": item.index}
        if kind == "message":
            out.append(
                self.event("response.output_text.delta", **where, content_index=0, delta=text, logprobs=[])
            )
        else:
            out.append(self.event("response.reasoning_text.delta", **where, content_index=0, delta=text))
            if self.summary:
                out.append(
                    self.event("response.reasoning_summary_text.delta", **where, summary_index=0, delta=text)
                )
        return out

    def _close(self, status: ItemStatus = "completed") -> list[bytes]:
        item = self._open
        if item is None:
            return []
        self._open = None
        where = {"item_id": item.id, "output_index": item.index}
        out: list[bytes] = []
        if item.kind == "function_call":
            out.append(
                self.event(
                    "response.function_call_arguments.done", **where, name=item.name, arguments=item.text
                )
            )
        elif item.kind == "message":
            out.append(
                self.event("response.output_text.done", **where, content_index=0, text=item.text, logprobs=[])
            )
            out.append(self.event("response.content_part.done", **self._part(item, item.text)))
        else:
            out.append(self.event("response.reasoning_text.done", **where, content_index=0, text=item.text))
            out.append(self.event("response.content_part.done", **self._part(item, item.text)))
            if self.summary:
                out.append(
                    self.event(
                        "response.reasoning_summary_text.done", **where, summary_index=0, text=item.text
                    )
                )
                out.append(
                    self.event("response.reasoning_summary_part.done", **self._summary_part(item, item.text))
                )
        done = self._made(item, status)
        self.output.append(done)
        out.append(
            self.event(
                "response.output_item.done", output_index=item.index, item=done.model_dump(mode="json")
            )
        )
        return out

    def _part(self, item: _Open, text: str) -> dict[str, Any]:
        part = ReasoningText(text=text) if item.kind == "reasoning" else OutputText(text=text)
        return {
            "item_id": item.id,
            "output_index": item.index,
            "content_index": 0,
            "part": part.model_dump(mode="json"),
        }

    def _summary_part(self, item: _Open, text: str) -> dict[str, Any]:
        part = SummaryText(text=text).model_dump(mode="json")
        return {"item_id": item.id, "output_index": item.index, "summary_index": 0, "part": part}

    def _item(self, item: _Open, status: ItemStatus) -> dict[str, Any]:
        shell = self._made(item, status)
        if isinstance(shell, (ReasoningItem, MessageItem)):
            shell.content = []
            if isinstance(shell, ReasoningItem):
                shell.summary = []
        elif isinstance(shell, FunctionCallItem):
            shell.arguments = ""
        return shell.model_dump(mode="json")

    def _made(self, item: _Open, status: ItemStatus) -> OutputItem:
        if item.kind == "function_call":
            return FunctionCallItem(
                id=item.id, call_id=item.call_id, name=item.name, arguments=item.text, status=status
            )
        if item.kind == "message":
            return MessageItem(id=item.id, status=status, content=[OutputText(text=item.text)])
        return ReasoningItem(
            id=item.id,
            status=status,
            content=[ReasoningText(text=item.text)],
            summary=[SummaryText(text=item.text)] if self.summary else [],
        )
