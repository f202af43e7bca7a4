"""The API key: ``Authorization: Bearer <key>`` (or ``x-api-key: <key>``, as Anthropic's
clients send it) on every endpoint but the public ones.

A pure ASGI middleware, so it guards streaming responses and unknown paths alike before
any route runs. The key is compared with :func:`hmac.compare_digest`, in time that does
not depend on where a guess first differs.
"""

from __future__ import annotations

import hmac
import json

from starlette.types import ASGIApp, Receive, Scope, Send

from thinkstruct.server.errors import AUTHENTICATION, APIError, speaks_anthropic

_ERROR = APIError(
    401,
    "Incorrect or missing API key: send it as 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
    type=AUTHENTICATION,
    code="invalid_api_key",
)
_UNAUTHORIZED = json.dumps(_ERROR.body()).encode()
_UNAUTHORIZED_ANTHROPIC = json.dumps(_ERROR.anthropic_body()).encode()


class ApiKeyMiddleware:
    """Answer 401 (an OpenAI error object; Anthropic's shape on ``/v1/messages``) to a
    request without the right key.

    Args:
        app: the application behind it.
        api_key: the key.
        public_paths: paths served without a key (``/health`` for load balancers).
    """

    def __init__(self, app: ASGIApp, *, api_key: str, public_paths: frozenset[str]) -> None:
        self.app = app
        self._expected = api_key.encode("utf-8")
        self._public = public_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self._public or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        body = _UNAUTHORIZED_ANTHROPIC if speaks_anthropic(scope["path"]) else _UNAUTHORIZED
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b'Bearer realm="thinkstruct"'),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def _authorized(self, scope: Scope) -> bool:
        given = b""
        for name, value in scope["headers"]:
            if name == b"authorization" and not given:
                scheme, _, token = value.partition(b" ")
                if scheme.lower() == b"bearer":
                    given = token.strip()
            elif name == b"x-api-key" and not given:
                given = value.strip()
        # Compare even when nothing was given, so a missing key costs what a wrong one does.
        return hmac.compare_digest(given, self._expected) and bool(given)
