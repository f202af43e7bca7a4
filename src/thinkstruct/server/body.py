"""Reading a request body into a request model, every failure a 4xx naming the field.

FastAPI's own body parsing answers some hostile bodies with a 500 (``NaN`` in a number
field) or a bare 422; the routes read their bodies here instead: bounded in size, strict
UTF-8, strict JSON (no ``NaN``/``Infinity``, bounded nesting), then the pydantic model.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request

from thinkstruct.server.errors import APIError, bad_request

M = TypeVar("M", bound=BaseModel)

#: Deepest nesting of the request JSON (a schema inside it has its own, lower limit).
MAX_JSON_DEPTH = 256


async def read_json(request: Request, *, max_bytes: int) -> Any:
    """The request's JSON value.

    Raises:
        APIError: 413 for a body over ``max_bytes``; 400 for one that is not UTF-8 JSON.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise _too_large(max_bytes)
            chunks.append(chunk)
    except ClientDisconnect:
        raise APIError(
            400, "the client closed the connection before sending the whole body", code="incomplete_body"
        ) from None
    raw = b"".join(chunks)
    if not raw.strip():
        raise bad_request("the request body is empty; send a JSON object", code="invalid_json")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad_request(
            f"the request body is not valid UTF-8 (byte {e.start})", code="invalid_json"
        ) from None
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except json.JSONDecodeError as e:
        raise bad_request(
            f"the request body is not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})",
            code="invalid_json",
        ) from None
    except _NonFinite as e:
        raise bad_request(
            f"the request body contains {e}, which JSON does not allow", code="invalid_json"
        ) from None
    except RecursionError:  # Python's limit (about 1,000 levels) is past ours
        raise bad_request(
            f"the request body is nested deeper than {MAX_JSON_DEPTH} levels", code="invalid_json"
        ) from None
    if _depth_exceeds(value, MAX_JSON_DEPTH):
        raise bad_request(
            f"the request body is nested deeper than {MAX_JSON_DEPTH} levels", code="invalid_json"
        )
    if _MAYBE_SURROGATE.search(text):
        _check_unicode(value)
    return value


# JSON may escape a lone UTF-16 surrogate ("\ud800"), which decodes to a str that is not
# Unicode text: tokenizers and encoders fail on it deep inside. Checked only when the body
# has such an escape (a valid pair, an emoji, passes).
_MAYBE_SURROGATE = re.compile(r"\\u[dD][89abcdefABCDEF]")


def _check_unicode(value: Any) -> None:
    stack: list[tuple[Any, tuple[int | str, ...]]] = [(value, ())]
    while stack:
        item, loc = stack.pop()
        if isinstance(item, str):
            _check_text(item, loc)
        elif isinstance(item, dict):
            for key, v in item.items():
                _check_text(key, loc)  # the key itself cannot be named: its object is
                stack.append((v, (*loc, key)))
        elif isinstance(item, list):
            stack.extend((v, (*loc, i)) for i, v in enumerate(item))


def _check_text(text: str, loc: tuple[int | str, ...]) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        where = _path(loc)
        raise bad_request(
            f"the request body contains a lone surrogate (\\u{ord(text[e.start]):04x})"
            f"{' in ' + where if where else ''}, which is not Unicode text",
            param=where or None,
            code="invalid_json",
        ) from None


def _path(loc: tuple[int | str, ...]) -> str:
    """``("messages", 0, "content")`` -> ``"messages[0].content"``; keys that are not
    identifiers (a schema's property names) quoted: ``properties["a b"]``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.isidentifier():
            out += f".{part}" if out else part
        else:
            out += f"[{json.dumps(part, ensure_ascii=False)}]"
    return out


async def read_model(request: Request, model: type[M], *, max_bytes: int) -> M:
    """The request body validated as ``model``; a 400 naming the first bad field otherwise."""
    value = await read_json(request, max_bytes=max_bytes)
    if not isinstance(value, dict):
        raise bad_request(
            f"the request body must be a JSON object, got {_json_type(value)}", code="invalid_json"
        )
    try:
        return model.model_validate(value)
    except ValidationError as e:
        raise validation_error(e) from None
    except RecursionError:
        raise bad_request("the request body is nested too deeply", code="invalid_json") from None


def validation_error(error: ValidationError) -> APIError:
    """The first problem pydantic found, as a 400 with ``param`` set to the field."""
    details = error.errors(include_url=False)
    first = details[0]
    cause = (first.get("ctx") or {}).get("error")
    field = getattr(cause, "field", None)
    param = field or param_name(first["loc"])
    kind = first["type"]
    if kind == "extra_forbidden":
        return bad_request(
            f"Unrecognized request argument supplied: {param}", param=param, code="unknown_parameter"
        )
    if kind == "missing":
        return bad_request(
            f"Missing required parameter: {param}", param=param, code="missing_required_parameter"
        )
    if field is not None:  # a model-level check that wrote its own sentence
        return bad_request(str(cause), param=param, code="invalid_value")
    message = str(cause) if cause is not None else first["msg"]
    wrong_type = kind.endswith("_type")
    if wrong_type:
        message = f"{message}, got {_json_type(first.get('input'))}"
    return bad_request(
        f"{param}: {message}" if param else message,
        param=param or None,
        code="invalid_type" if wrong_type else "invalid_value",
    )


# pydantic's locations name union members and validators ("str", "list[int]",
# "function-after[...]") besides fields; those are not part of the request's shape.
_MEMBER_TAGS = {"str", "int", "float", "bool", "none", "dict", "list"}
_FORMAT_TAGS = {"text", "json_object", "json_schema", "structural_tag"}


def param_name(loc: tuple[int | str, ...]) -> str:
    """``("messages", 0, "content")`` -> ``"messages[0].content"``."""
    if len(loc) > 1 and loc[0] == "response_format" and loc[1] in _FORMAT_TAGS:
        loc = (loc[0], *loc[2:])  # the discriminator's value, not a field
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _MEMBER_TAGS or not part.isidentifier():
            continue
        else:
            out += f".{part}" if out else part
    return out


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


class _NonFinite(ValueError):
    pass


def _refuse_constant(name: str) -> float:
    raise _NonFinite(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _NonFinite(f"the number {text[:40]}, too large for a float")
    return value


def _depth_exceeds(value: Any, limit: int) -> bool:
    # Iterative: a hostile body must not reach Python's recursion limit here either.
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in item)
    return False


def _too_large(limit: int) -> APIError:
    return APIError(
        413, f"the request body is larger than the limit of {limit} bytes", code="request_too_large"
    )
