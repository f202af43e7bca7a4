"""OpenAI error objects: every failure a client sees is one of these (Anthropic's shape on
``/v1/messages``).

The body is always ``{"error": {"message", "type", "param", "code"}}`` (OpenAI's shape,
which the official clients turn into typed exceptions); a constraint error adds its
``pointer``/``position`` into the schema or grammar. Bad input is a 4xx naming the
field; an unexpected server fault is a 500 whose body says only that, with the traceback
in the server's log and never in the response.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from thinkstruct.errors import CompileTimeout, InvalidConstraint, UnsupportedConstraint

if TYPE_CHECKING:
    from thinkstruct.grammar.runtime.value_checks import CheckFailure

log = logging.getLogger("thinkstruct.server")

INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"
NOT_FOUND = "not_found_error"
RATE_LIMIT = "rate_limit_error"
UNAVAILABLE = "service_unavailable_error"
SERVER = "server_error"
#: The model could not write an answer that meets a checked keyword (its tries ran out).
UNMET = "unmet_constraint_error"


class APIError(Exception):
    """An error answered to the client as an OpenAI error object.

    Args:
        status: the HTTP status.
        message: what is wrong, for a person; names the offending field or part.
        type: OpenAI's error type (``invalid_request_error``, ...).
        param: the request field at fault (``"response_format.json_schema.schema"``), or ``None``.
        code: a stable machine-readable code (``"invalid_constraint"``), or ``None``.
        headers: extra response headers (``Retry-After``, ``WWW-Authenticate``).
        extra: more keys for the error object (``pointer``, ``position``).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}
        self.extra = extra or {}

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {
            "message": self.message,
            "type": self.type,
            "param": self.param,
            "code": self.code,
        }
        error.update(self.extra)
        return {"error": error}

    def anthropic_body(self) -> dict[str, Any]:
        """The error in Anthropic's shape (``/v1/messages``): ``{"type": "error", "error":
        {"type", "message"}}``, the message naming the field at fault."""
        message = self.message
        if self.param and self.param not in message:
            message = f"{self.param}: {message}"
        kind = _ANTHROPIC_TYPES.get(
            self.status, "invalid_request_error" if self.status < 500 else "api_error"
        )
        return {"type": "error", "error": {"type": kind, "message": message}}

    def response(self, path: str = "") -> JSONResponse:
        """The error answered on ``path`` (in Anthropic's shape on its API's paths)."""
        body = self.anthropic_body() if speaks_anthropic(path) else self.body()
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def unmet_constraint(choice: int, failure: CheckFailure) -> APIError:
    """A 422 ``constraint_unmet``: choice ``choice``'s answer could not be made to meet a
    checked keyword (every try of the failed part broke it again). The object names the
    keyword (``keyword``), where in the answer (``pointer``, a JSON pointer; ``where``,
    the document when it is a tool call's arguments) and in the schema
    (``schema_pointer``)."""
    return APIError(
        422,
        f"choice {choice}: the model could not write an answer that meets {failure.describe()}",
        type=UNMET,
        code="constraint_unmet",
        extra={
            "keyword": failure.keyword,
            "pointer": failure.pointer,
            "schema_pointer": failure.schema_pointer,
            "where": failure.where or None,
        },
    )


#: Paths whose errors take Anthropic's shape.
ANTHROPIC_PREFIX = "/v1/messages"


def speaks_anthropic(path: str) -> bool:
    return path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/")


_ANTHROPIC_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def bad_request(message: str, *, param: str | None = None, code: str | None = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def constraint_error_code(error: InvalidConstraint) -> str:
    """The error code of a refused constraint: too slow to compile, unenforceable, or invalid."""
    if isinstance(error, CompileTimeout):
        return "grammar_compile_timeout"
    if isinstance(error, UnsupportedConstraint):
        return "unsupported_constraint"
    return "invalid_constraint"


def constraint_error(error: InvalidConstraint, *, param: str | None) -> APIError:
    """A 400 for a constraint that is invalid, unenforceable (strict) or too slow to compile."""
    code = constraint_error_code(error)
    extra: dict[str, Any] = {}
    if error.pointer is not None:
        extra["pointer"] = error.pointer
    if error.position is not None:
        extra["position"] = error.position
    if error.backend is not None:
        extra["backend"] = error.backend
    return APIError(400, str(error), param=param, code=code, extra=extra)


_STATUS_TYPES = {401: AUTHENTICATION, 404: NOT_FOUND, 429: RATE_LIMIT, 503: UNAVAILABLE}


def install_handlers(app: FastAPI) -> None:
    """Make every error the app answers an OpenAI error object."""

    async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, APIError)
        return exc.response(request.url.path)

    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        # Routing errors (unknown path, wrong method) from Starlette itself.
        assert isinstance(exc, StarletteHTTPException)
        status = exc.status_code
        kind = _STATUS_TYPES.get(status, INVALID_REQUEST if status < 500 else SERVER)
        message = {
            404: f"no endpoint {request.url.path}",
            405: f"method {request.method} is not allowed on {request.url.path}",
        }.get(status, str(exc.detail))
        error = APIError(
            status, message, type=kind, code={404: "not_found", 405: "method_not_allowed"}.get(status)
        )
        error.headers.update(exc.headers or {})
        return error.response(request.url.path)

    async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
        # Only reachable from routes that let FastAPI parse parameters (none parse bodies).
        assert isinstance(exc, RequestValidationError)
        errors = exc.errors()
        first = errors[0] if errors else {}
        loc = ".".join(str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path"))
        error = bad_request(f"{loc or 'request'}: {first.get('msg', 'invalid')}", param=loc or None)
        return error.response(request.url.path)

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error answering %s %s", request.method, request.url.path, exc_info=exc)
        return APIError(500, "internal server error", type=SERVER, code="internal_error").response(
            request.url.path
        )

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(Exception, on_unexpected)
