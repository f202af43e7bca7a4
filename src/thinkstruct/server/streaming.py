"""Server-Sent Events: the framing of ``stream: true`` answers.

Each event is one ``data: <json>`` line and a blank line; the stream ends with
``data: [DONE]``, as OpenAI's does. Proxies are asked not to buffer
(``X-Accel-Buffering: no``), so every token reaches the client when it is made.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from pydantic import BaseModel
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

DONE = b"data: [DONE]\n\n"


def event(payload: BaseModel | dict[str, Any]) -> bytes:
    """One SSE event carrying ``payload`` as compact JSON."""
    if isinstance(payload, BaseModel):
        data = payload.model_dump_json(exclude_none=False)
    else:
        data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return b"data: " + data.encode("utf-8") + b"\n\n"


def named_event(name: str, payload: BaseModel | dict[str, Any]) -> bytes:
    """One SSE event with an ``event:`` line (the Responses and Anthropic streams name
    each event by its type)."""
    return b"event: " + name.encode("utf-8") + b"\n" + event(payload)


class EventStream(StreamingResponse):
    """A ``text/event-stream`` response over an async iterator of encoded events.

    ``on_close`` runs once the response is over, however it ended: finished, or the
    client gone before the iterator even started (when its own ``finally`` never runs).
    """

    def __init__(self, events: AsyncIterator[bytes], *, on_close: Callable[[], None] | None = None) -> None:
        super().__init__(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self._on_close is not None:
                self._on_close()
