"""Tool calling on ``/v1/chat/completions``: ``tools``, ``tool_choice``, ``parallel_tool_calls``.

A request's tools are read once into a :class:`ToolPlan`:

- ``tool_choice: "none"``: the tools are not shown to the model and nothing is parsed as
  a call (the answer is text).
- ``"auto"`` (the default with tools): the tools are described in the prompt by the
  family's chat template; the answer is free text (and the thought free) until the
  family's tool-call start appears, then the call is held to the schema of the tool it
  names: a lazy constraint, a structural tag with a trigger. A family whose call syntax
  has no constrained form (harmony, pythonic) is parsed only.
- ``"required"`` or a named function (``{"type": "function", "function": {"name": ...}}``):
  the answer after the thought is exactly the calls, in the family's own call syntax,
  arguments held to each tool's ``parameters`` schema; only the tools allowed can be
  named. ``parallel_tool_calls: false`` allows one call.

Strict mode (the server's ``--strict``, or a tool's ``function.strict: true``): the
keywords of the tools' schemas that the call grammar does not enforce (``uniqueItems``,
``not``, ``format``...) are checked as each call's values close, each call against its own
tool's schema, and a failed value is drawn again before it is streamed
(:mod:`thinkstruct.grammar.runtime.tag_checks`); without it they are listed as ignored.

The grammar applies after the thought (the reasoning wrapper), so a thinking budget still
forces the end of the thought before a required call. The answer's content is read by the
family's :class:`~thinkstruct.parsers.tool_calls.ToolCallParser` in the engine's output
processor (:attr:`ToolPlan.reading`); here its calls become OpenAI's ``message.tool_calls``
(or streamed ``delta.tool_calls`` pieces, each call with its id), with ``finish_reason``
``"tool_calls"`` when the model ended its answer with calls.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from thinkstruct.engine.request import ToolCallReading
from thinkstruct.grammar.constraint import Constraint, ConstraintKind
from thinkstruct.parsers.tool_calls import (
    ToolCallSyntax,
    ToolSchemas,
    get_tool_call_syntax,
    tool_call_structural_tag,
)
from thinkstruct.server.constraints import RequestedConstraint
from thinkstruct.server.errors import bad_request
from thinkstruct.server.tool_protocol import (
    FunctionCall,
    FunctionCallPiece,
    ToolCallOut,
    ToolCallPiece,
)

if TYPE_CHECKING:
    from thinkstruct.parsers import ReasoningFamily
    from thinkstruct.parsers.tool_calls.types import ToolCall, ToolCallDelta

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
MAX_TOOLS = 128

Choice = Literal["none", "auto", "required"]

#: Answer constraints that may stand beside ``tool_choice: "auto"`` (the answer is then
#: either the calls or that JSON).
_JSON_KINDS = (ConstraintKind.JSON_SCHEMA, ConstraintKind.JSON_OBJECT)

#: The characters a JSON text may begin with: a call trigger that begins with one (Llama
#: 3's ``{"name": ``, Mistral's ``[TOOL_CALLS]``) cannot be told apart from the JSON
#: answer by the first token, so there the grammar alone chooses.
_JSON_OPENERS = frozenset('{["-0123456789tfn \t\n\r')


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """What a request's tools mean for its prompt, its grammar and its answer.

    Attributes:
        tools: the tools as the chat template gets them (``None``: none shown).
        schemas: each tool's ``parameters`` schema, by name (for the call parser).
        choice: ``"none"``, ``"auto"`` or ``"required"`` (a named function is required
            with ``allowed`` holding its name only).
        allowed: the names a call may take.
        parallel: more than one call may be made.
        syntax: the family's call syntax, ``None`` when nothing is parsed as a call.
        strict: strict mode for the calls' constraint: ``True`` when a tool asks for it
            (``function.strict``), ``False`` when one turns it off and none asks,
            ``None`` (the server's ``--strict``) otherwise. Under it every keyword of the
            tools' schemas holds: those no grammar enforces are checked as each call's
            values close.
    """

    tools: list[dict[str, Any]] | None = None
    schemas: ToolSchemas = field(default_factory=lambda: ToolSchemas({}))
    choice: Choice = "none"
    allowed: tuple[str, ...] = ()
    parallel: bool = True
    syntax: ToolCallSyntax | None = None
    strict: bool | None = None

    def reading(self, requested: RequestedConstraint | None = None) -> ToolCallReading | None:
        """How the engine reads the answer's calls (``None`` when calls are not parsed),
        ``requested`` the request's own constraint: beside ``"auto"`` the answer is the calls
        or that (JSON) answer, and the model's own odds of opening a call choose which
        (``ToolCallReading.decides_call``)."""
        if self.syntax is None:
            return None
        form = self.syntax.form
        names = (
            {}
            if form is None or self.choice == "none"
            else {form.tag(name, {}, max_whitespace=None)["begin"]: name for name in self.allowed}
        )
        return ToolCallReading(
            syntax=self.syntax,
            schemas=self.schemas,
            parallel=self.parallel,
            names=names,
            decides_call=form is not None
            and self.choice == "auto"
            and requested is not None
            and form.trigger[0] not in _JSON_OPENERS,
        )

    def constraint(
        self,
        requested: RequestedConstraint | None,
        *,
        backend: str | None,
        max_whitespace: int | None,
    ) -> RequestedConstraint | None:
        """The constraint of the request: the tool calls' structural tag, the request's own
        constraint when the tools ask for none, or under ``tool_choice: "auto"`` with a JSON
        answer format, either: the calls, or the JSON answer.

        Raises:
            APIError: 400 when required calls meet another constraint, or ``auto`` meets
                one that is not JSON.
        """
        if self.choice == "none" or self.syntax is None or self.syntax.form is None:
            return requested
        tools = [(name, self.schemas.parameters.get(name) or {"type": "object"}) for name in self.allowed]
        if requested is not None and (self.choice != "auto" or requested.constraint.kind not in _JSON_KINDS):
            raise bad_request(
                f"give tools (tool_choice {self.choice!r}) or {requested.param}, not both: the answer is either "
                'tool calls or the constrained text; use tool_choice: "none" to constrain the text'
                + ("" if self.choice != "auto" else ', or a JSON answer format beside tool_choice: "auto"'),
                param=requested.param,
                code="conflicting_constraints",
            )
        tag = tool_call_structural_tag(
            self.syntax.form,
            tools,
            mode="required" if self.choice == "required" or requested is not None else "auto",
            parallel=self.parallel,
            max_whitespace=max_whitespace,
        )
        strict = self.strict
        if requested is not None:
            answer: dict[str, Any] = {"type": "json_schema", "json_schema": requested.constraint.document}
            if max_whitespace is not None:
                answer["max_whitespace_cnt"] = max_whitespace
            tag = {"type": "structural_tag", "format": {"type": "or", "elements": [tag["format"], answer]}}
            strict = requested.strict if strict is None else strict
        return RequestedConstraint(
            constraint=Constraint.structural_tag(tag), param="tools", backend=backend, strict=strict
        )


def tool_plan(tools_value: Any, tool_choice: Any, parallel: Any, family: ReasoningFamily) -> ToolPlan:
    """Read and check a request's ``tools``, ``tool_choice`` and ``parallel_tool_calls``
    (OpenAI chat's shapes; the other APIs translate theirs to these).

    Raises:
        APIError: 400 naming the field for a malformed tool, an unknown or duplicate
            name, a ``tool_choice`` that names no given tool or needs tools there are
            none of, or a family that cannot make the calls asked for.
    """
    tools = _checked_tools(tools_value)
    if parallel is not None and not isinstance(parallel, bool):
        raise bad_request("parallel_tool_calls must be true or false", param="parallel_tool_calls")
    choice, named = _checked_choice(tool_choice, tools)
    if not tools or choice == "none":
        return ToolPlan(parallel=parallel is not False)
    names = tuple(t["function"]["name"] for t in tools)
    syntax = get_tool_call_syntax(family.tool_call_syntax) if family.tool_call_syntax else None
    if choice == "required" and (syntax is None or syntax.form is None):
        what = (
            "has no tool-call syntax"
            if syntax is None
            else f"writes calls in a syntax ({syntax.name}) that cannot be constrained"
        )
        raise bad_request(
            f"tool_choice {'naming a function' if named else repr(choice)} needs a constrained call, and this model's "
            f'family ({family.name}) {what}; use tool_choice "auto"',
            param="tool_choice",
            code="unsupported_tool_choice",
        )
    return ToolPlan(
        tools=tools,
        schemas=ToolSchemas.from_tools(tools),
        choice=choice,
        allowed=(named,) if named else names,
        parallel=parallel is not False,
        syntax=syntax,
        strict=_strictness(tools_value),
    )


def _strictness(tools: list[dict[str, Any]]) -> bool | None:
    """Strict mode as the tools ask (see :attr:`ToolPlan.strict`; ``tools`` checked)."""
    asked = {t["function"].get("strict") for t in tools} - {None}
    return True if True in asked else (False if asked else None)


def _checked_tools(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise bad_request("tools must be a list of tools", param="tools")
    if len(value) > MAX_TOOLS:
        raise bad_request(f"tools takes at most {MAX_TOOLS} tools, got {len(value)}", param="tools")
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise bad_request(f"{where} must be an object", param=where)
        if tool.get("type", "function") != "function":
            raise bad_request(
                f'{where}.type must be "function", got {tool.get("type")!r}', param=f"{where}.type"
            )
        function = tool.get("function")
        if not isinstance(function, dict):
            raise bad_request(f"{where}.function must be an object", param=f"{where}.function")
        name = function.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise bad_request(
                f"{where}.function.name must be 1 to 64 letters, digits, '_', '.' or '-', got {name!r}",
                param=f"{where}.function.name",
            )
        if name in seen:
            raise bad_request(
                f"{where}.function.name {name!r} is given twice", param=f"{where}.function.name"
            )
        seen.add(name)
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise bad_request(
                f"{where}.function.description must be a string", param=f"{where}.function.description"
            )
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise bad_request(
                f"{where}.function.parameters must be a JSON Schema object",
                param=f"{where}.function.parameters",
            )
        strict = function.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise bad_request(
                f"{where}.function.strict must be true or false", param=f"{where}.function.strict"
            )
        clean: dict[str, Any] = {"name": name, "parameters": parameters}
        if description is not None:
            clean["description"] = description
        out.append({"type": "function", "function": clean})
    return out


def _checked_choice(value: Any, tools: list[dict[str, Any]]) -> tuple[Choice, str | None]:
    if value is None:
        return ("auto" if tools else "none"), None
    if isinstance(value, str):
        if value not in ("none", "auto", "required"):
            raise bad_request(
                f'tool_choice must be "none", "auto", "required" or a function, got {value!r}',
                param="tool_choice",
            )
        if value == "required" and not tools:
            raise bad_request('tool_choice "required" needs tools', param="tool_choice")
        return value, None  # type: ignore[return-value]
    if isinstance(value, dict):
        function = value.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if value.get("type") != "function" or not isinstance(name, str):
            raise bad_request(
                'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
                param="tool_choice",
            )
        known = [t["function"]["name"] for t in tools]
        if name not in known:
            raise bad_request(
                f"tool_choice names function {name!r}, which is not among the tools ({', '.join(known) or 'none given'})",
                param="tool_choice.function.name",
            )
        return "required", name
    raise bad_request('tool_choice must be "none", "auto", "required" or a function', param="tool_choice")


# ---- answers ---------------------------------------------------------------------------


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def finished_with(finish_reason: str | None, calls: int) -> str | None:
    """The wire finish reason: ``"tool_calls"`` when a stopped answer made calls."""
    return "tool_calls" if calls and finish_reason == "stop" else finish_reason


def message_calls(calls: Sequence[ToolCall]) -> list[ToolCallOut] | None:
    """A whole answer's calls as ``message.tool_calls`` (``None`` when it made none)."""
    if not calls:
        return None
    return [
        ToolCallOut(id=call_id(), function=FunctionCall(name=c.name, arguments=c.arguments)) for c in calls
    ]


def whole_calls(calls: Sequence[ToolCall]) -> list[ToolCallDelta]:
    """A whole answer's calls as one piece each (what a stream's pieces join to)."""
    from thinkstruct.parsers.tool_calls.types import ToolCallDelta

    return [ToolCallDelta(index=i, name=c.name, arguments=c.arguments) for i, c in enumerate(calls)]


def call_pieces(deltas: Sequence[ToolCallDelta], ids: dict[int, str]) -> list[ToolCallPiece]:
    """Streamed call pieces as ``delta.tool_calls``: a call's first piece gets its id
    (kept in ``ids`` by index), its name and type; later ones only argument text."""
    pieces: list[ToolCallPiece] = []
    for delta in deltas:
        if delta.index not in ids:
            ids[delta.index] = call_id()
            pieces.append(
                ToolCallPiece(
                    index=delta.index,
                    id=ids[delta.index],
                    type="function",
                    function=FunctionCallPiece(name=delta.name, arguments=delta.arguments),
                )
            )
        elif delta.arguments:
            pieces.append(
                ToolCallPiece(index=delta.index, function=FunctionCallPiece(arguments=delta.arguments))
            )
    return pieces


def template_tools(plan: ToolPlan) -> Sequence[Mapping[str, Any]] | None:
    """The tools the chat template describes."""
    return plan.tools


__all__ = [
    "ToolPlan",
    "call_pieces",
    "finished_with",
    "message_calls",
    "template_tools",
    "tool_plan",
]
