"""What a tool-call parser returns, whole and streamed, and the tool schemas it reads.

A call's ``arguments`` is always JSON text (the OpenAI ``function.arguments`` string):
for JSON syntaxes the text the model wrote, for the others (XML parameters, Python
keywords, Gemma's bare keys) a JSON object built from the parameters in the order the
model wrote them. A streamed call arrives as :class:`ToolCallDelta` pieces: the first for
an index carries the name, later ones only more argument text; joined per index they
equal the whole-text :class:`ToolCall`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call found in a whole output.

    Attributes:
        index: position among the output's calls, from 0.
        name: the function name as the model wrote it.
        arguments: JSON text of the arguments (possibly cut short if the output was).
    """

    index: int
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A streamed piece of the call at ``index``: ``name`` is set on its first piece only
    (``None`` after), ``arguments`` is the next piece of its argument text."""

    index: int
    name: str | None
    arguments: str


class ToolParseResult(NamedTuple):
    """A whole output split into the text meant for the user and the tool calls."""

    content: str
    calls: tuple[ToolCall, ...]


class ToolStreamResult(NamedTuple):
    """What one streamed chunk settled: content text and call pieces (either may be empty)."""

    content: str = ""
    calls: tuple[ToolCallDelta, ...] = ()


EMPTY_STREAM_RESULT = ToolStreamResult("", ())


@dataclass(frozen=True, slots=True)
class ToolSchemas:
    """The tools of a request, by function name: each one's ``parameters`` JSON Schema.

    Syntaxes that do not write JSON (XML parameters, GLM's key/value pairs) need the
    schema to tell a string parameter (written raw) from a number or an object (written
    as JSON); with no schema for a parameter the value is read as JSON when it parses and
    as a string otherwise.
    """

    parameters: Mapping[str, Mapping[str, Any]]

    @classmethod
    def from_tools(cls, tools: Iterable[Mapping[str, Any]] | ToolSchemas | None) -> ToolSchemas:
        """From OpenAI ``tools`` (``{"type": "function", "function": {"name", "parameters"}}``),
        bare ``{"name", "parameters"}`` objects, or ``None``; malformed entries are skipped
        (the server validates the request before it gets here)."""
        if isinstance(tools, ToolSchemas):
            return tools
        found: dict[str, Mapping[str, Any]] = {}
        for tool in tools or ():
            if not isinstance(tool, Mapping):
                continue
            function = tool.get("function", tool)
            if not isinstance(function, Mapping):
                continue
            name = function.get("name")
            params = function.get("parameters")
            if isinstance(name, str):
                found[name] = params if isinstance(params, Mapping) else {}
        return cls(found)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.parameters)

    def kind(self, function: str, parameter: str) -> str:
        """How a raw parameter value is read: ``"string"`` (kept as text), ``"json"`` (a
        JSON value; a value that does not parse is kept as text), or ``"guess"`` (no
        schema: JSON when it parses, text otherwise)."""
        schema = self.parameters.get(function)
        if not schema:
            return "guess"
        props = schema.get("properties")
        prop = props.get(parameter) if isinstance(props, Mapping) else None
        if not isinstance(prop, Mapping):
            return "guess"
        types = prop.get("type")
        if isinstance(types, str):
            types = [types]
        if isinstance(types, list) and types:
            if types == ["string"]:
                return "string"
            return "guess" if "string" in types else "json"
        enum = prop.get("enum")
        if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
            return "string"
        if "const" in prop and isinstance(prop["const"], str):
            return "string"
        return "guess"


NO_TOOLS = ToolSchemas({})
