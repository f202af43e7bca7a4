"""Request fields -> the one :class:`~thinkstruct.Constraint` a request's answer must match.

A request names at most one constraint: ``response_format`` (``json_object``, held to its
``schema`` when it has one, ``json_schema``, ``structural_tag``; ``text`` is none) or one of the extensions
``regex``, ``ebnf``, ``choice``, ``structural_tag``. ``backend`` picks the grammar
backend (``auto`` by default, the server's ``--backend``); ``json_schema.strict`` turns
thinkstruct's strict mode on or off for that request (unset: the server's ``--strict``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from thinkstruct.errors import InvalidConstraint
from thinkstruct.grammar.constraint import Constraint
from thinkstruct.server.errors import bad_request, constraint_error
from thinkstruct.server.protocol import (
    ConstraintFields,
    JsonObjectFormat,
    JsonSchemaFormat,
    StructuralTagFormat,
)


@dataclass(frozen=True, slots=True)
class RequestedConstraint:
    """What to compile for a request.

    Attributes:
        constraint: the constraint.
        param: the request field it came from (named by errors about it).
        backend: the backend asked for, or ``None`` for the compiler's default.
        strict: strict mode asked for, or ``None`` for the compiler's default.
    """

    constraint: Constraint
    param: str
    backend: str | None
    strict: bool | None


def requested_constraint(request: ConstraintFields) -> RequestedConstraint | None:
    """The request's constraint, or ``None`` when its answer is free text.

    Raises:
        APIError: 400 for two constraints at once, or one that is not a constraint at all
            (malformed schema JSON, an empty regex, ...), naming the field and, for a
            schema, the JSON pointer.
    """
    given: list[str] = []
    fmt = request.response_format
    if fmt is not None and fmt.type != "text":
        given.append("response_format")
    for name in ("regex", "ebnf", "choice", "structural_tag"):
        if getattr(request, name) is not None:
            given.append(name)
    if len(given) > 1:
        raise bad_request(
            f"give one constraint per request; got {' and '.join(given)}",
            param=given[1],
            code="conflicting_constraints",
        )
    if not given:
        return None  # a lone "backend" is not an error: it only matters with a constraint
    name = given[0]
    strict: bool | None = None
    try:
        if name == "response_format":
            if isinstance(fmt, JsonObjectFormat) and fmt.schema_ is not None:
                param, constraint = "response_format.schema", Constraint.json_schema(fmt.schema_)
            elif isinstance(fmt, JsonObjectFormat):
                param, constraint = "response_format", Constraint.json_object()
            elif isinstance(fmt, JsonSchemaFormat):
                param = "response_format.json_schema.schema"
                if fmt.json_schema.schema_ is None:
                    raise bad_request(f"{param} is required", param=param, code="missing_required_parameter")
                strict = fmt.json_schema.strict
                constraint = Constraint.json_schema(fmt.json_schema.schema_)
            elif isinstance(fmt, StructuralTagFormat):
                param, constraint = "response_format", Constraint.structural_tag(fmt.tag())
            else:  # pragma: no cover - the discriminated union has no other member
                raise bad_request("unknown response_format type", param="response_format")
        elif name == "regex":
            param, constraint = name, Constraint.regex(_text(request.regex))
        elif name == "ebnf":
            param, constraint = name, Constraint.ebnf(_text(request.ebnf))
        elif name == "choice":
            param, constraint = name, Constraint.choice(request.choice or [])
        else:
            param, constraint = name, Constraint.structural_tag(request.structural_tag or {})
    except InvalidConstraint as e:
        raise constraint_error(e, param=_param_of(name, fmt)) from None
    return RequestedConstraint(constraint=constraint, param=param, backend=request.backend, strict=strict)


def schema_constraint(
    schema: dict[str, Any] | bool | None, *, param: str, backend: str | None, strict: bool | None
) -> RequestedConstraint:
    """A JSON answer format of any API (``json_schema``, ``json_object`` with or without a
    schema): the schema, or any JSON object when it is ``None``.

    Raises:
        APIError: 400 naming ``param`` (and the JSON pointer) for a schema that is not one.
    """
    try:
        constraint = Constraint.json_object() if schema is None else Constraint.json_schema(schema)
    except InvalidConstraint as e:
        raise constraint_error(e, param=param) from None
    return RequestedConstraint(constraint=constraint, param=param, backend=backend, strict=strict)


def _text(value: str | None) -> str:
    return value or ""


def _param_of(name: str, fmt: object) -> str:
    if name == "response_format" and isinstance(fmt, JsonSchemaFormat):
        return "response_format.json_schema.schema"
    if name == "response_format" and isinstance(fmt, JsonObjectFormat) and fmt.schema_ is not None:
        return "response_format.schema"
    return name
