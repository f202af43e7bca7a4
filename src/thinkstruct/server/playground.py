"""The playground: a page at ``GET /`` to try constraints by hand, and the two small JSON
endpoints it calls besides ``/v1/chat/completions``.

- ``GET /`` — one self-contained HTML page (the CSS and JS of ``static/`` inlined, so it
  needs nothing else from the network, works offline and behind a reverse-proxy prefix:
  every URL it calls is relative to where it was loaded). Public, like ``/health``: the
  page asks for the API key itself and keeps it in the browser's session storage.
- ``GET /playground/config`` — public: whether the server wants an API key, and the share
  of ``max_tokens`` a thought gets without a budget (the page's default budget).
- ``POST /playground/lint`` — compiles a constraint exactly as a chat request would (the
  engine's own :class:`~thinkstruct.grammar.service.compiler.GrammarCompiler`, its cache, backend
  choice and strict mode — the compile ``thinkstruct check`` runs per backend) and answers
  the verdict: backend chosen, compile time, how each schema keyword is enforced (by the
  grammar, checked as values close, or ignored) with its JSON pointer, or the error with
  its pointer / position. An invalid constraint is a 200 with
  ``ok: false``: linting it is the point, not a client error.
- ``POST /playground/validate`` — checks a finished answer: the whole text against the
  compiled grammar (the check ``thinkstruct check`` runs on answer files: accepted, or the
  first rejected character), and for a JSON Schema against the reference validator
  (``jsonschema``), each error with the JSON pointer of the failing value — the
  independent check, which also catches keywords a lenient backend ignored.
"""

from __future__ import annotations

import hashlib
import json
import time
from base64 import b64encode
from functools import cache
from importlib import resources
from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse

from thinkstruct.errors import InvalidConstraint
from thinkstruct.grammar.api import first_rejected
from thinkstruct.grammar.constraint import Constraint
from thinkstruct.server.body import read_model
from thinkstruct.server.errors import constraint_error_code
from thinkstruct.server.protocol import BackendName
from thinkstruct.server.state import ServerState

#: Paths the playground answers; the public ones are served without the API key.
PAGE_PATH = "/"
CONFIG_PATH = "/playground/config"
LINT_PATH = "/playground/lint"
VALIDATE_PATH = "/playground/validate"
PLAYGROUND_PATHS = frozenset({PAGE_PATH, CONFIG_PATH, LINT_PATH, VALIDATE_PATH})
PUBLIC_PATHS = frozenset({PAGE_PATH, CONFIG_PATH})

#: Most validation errors listed for one answer.
MAX_VALIDATION_ERRORS = 50


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class LintRequest(_Body):
    """``POST /playground/lint``.

    Attributes:
        kind: the constraint's kind.
        value: the schema's JSON text, the regex, the EBNF grammar, or the list of choices.
        backend: as a chat request's ``backend`` (``None``: the server's default).
        strict: as ``response_format.json_schema.strict`` (``None``: the server's default).
    """

    kind: Literal["json_schema", "regex", "ebnf", "choice"]
    value: str | list[str]
    backend: BackendName | None = None
    strict: bool | None = None


class LintError(BaseModel):
    """Why a constraint does not compile; ``line``/``column`` (1-based) locate
    ``position`` (a 0-based character offset into the text) when there is one."""

    message: str
    reason: str
    code: str
    pointer: str | None = None
    position: int | None = None
    line: int | None = None
    column: int | None = None
    backend: str | None = None


class KeywordEnforcementInfo(BaseModel):
    """How one assertion keyword of a JSON schema is enforced.

    Attributes:
        keyword: the keyword (``"uniqueItems"``).
        pointer: its JSON pointer in the schema as compiled (after ``auto``'s rewrites).
        enforcement: ``grammar`` (held token by token), ``checked`` (validated as each
            value it applies to closes, and undone when it fails) or ``ignored``
            (lenient mode).
        location: for a checked keyword, the values checked, as an instance JSON
            pointer (``*``: every item or property value; ``""``: the whole answer).
    """

    keyword: str
    pointer: str
    enforcement: Literal["grammar", "checked", "ignored"]
    location: str | None = None


