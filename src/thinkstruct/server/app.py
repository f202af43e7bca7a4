"""The FastAPI application: :func:`create_app`.

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/responses``
(and ``GET``/``DELETE /v1/responses/{id}``), ``POST /v1/messages`` (Anthropic's API),
``POST /tokenize`` and ``/detokenize`` (vLLM's), ``GET /v1/models`` (and
``/v1/models/{id}``), ``GET /health``, ``GET /metrics``, and the OpenAPI document at
``/openapi.json``. The routes with a body read it themselves (see :mod:`.body`); their
request schemas are added to the OpenAPI document by hand for that reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from thinkstruct.server.auth import ApiKeyMiddleware
from thinkstruct.server.chat import chat_completions
from thinkstruct.server.completions import completions
from thinkstruct.server.errors import install_handlers
from thinkstruct.server.messages import create_message
from thinkstruct.server.messages_protocol import AnthropicError, MessageObject, MessagesRequest
from thinkstruct.server.metrics import RequestCounter
from thinkstruct.server.playground import (
    LINT_PATH,
    PLAYGROUND_PATHS,
    PUBLIC_PATHS,
    VALIDATE_PATH,
    LintRequest,
    ValidateRequest,
    playground_router,
)
from thinkstruct.server.protocol import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    CompletionRequest,
    ErrorResponse,
    ModelCard,
    ModelList,
    TextCompletion,
)
from thinkstruct.server.response_store import ResponseStore
from thinkstruct.server.responses import create_response, delete_response, get_response
from thinkstruct.server.responses_protocol import DeletedResponse, ResponseObject, ResponsesRequest
from thinkstruct.server.settings import ServerSettings
from thinkstruct.server.state import ServerState
from thinkstruct.server.tokenize import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
    detokenize,
    tokenize,
)

if TYPE_CHECKING:
    from thinkstruct.engine import Engine

ENDPOINTS = (
    frozenset(
        {
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/responses",
            "/v1/messages",
            "/tokenize",
            "/detokenize",
            "/v1/models",
            "/health",
            "/metrics",
            "/openapi.json",
            "/docs",
        }
    )
    | PLAYGROUND_PATHS
)

_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": text}
    for status, text in (
        (400, "Bad request: the message and param name the problem"),
        (401, "Missing or wrong API key"),
        (404, "Unknown model"),
        (413, "Request body too large"),
        (429, "Queue full, or the KV budget held by requests running and waiting; see Retry-After"),
        (503, "Model loading or server stopping"),
    )
}


def create_app(
    engine: Engine | None = None,
    settings: ServerSettings | None = None,
    *,
    responses: ResponseStore | None = None,
) -> FastAPI:
    """The server's ASGI application.

    Args:
        engine: a started engine, or ``None`` to attach one later
            (``app.state.thinkstruct.attach(engine)``) while ``/health`` answers 503.
        settings: limits and the API key (defaults: :class:`ServerSettings`).
        responses: the store of responses (default: one sized by
            ``settings.responses_store`` on the monotonic clock).

    The caller owns the engine: it starts it and closes it.
    """
    settings = settings or ServerSettings()
    state = ServerState(settings, engine, responses=responses)
    app = FastAPI(
        title="thinkstruct",
        summary="OpenAI-compatible structured output for reasoning LLMs",
        version=_version(),
        docs_url="/docs",
        redoc_url=None,
    )
    app.state.thinkstruct = state
    install_handlers(app)

    @app.post(
        "/v1/chat/completions",
        response_model=None,
        responses={
            200: {
                "model": ChatCompletion,
                "description": "The answer, or an SSE stream of ChatCompletionChunk",
                "content": _SSE,
            },
            **_ERRORS,
        },
    )
    async def post_chat_completions(request: Request) -> Response:
        return await chat_completions(request, state)

    @app.post(
        "/v1/completions",
        response_model=None,
        responses={
            200: {
                "model": TextCompletion,
                "description": "The completion, or an SSE stream of them",
                "content": _SSE,
            },
            **_ERRORS,
        },
    )
    async def post_completions(request: Request) -> Response:
        return await completions(request, state)

    @app.post(
        "/v1/responses",
        response_model=None,
        responses={
            200: {
                "model": ResponseObject,
                "description": "The response, or an SSE stream of its typed events",
                "content": _SSE,
            },
            **_ERRORS,
        },
    )
    async def post_responses(request: Request) -> Response:
        return await create_response(request, state)

    _BY_ID: dict[int | str, dict[str, Any]] = {
        401: _ERRORS[401],
        404: {"model": ErrorResponse, "description": "No such stored response"},
    }

    @app.get("/v1/responses/{response_id}", response_model=ResponseObject, responses=_BY_ID)
    async def get_stored_response(response_id: str) -> Response:
        return await get_response(response_id, state)

    @app.delete("/v1/responses/{response_id}", response_model=DeletedResponse, responses=_BY_ID)
    async def delete_stored_response(response_id: str) -> Response:
        return await delete_response(response_id, state)

    @app.post(
        "/v1/messages",
        response_model=None,
        responses={
            200: {
                "model": MessageObject,
                "description": "The message, or an SSE stream of Anthropic's events",
                "content": _SSE,
            },
            **{
                status: {"model": AnthropicError, "description": doc["description"]}
                for status, doc in _ERRORS.items()
            },
        },
    )
    async def post_messages(request: Request) -> Response:
        return await create_message(request, state)

    @app.post("/tokenize", response_model=TokenizeResponse, responses=_ERRORS)
    async def post_tokenize(request: Request) -> Response:
        return await tokenize(request, state)

    @app.post("/detokenize", response_model=DetokenizeResponse, responses=_ERRORS)
    async def post_detokenize(request: Request) -> Response:
        return await detokenize(request, state)

    @app.get("/v1/models", response_model=ModelList, responses={401: _ERRORS[401], 503: _ERRORS[503]})
    async def list_models() -> ModelList:
        return ModelList(data=[_card(state)])

    @app.get(
        "/v1/models/{model_id:path}",
        response_model=ModelCard,
        responses={401: _ERRORS[401], 404: _ERRORS[404], 503: _ERRORS[503]},
    )
    async def get_model(model_id: str) -> ModelCard:
        state.require_engine()
        state.check_model(model_id)
        return _card(state)

    @app.get(
        "/health",
        responses={
            503: {
                "description": "Not ready: loading, failed to load, or stopping",
                "content": {"application/json": {"schema": {"type": "object"}}},
            }
        },
    )
    async def health() -> JSONResponse:
        if state.ready:
            return JSONResponse({"status": "ok", "model": state.model_name})
        if state.draining:
            return JSONResponse({"status": "stopping"}, status_code=503)
        if state.load_error:
            return JSONResponse({"status": "failed", "error": state.load_error}, status_code=503)
        return JSONResponse({"status": "loading"}, status_code=503)

    @app.get(
        "/metrics",
        response_class=Response,
        responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}, 401: _ERRORS[401]},
    )
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    app.include_router(playground_router(state))  # GET /: the playground page
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]

    if settings.api_key is not None:
        app.add_middleware(
            ApiKeyMiddleware, api_key=settings.api_key, public_paths=settings.public_paths | PUBLIC_PATHS
        )
    # Added last, so outermost: it also counts the 401s answered by the key check.
    app.add_middleware(RequestCounter, metrics=state.metrics, endpoints=ENDPOINTS)
    return app


def _card(state: ServerState) -> ModelCard:
    engine = state.require_engine()
    return ModelCard(
        id=state.model_name or engine.model.name,
        created=state.created,
        max_model_len=engine.model.context_length,
    )


#: A streamed answer (``stream: true``): Server-Sent Events. Before OpenAPI 3.2 the schema
#: of an event stream describes one event: its ``data`` is a chunk's JSON, the last ``[DONE]``.
_SSE: dict[str, Any] = {
    "text/event-stream": {
        "schema": {
            "type": "object",
            "properties": {
                "data": {
                    "type": "string",
                    "description": "One chunk (ChatCompletionChunk, or a TextCompletion with a piece of "
                    "text) as JSON, the last event [DONE]; or one typed event of a response or a message "
                    "(its type also on the event: line)",
                }
            },
            "required": ["data"],
        }
    }
}

#: Routes that read their own bodies (see :mod:`.body`): their request models and the
#: errors they answer, added to the document by hand.
_OWN_BODIES: dict[str, tuple[type[Any], tuple[int, ...]]] = {
    "/v1/chat/completions": (ChatCompletionRequest, ()),
    "/v1/completions": (CompletionRequest, ()),
    "/v1/responses": (ResponsesRequest, ()),
    "/v1/messages": (MessagesRequest, ()),
    "/tokenize": (TokenizeRequest, ()),
    "/detokenize": (DetokenizeRequest, ()),
    LINT_PATH: (LintRequest, (400, 401, 413, 503)),
    VALIDATE_PATH: (ValidateRequest, (400, 401, 413, 503)),
}


def _request_body(model: type[Any]) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
        }
    }


def _openapi(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    documented: list[type[Any]] = [body for body, _ in _OWN_BODIES.values()]
    documented.append(ChatCompletionChunk)
    for documented_model in documented:
        doc = documented_model.model_json_schema(ref_template="#/components/schemas/{model}", by_alias=True)
        components.update(doc.pop("$defs", {}))
        components[documented_model.__name__] = doc
    for path, (model, errors) in _OWN_BODIES.items():
        operation = schema["paths"][path]["post"]
        operation.update(_request_body(model))
        for status in errors:
            operation["responses"].setdefault(
                str(status),
                {
                    "description": _ERRORS[status]["description"],
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}
                    },
                },
            )
    # FastAPI documents a 422 for every route with parameters; a bad parameter is a 400
    # here (errors.py), documented where it can happen.
    for operations in schema["paths"].values():
        for operation in operations.values():
            operation.get("responses", {}).pop("422", None)
    components.pop("HTTPValidationError", None)
    components.pop("ValidationError", None)
    app.openapi_schema = schema
    return schema


def _version() -> str:
    from thinkstruct import __version__

    return __version__
