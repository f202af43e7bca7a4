"""Compile a request's constraint off vLLM's event loop: :class:`PrecompileMiddleware`.

vLLM validates a request's structured-output fields synchronously on its API server's
event loop (:mod:`.frontend`), so a compile that takes seconds there would hold up every
other request's stream. This ASGI middleware, given to vLLM with its own flag
(``--middleware thinkstruct.integrations.vllm.middleware.PrecompileMiddleware``), reads a
chat or completions body first, compiles the constraint in it (``response_format``, or
vLLM's ``structured_outputs``) with the process's compile service while the loop serves
others, and answers a refused constraint with vLLM's own 400 error object before vLLM
parses the request; a compile past its deadline is a 400 too, within the deadline. The
request then goes on with its body unchanged, and vLLM's validation finds the grammar in
the cache. Constraints it does not read (forced tool calls, which vLLM turns into schemas
itself) are compiled by the validation as before.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from vllm.entrypoints.serve.exception_handling.error_response import create_error_response
from vllm.exceptions import VLLMValidationError
from vllm.logger import init_logger

from thinkstruct.errors import InvalidConstraint
from thinkstruct.grammar.constraint import Constraint
from thinkstruct.integrations.vllm.backend import BACKEND_NAME
from thinkstruct.integrations.vllm.frontend import service_for

logger = init_logger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

#: The routes whose bodies carry a constraint.
ROUTES = frozenset({"/v1/chat/completions", "/v1/completions"})
#: Largest body read here (vLLM applies its own limits to what it reads).
MAX_BODY_BYTES = 16 << 20


def body_constraint(body: Any) -> tuple[Constraint, str] | None:
    """The constraint a request body asks for and the field it came from, where it is one
    the middleware reads; ``None`` otherwise.

    Raises:
        InvalidConstraint: the field is there but is not a constraint (names the part).
    """
    if not isinstance(body, dict):
        return None
    response_format = body.get("response_format")
    if isinstance(response_format, dict):
        kind = response_format.get("type")
        if kind == "json_object":
            return Constraint.json_object(), "response_format"
        spec = response_format.get("json_schema")
        if kind == "json_schema" and isinstance(spec, dict) and "schema" in spec:
            return Constraint.json_schema(spec["schema"]), "response_format"
        return None
    outputs = body.get("structured_outputs")
    if not isinstance(outputs, dict):
        return None
    for field, build in (
        ("json", Constraint.json_schema),
        ("regex", Constraint.regex),
        ("choice", Constraint.choice),
        ("grammar", Constraint.ebnf),
    ):
        value = outputs.get(field)
        if value is not None:
            return build(value), f"structured_outputs.{field}"
    if outputs.get("json_object") is True:
        return Constraint.json_object(), "structured_outputs.json_object"
    return None


class PrecompileMiddleware:
    """The ASGI middleware (see the module docstring)."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or scope.get("method") != "POST" or scope.get("path") not in ROUTES:
            await self.app(scope, receive, send)
            return
        config = getattr(getattr(scope.get("app"), "state", None), "vllm_config", None)
        if config is None or config.structured_outputs_config.backend != BACKEND_NAME:
            await self.app(scope, receive, send)
            return
        body, complete = await _read_body(receive)
        refusal = await self._refusal(body, config.model_config) if complete else None
        if refusal is not None:
            await _send_error(send, refusal)
            return
        await self.app(scope, _replay(body, complete, receive), send)

    async def _refusal(self, body: bytes, model_config: Any) -> VLLMValidationError | None:
        try:
            found = body_constraint(json.loads(body))
        except InvalidConstraint as error:
            return VLLMValidationError(str(error), parameter="response_format")
        except ValueError:
            return None  # not JSON: vLLM answers it
        if found is None:
            return None
        constraint, field = found
        # The first call loads the tokenizer and builds the compiler: not on the event loop.
        service = await asyncio.to_thread(service_for, model_config)
        try:
            await asyncio.wrap_future(service.submit(constraint))
        except InvalidConstraint as error:
            return VLLMValidationError(str(error), parameter=field)
        except Exception:  # an internal failure: vLLM's own validation decides
            logger.exception("thinkstruct: pre-compiling a %s constraint failed", constraint.kind.value)
        return None


async def _read_body(receive: Receive) -> tuple[bytes, bool]:
    """The request body, and whether all of it was read (a body past
    :data:`MAX_BODY_BYTES` is left to vLLM)."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message.get("type") != "http.request":
            return b"".join(parts), False
        chunk = message.get("body", b"")
        parts.append(chunk)
        size += len(chunk)
        if not message.get("more_body", False):
            return b"".join(parts), True
        if size > MAX_BODY_BYTES:
            return b"".join(parts), False


def _replay(body: bytes, complete: bool, receive: Receive) -> Receive:
    """A ``receive`` that hands the app the body read so far, then the client's messages."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": not complete}
        return await receive()

    return replay


async def _send_error(send: Send, error: VLLMValidationError) -> None:
    response = create_error_response(error)
    payload = json.dumps(response.model_dump()).encode()
    await send(
        {
            "type": "http.response.start",
            "status": int(response.error.code),
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


__all__ = ["ROUTES", "PrecompileMiddleware", "body_constraint"]