class LintResult(BaseModel):
    """The verdict on a constraint.

    Attributes:
        ok: it compiles (under the strictness asked for).
        backend: the backend that compiled it (``auto`` resolved), or that refused it.
        compile_ms: milliseconds the backend spent compiling it (when first compiled).
        waited_ms: milliseconds this lint waited (about zero from the cache).
        ignored_keywords: JSON pointers of keywords the backend does not enforce (lenient).
        enforcement: each assertion keyword of a JSON schema and how it is enforced.
        error: why it does not compile.
    """

    ok: bool
    kind: str
    backend: str | None = None
    compile_ms: float | None = None
    waited_ms: float
    ignored_keywords: list[str] = Field(default_factory=list)
    enforcement: list[KeywordEnforcementInfo] = Field(default_factory=list)
    error: LintError | None = None


class ValidateRequest(LintRequest):
    """``POST /playground/validate``: ``answer`` against the constraint (as linted)."""

    answer: str


class ValidationIssue(BaseModel):
    """One way the answer breaks the schema: ``pointer`` to the value, ``keyword`` failed."""

    pointer: str
    message: str
    keyword: str | None = None


class ValidateResult(BaseModel):
    """The verdict on an answer.

    Attributes:
        valid: every check passed (for a schema: it parses and ``jsonschema`` finds no
            error; otherwise: the grammar accepts the whole text).
        grammar_accepts: the compiled grammar accepts the text as a complete answer
            (``None``: the constraint did not compile).
        rejected_at: the first character the grammar rejects (the length of the text:
            it ends before it is complete).
        parse_error, schema_error: the answer is not JSON; the schema cannot be checked.
        errors: ``jsonschema``'s errors, sorted by where they are (at most 50).
    """

    valid: bool
    grammar_accepts: bool | None = None
    rejected_at: int | None = None
    parse_error: str | None = None
    schema_error: str | None = None
    errors: list[ValidationIssue] = Field(default_factory=list)


def playground_router(state: ServerState) -> APIRouter:
    """The page and its endpoints, over the server's state (its engine and compiler)."""
    router = APIRouter(tags=["playground"])

    @router.get(PAGE_PATH, response_class=HTMLResponse, include_in_schema=False)
    async def page() -> HTMLResponse:
        html, csp = _page()
        return HTMLResponse(
            html,
            headers={
                "Cache-Control": "no-cache",
                "Content-Security-Policy": csp,
                "X-Content-Type-Options": "nosniff",
                "Referrer-Policy": "no-referrer",
            },
        )

    @router.get(CONFIG_PATH)
    async def config() -> JSONResponse:
        settings = state.settings
        return JSONResponse(
            {"api_key_required": settings.api_key is not None, "reasoning_share": settings.reasoning_share}
        )

    @router.post(LINT_PATH, response_model=LintResult)
    async def lint(request: Request) -> JSONResponse:
        body = await read_model(request, LintRequest, max_bytes=state.settings.max_body_bytes)
        result = await lint_constraint(state, body)
        return JSONResponse(result.model_dump(mode="json"))

    @router.post(VALIDATE_PATH, response_model=ValidateResult)
    async def validate(request: Request) -> JSONResponse:
        body = await read_model(request, ValidateRequest, max_bytes=state.settings.max_body_bytes)
        result = await check_answer(state, body)
        return JSONResponse(result.model_dump(mode="json"))

    return router


async def lint_constraint(state: ServerState, body: LintRequest) -> LintResult:
    """Compile ``body``'s constraint as a chat request would and describe the outcome.

    Raises:
        APIError: 503 while the model loads (there is no compiler yet).
    """
    engine = state.require_engine()
    start = time.perf_counter()
    text = body.value if isinstance(body.value, str) else None
    try:
        constraint = _constraint(body)
        compiled = await engine.compiler.compile_async(constraint, backend=body.backend, strict=body.strict)
    except InvalidConstraint as e:
        return LintResult(
            ok=False,
            kind=body.kind,
            backend=e.backend,
            waited_ms=(time.perf_counter() - start) * 1000,
            error=_lint_error(e, text),
        )
    return LintResult(
        ok=True,
        kind=body.kind,
        backend=compiled.backend,
        compile_ms=compiled.compile_seconds * 1000,
        waited_ms=(time.perf_counter() - start) * 1000,
        ignored_keywords=list(compiled.ignored_keywords),
        enforcement=[
            KeywordEnforcementInfo(
                keyword=e.keyword, pointer=e.pointer, enforcement=e.enforcement, location=e.location
            )
            for e in compiled.enforcement()
        ],
    )


