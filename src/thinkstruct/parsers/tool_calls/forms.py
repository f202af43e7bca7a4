"""How a constrained call is written: each syntax's canonical call text, as a structural tag.

A :class:`CallForm` says what a call of one tool looks like when a grammar writes it:
the text before the arguments (the tool's name is fixed there, so no other name can be
written), how the arguments are written (JSON, or one of the XML-like parameter styles,
each held to the tool's ``parameters`` schema), the text after them, and how calls are
grouped. :func:`tool_call_structural_tag` turns the forms of a request's tools into a
structural-tag document (the ``{"type": "structural_tag", "format": ...}`` form) for
``tool_choice``:

- ``"required"`` (and a named function, with one tool): the answer is the calls and
  nothing else; at least one, only one unless parallel calls are allowed.
- ``"auto"``: free text until the syntax's trigger appears, then a call held to the schema
  of the tool it names (a lazy constraint), then free text again. Where the legacy
  ``{structures, triggers}`` form can say it (JSON arguments, calls standing alone,
  parallel calls allowed) that form is used, which llguidance compiles as well as
  xgrammar.

This module builds plain data: the grammar layer compiles it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

#: Argument styles the structural tag's ``json_schema`` content understands.
STYLES = ("json", "qwen_xml", "minimax_xml", "deepseek_xml", "glm_xml", "gemma")


@dataclass(frozen=True, slots=True)
class CallForm:
    """The canonical text of one constrained call, and of a group of them.

    Attributes:
        begin: text before the arguments; ``{name}`` stands for the tool's name (JSON
            escaped when ``json_name``).
        end: text after the arguments.
        style: how the arguments are written (:data:`STYLES`).
        trigger: text that starts a call (or a group) in free text, for ``auto``.
        separator: text between two calls.
        group_begin, group_end: text around all the calls of an answer ("" when each
            call stands alone).
        index: the calls carry a counter right after ``begin`` (Kimi-K2's ``:0``).
        json_name: the name sits inside a JSON string.
    """

    begin: str
    end: str
    style: str = "json"
    trigger: str = ""
    separator: str = ""
    group_begin: str = ""
    group_end: str = ""
    index: str = ""
    json_name: bool = False

    def __post_init__(self) -> None:
        if self.style not in STYLES:
            raise ValueError(f"unknown argument style {self.style!r}")
        head = self.group_begin or self.begin
        if not self.trigger or not head.startswith(self.trigger):
            raise ValueError("the trigger must begin the call (or the group of calls)")

    def tag(self, name: str, parameters: Mapping[str, Any], *, max_whitespace: int | None) -> dict[str, Any]:
        """The structural-tag ``tag`` of one call of tool ``name``."""
        shown = json.dumps(name, ensure_ascii=False)[1:-1] if self.json_name else name
        arguments: dict[str, Any] = {
            "type": "json_schema",
            "json_schema": dict(parameters) or {"type": "object"},
        }
        if self.style != "json":
            arguments["style"] = self.style
        if max_whitespace is not None:
            arguments["max_whitespace_cnt"] = max_whitespace
        content: dict[str, Any] = arguments
        if self.index:
            content = {
                "type": "sequence",
                "elements": [
                    {"type": "regex", "pattern": "[0-9]{1,3}"},
                    {"type": "const_string", "value": self.index},
                    arguments,
                ],
            }
        return {
            "type": "tag",
            "begin": self.begin.replace("{name}", shown),
            "content": content,
            "end": self.end,
        }


ToolChoiceMode = Literal["auto", "required"]


def tool_call_structural_tag(
    form: CallForm,
    tools: Sequence[tuple[str, Mapping[str, Any]]],
    *,
    mode: ToolChoiceMode,
    parallel: bool,
    max_whitespace: int | None = None,
) -> dict[str, Any]:
    """The structural-tag document that holds an answer's calls to ``tools``.

    Args:
        form: the family's call form.
        tools: ``(name, parameters schema)`` of each tool a call may name (one for a
            named ``tool_choice``).
        mode: ``"required"``: only calls; ``"auto"``: free text, calls where the trigger
            appears.
        parallel: more than one call may be written.
        max_whitespace: longest run of whitespace inside the arguments (the compiler's
            JSON format), ``None`` for the library's default.

    Raises:
        ValueError: no tools.
    """
    if not tools:
        raise ValueError("a tool-call constraint needs at least one tool")
    if mode == "auto" and parallel and form.style == "json" and not form.group_begin and not form.index:
        # The legacy {structures, triggers} form says the same, and llguidance compiles
        # it too (in about a millisecond), so the compiler's "auto" can choose.
        structures = [
            {
                "begin": form.tag(name, params, max_whitespace=None)["begin"],
                "schema": dict(params) or {"type": "object"},
                "end": form.end,
            }
            for name, params in tools
        ]
        return {"structures": structures, "triggers": [form.trigger]}
    tags = [form.tag(name, params, max_whitespace=max_whitespace) for name, params in tools]
    one: dict[str, Any] = tags[0] if len(tags) == 1 else {"type": "or", "elements": tags}
    calls = one
    if parallel:
        # call (separator call)*: the same language as xgrammar's tags_with_separator,
        # which compiles about ten times slower (1.2-1.9 s against 0.1 s, measured).
        more: dict[str, Any] = one
        if form.separator:
            more = {"type": "sequence", "elements": [{"type": "const_string", "value": form.separator}, one]}
        calls = {"type": "sequence", "elements": [one, {"type": "star", "content": more}]}
    if mode == "required":
        if form.group_begin:
            body: dict[str, Any] = {
                "type": "sequence",
                "elements": [
                    {"type": "const_string", "value": form.group_begin},
                    calls,
                    {"type": "const_string", "value": form.group_end},
                ],
            }
        else:
            body = calls
    elif form.group_begin:
        group = {"type": "tag", "begin": form.group_begin, "content": calls, "end": form.group_end}
        body = {
            "type": "triggered_tags",
            "triggers": [form.trigger],
            "tags": [group],
            "stop_after_first": True,
        }
    else:
        body = {
            "type": "triggered_tags",
            "triggers": [form.trigger],
            "tags": tags,
            "stop_after_first": not parallel,
        }
    return {"type": "structural_tag", "format": body}


# ---- the forms of the built-in syntaxes ----------------------------------------------------

HERMES = CallForm(
    begin='<tool_call>\n{"name": "{name}", "arguments": ',
    end="}\n</tool_call>",
    trigger="<tool_call>",
    separator="\n",
    json_name=True,
)
HERMES_LIST = CallForm(  # SmolLM2: one section holding a JSON list of calls
    begin='{"name": "{name}", "arguments": ',
    end="}",
    trigger="<tool_call>",
    separator=", ",
    group_begin="<tool_call>[",
    group_end="]</tool_call>",
    json_name=True,
)
QWEN3_CODER = CallForm(
    begin="<tool_call>\n<function={name}>\n",
    end="\n</function>\n</tool_call>",
    style="qwen_xml",
    trigger="<tool_call>",
    separator="\n",
)
LLAMA3_JSON = CallForm(
    begin='{"name": "{name}", "parameters": ', end="}", trigger='{"name": ', separator="; ", json_name=True
)
MISTRAL = CallForm(begin="[TOOL_CALLS]{name}[ARGS]", end="", trigger="[TOOL_CALLS]")
DEEPSEEK_V3 = CallForm(
    begin="<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n",
    end="\n```<｜tool▁call▁end｜>",
    trigger="<｜tool▁calls▁begin｜>",
    separator="\n",
    group_begin="<｜tool▁calls▁begin｜>",
    group_end="<｜tool▁calls▁end｜>",
)
DEEPSEEK_V31 = CallForm(
    begin="<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>",
    end="<｜tool▁call▁end｜>",
    trigger="<｜tool▁calls▁begin｜>",
    group_begin="<｜tool▁calls▁begin｜>",
    group_end="<｜tool▁calls▁end｜>",
)
DSML = CallForm(
    begin='<｜DSML｜invoke name="{name}">\n',
    end="</｜DSML｜invoke>\n",
    style="deepseek_xml",
    trigger="<｜DSML｜tool_calls>",
    group_begin="<｜DSML｜tool_calls>\n",
    group_end="</｜DSML｜tool_calls>",
)
KIMI_K2 = CallForm(
    begin="<|tool_call_begin|>functions.{name}:",
    end="<|tool_call_end|>",
    trigger="<|tool_calls_section_begin|>",
    group_begin="<|tool_calls_section_begin|>",
    group_end="<|tool_calls_section_end|>",
    index="<|tool_call_argument_begin|>",
)
GLM45 = CallForm(
    begin="<tool_call>{name}\n", end="</tool_call>", style="glm_xml", trigger="<tool_call>", separator="\n"
)
GLM47 = CallForm(begin="<tool_call>{name}", end="</tool_call>", style="glm_xml", trigger="<tool_call>")
MINIMAX_M2 = CallForm(
    begin='<invoke name="{name}">\n',
    end="</invoke>\n",
    style="minimax_xml",
    trigger="<minimax:tool_call>",
    group_begin="<minimax:tool_call>\n",
    group_end="</minimax:tool_call>",
)
GEMMA4 = CallForm(begin="<|tool_call>call:{name}", end="<tool_call|>", style="gemma", trigger="<|tool_call>")


def _json_list(start: str, end: str, *, name_key: str = "name", arguments_key: str = "arguments") -> CallForm:
    return CallForm(
        begin='{"' + name_key + '": "{name}", "' + arguments_key + '": ',
        end="}",
        trigger=start,
        separator=", ",
        group_begin=start + "[",
        group_end="]" + end,
        json_name=True,
    )


HUNYUAN = _json_list("<tool_calls>", "</tool_calls>")
GRANITE = _json_list("<|tool_call|>", "")
COHERE = _json_list("<|START_ACTION|>", "<|END_ACTION|>", name_key="tool_name", arguments_key="parameters")
