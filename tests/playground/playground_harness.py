"""What the playground tests share besides fixtures: a reverse proxy's prefix."""

from __future__ import annotations

from typing import Any

#: The prefix a reverse proxy serves the keyed server under (and strips, as nginx does).
PREFIX = "/ts"


class StripPrefix:
    """ASGI wrapper answering what a reverse proxy mapping ``prefix/...`` to ``/...`` would;
    any other path is a 404 from the proxy, not the app."""

    def __init__(self, app: Any, prefix: str) -> None:
        self.app = app
        self.prefix = prefix

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            if path != self.prefix and not path.startswith(self.prefix + "/"):
                await send(
                    {"type": "http.response.start", "status": 404, "headers": [(b"content-length", b"0")]}
                )
                await send({"type": "http.response.body", "body": b""})
                return
            inner = path[len(self.prefix) :] or "/"
            scope = dict(scope, path=inner, raw_path=inner.encode())
        await self.app(scope, receive, send)