async def check_answer(state: ServerState, body: ValidateRequest) -> ValidateResult:
    """``body.answer`` against its constraint's grammar and, for a schema, ``jsonschema``.

    Raises:
        APIError: 503 while the model loads.
    """
    engine = state.require_engine()
    try:
        constraint = _constraint(body)
        compiled = await engine.compiler.compile_async(constraint, backend=body.backend, strict=body.strict)
    except InvalidConstraint as e:
        return ValidateResult(valid=False, schema_error=f"the constraint does not compile: {e}")
    rejected = await run_in_threadpool(first_rejected, compiled, body.answer)
    accepts = rejected is None
    if body.kind != "json_schema":
        return ValidateResult(valid=accepts, grammar_accepts=accepts, rejected_at=rejected)
    result = await run_in_threadpool(validate_answer, constraint.document, body.answer)
    return result.model_copy(update={"grammar_accepts": accepts, "rejected_at": rejected})


def _constraint(body: LintRequest) -> Constraint:
    if body.kind == "choice":
        if not isinstance(body.value, list):
            raise InvalidConstraint("choice takes a list of options", kind="choice")
        return Constraint.choice(body.value)
    if not isinstance(body.value, str):
        raise InvalidConstraint(f"{body.kind} takes a string", kind=body.kind)
    if body.kind == "json_schema":
        return Constraint.json_schema(body.value)
    if body.kind == "regex":
        return Constraint.regex(body.value)
    return Constraint.ebnf(body.value)


def _lint_error(error: InvalidConstraint, text: str | None) -> LintError:
    code = constraint_error_code(error)
    line, column = error.line, error.column
    if line is None and error.position is not None and text is not None:
        line, column = line_column(text, error.position)
    return LintError(
        message=str(error),
        reason=error.reason,
        code=code,
        pointer=error.pointer,
        position=error.position,
        line=line,
        column=column,
        backend=error.backend,
    )


def line_column(text: str, position: int) -> tuple[int, int]:
    """1-based line and column of the 0-based character offset ``position`` in ``text``."""
    position = max(0, min(position, len(text)))
    before = text[:position]
    line = before.count("\n") + 1
    return line, position - (before.rfind("\n") + 1) + 1


def validate_answer(schema: dict[str, Any] | bool, answer: str) -> ValidateResult:
    """``answer`` parsed as JSON and checked against ``schema`` (its declared draft,
    2020-12 by default); errors sorted by where they are."""
    import jsonschema
    import referencing.exceptions  # type: ignore[import-not-found,unused-ignore]

    try:
        value = json.loads(answer)
    except ValueError as e:
        return ValidateResult(valid=False, parse_error=f"the answer is not JSON: {e}")
    try:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        cls.check_schema(schema)
        found = sorted(cls(schema).iter_errors(value), key=lambda e: [str(p) for p in e.absolute_path])
    except jsonschema.SchemaError as e:
        return ValidateResult(valid=False, schema_error=f"the schema is not valid: {e.message}")
    except (referencing.exceptions.Unresolvable, RecursionError) as e:
        return ValidateResult(valid=False, schema_error=f"the schema cannot be checked: {e}")
    issues = [
        ValidationIssue(pointer=_pointer(e.absolute_path), message=e.message, keyword=str(e.validator))
        for e in found[:MAX_VALIDATION_ERRORS]
    ]
    return ValidateResult(valid=not found, errors=issues)


def _pointer(path: Any) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


@cache
def _page() -> tuple[str, str]:
    """The page with its stylesheet and script inlined, and the Content-Security-Policy
    that allows exactly those two (by hash) and requests to its own origin."""
    static = resources.files("thinkstruct.server") / "static"
    html = (static / "index.html").read_text(encoding="utf-8")
    css = (static / "playground.css").read_text(encoding="utf-8")
    js = (static / "playground.js").read_text(encoding="utf-8")
    html = html.replace('<link rel="stylesheet" href="playground.css">', f"<style>{css}</style>")
    html = html.replace('<script src="playground.js"></script>', f"<script>{js}</script>")
    csp = "; ".join(
        (
            "default-src 'none'",
            f"script-src '{_sha256(js)}'",
            f"style-src '{_sha256(css)}'",
            "connect-src 'self'",
            "img-src data:",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        )
    )
    return html, csp


def _sha256(text: str) -> str:
    return "sha256-" + b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii")
