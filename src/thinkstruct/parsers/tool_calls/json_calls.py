"""Syntaxes whose arguments are JSON: hermes/Qwen, Llama 3, Mistral, JSON lists behind a
marker (Hunyuan, Granite, Cohere), Kimi-K2 and DeepSeek-V3/V3.1.

Argument text is reported as the model wrote it, growing as it arrives.
"""

from __future__ import annotations

import re

from thinkstruct.parsers.tool_calls import forms
from thinkstruct.parsers.tool_calls.forms import CallForm
from thinkstruct.parsers.tool_calls.json_scan import (
    CallObject,
    call_arguments,
    scan_arguments,
    scan_call_object,
    skip_ws,
)
from thinkstruct.parsers.tool_calls.syntax import (
    ScannedCall,
    SectionScan,
    ToolCallSyntax,
    not_a_call,
    partial_prefix,
)
from thinkstruct.parsers.tool_calls.types import ToolSchemas

NAME_KEYS = ("name",)
ARGUMENT_KEYS = ("arguments", "parameters")


def named(found: CallObject) -> ScannedCall | None:
    """The call ``found`` describes, once its name is known."""
    if found.name is None:
        return None
    return ScannedCall(found.name, call_arguments(found))


def scan_objects(
    text: str,
    i: int,
    *,
    final: bool,
    name_keys: tuple[str, ...] = NAME_KEYS,
    argument_keys: tuple[str, ...] = ARGUMENT_KEYS,
) -> tuple[list[ScannedCall], int | None, bool]:
    """A call object or a JSON list of them at ``text[i]`` (``{`` or ``[``).

    Returns ``(calls, end, ok)``: ``end`` is the index after the value (``None`` while
    open; the text's end when ``final``); ``ok`` is False when the text stopped being
    calls (at ``end``), e.g. an object without a name.
    """
    n = len(text)
    calls: list[ScannedCall] = []
    if text[i] == "{":
        found = scan_call_object(text, i, name_keys=name_keys, argument_keys=argument_keys)
        call = named(found)
        if call is not None:
            calls.append(call)
        if found.error is not None:
            return calls, found.error, False
        if found.end is None:
            return calls, (n if final else None), call is not None or not final
        return calls, found.end, call is not None
    # a list: [obj, obj, ...]
    j = i + 1
    first = True
    while True:
        j = skip_ws(text, j)
        if j >= n:
            return calls, (n if final else None), bool(calls) or not final
        c = text[j]
        if c == "]":
            return calls, j + 1, bool(calls)
        if not first:
            if c != ",":
                return calls, j, False
            j = skip_ws(text, j + 1)
            if j >= n:
                return calls, (n if final else None), bool(calls) or not final
            c = text[j]
        if c != "{":
            return calls, j, False
        found = scan_call_object(text, j, name_keys=name_keys, argument_keys=argument_keys)
        call = named(found)
        if call is not None:
            calls.append(call)
        if found.error is not None:
            return calls, found.error, False
        if found.end is None:
            return calls, (n if final else None), call is not None or not final
        if call is None:
            return calls, j, False
        j = found.end
        first = False


class JsonSectionSyntax(ToolCallSyntax):
    """A marker, then a call object or a JSON list of call objects, then an optional end
    marker: ``<tool_calls>[{"name": "f", "arguments": {...}}]</tool_calls>``."""

    end_marker: str | None = None
    name_keys: tuple[str, ...] = NAME_KEYS
    argument_keys: tuple[str, ...] = ARGUMENT_KEYS

    def __init__(
        self,
        name: str,
        start: str,
        end: str | None,
        *,
        name_keys: tuple[str, ...] = NAME_KEYS,
        argument_keys: tuple[str, ...] = ARGUMENT_KEYS,
        description: str = "",
        form: CallForm | None = None,
    ) -> None:
        self.name = name
        self.starts = (start,)
        self.end_marker = end
        self.name_keys = name_keys
        self.argument_keys = argument_keys
        self.description = description
        self.form = form

    def scan(self, text: str, *, final: bool, schemas: ToolSchemas) -> SectionScan:
        marker = self.starts[0]
        i = skip_ws(text, len(marker))
        if i >= len(text):
            return not_a_call(marker) if final else SectionScan()
        if text[i] not in "{[":
            return self._other(text, i, final=final, schemas=schemas)
        calls, end, ok = scan_objects(
            text, i, final=final, name_keys=self.name_keys, argument_keys=self.argument_keys
        )
        return close_section(text, calls, end, ok, marker=marker, end_marker=self.end_marker, final=final)

    def _other(self, text: str, i: int, *, final: bool, schemas: ToolSchemas) -> SectionScan:
        """A section whose body is not JSON (subclasses may read other forms)."""
        return not_a_call(self.starts[0])


def close_section(
    text: str,
    calls: list[ScannedCall],
    end: int | None,
    ok: bool,
    *,
    marker: str,
    end_marker: str | None,
    final: bool,
) -> SectionScan:
    """The section scan after its calls: look for the end marker after ``end``."""
    if not calls:
        if end is None:
            return SectionScan()
        return not_a_call(marker)
    if end is None or not ok or end_marker is None:
        return SectionScan(calls, end)
    j = skip_ws(text, end)
    if text.startswith(end_marker, j):
        return SectionScan(calls, j + len(end_marker))
    if j >= len(text) or partial_prefix(text, j, (end_marker,)):
        return SectionScan(calls, len(text) if final else None)
    return SectionScan(calls, end)  # the end marker was left out: content resumes


class HermesSyntax(JsonSectionSyntax):
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Hermes, Qwen2.5/3),
    a JSON list of calls inside one section (SmolLM2), or Qwen3-Coder's XML body
    ``<tool_call><function=f><parameter=p>v</parameter></function></tool_call>`` (Qwen3.5,
    Nemotron 3): one family's model may write any of them."""

    def __init__(
        self, name: str = "hermes", *, form: CallForm | None = forms.HERMES, description: str = ""
    ) -> None:
        super().__init__(
            name,
            "<tool_call>",
            "</tool_call>",
            description=description
            or "<tool_call> with a JSON call (or list), or Qwen3-Coder's <function=...> XML body",
            form=form,
        )

    def _other(self, text: str, i: int, *, final: bool, schemas: ToolSchemas) -> SectionScan:
        from thinkstruct.parsers.tool_calls.xml_calls import QWEN_XML, scan_invokes

        head = QWEN_XML.invoke_open
        if text.startswith(head, i):
            calls, end, _ = scan_invokes(
                text, i, QWEN_XML, schemas, final=final, section_end=("</tool_call>",), multiple=False
            )
            if not calls and end is not None:
                return not_a_call(self.starts[0])
            return SectionScan(calls, end)
        if partial_prefix(text, i, (head,)) and not final:
            return SectionScan()
        return not_a_call(self.starts[0])


class Llama3JsonSyntax(ToolCallSyntax):
    """Llama 3.1-3.3 JSON calls: ``{"name": "f", "parameters": {...}}`` at the start of the
    answer (or after ``<|python_tag|>``), several separated by ``;``. A call is reported
    once its object is complete: until then it may be an ordinary JSON answer."""

    name = "llama3-json"
    starts = ("<|python_tag|>",)
    leading_starts = ("{",)
    description = 'Llama 3 JSON: {"name": ..., "parameters": {...}} at the start, ";"-separated'
    form = forms.LLAMA3_JSON

    def scan(self, text: str, *, final: bool, schemas: ToolSchemas) -> SectionScan:
        marker = self.starts[0] if text.startswith(self.starts[0]) else "{"
        i = len(marker) if marker != "{" else 0
        n = len(text)
        calls: list[ScannedCall] = []
        while True:
            i = skip_ws(text, i)
            if i >= n:
                if not calls:
                    return not_a_call(marker) if final else SectionScan()
                return SectionScan(calls, n if final else None)
            if text[i] != "{":
                return SectionScan(calls, i) if calls else not_a_call(marker)
            found = scan_call_object(text, i, argument_keys=ARGUMENT_KEYS)
            if found.end is None and found.error is None and not final:
                return SectionScan(calls)
            if found.end is None or found.name is None or found.arguments is None:
                return SectionScan(calls, i) if calls else not_a_call(marker)
            calls.append(ScannedCall(found.name, found.arguments))
            j = skip_ws(text, found.end)
            if j < n and text[j] == ";":
                i = j + 1
                continue
            if j < n and text[j] != "{":
                return SectionScan(calls, found.end)
            i = j


_MISTRAL_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


class MistralSyntax(ToolCallSyntax):
    """Mistral: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}]`` (v3 tokenizer) or
    ``[TOOL_CALLS]name[ARGS]{...}`` (v11+; Magistral, Mistral Small 3.2, Devstral), with an
    optional ``[CALL_ID]id`` before ``[ARGS]``; each call of the newer form has its own
    ``[TOOL_CALLS]``."""

    name = "mistral"
    starts = ("[TOOL_CALLS]",)
    description = "[TOOL_CALLS] then a JSON list, or name[ARGS]{json} per call"
    form = forms.MISTRAL

    def scan(self, text: str, *, final: bool, schemas: ToolSchemas) -> SectionScan:
        marker = self.starts[0]
        n = len(text)
        i = skip_ws(text, len(marker))
        if i >= n:
            return not_a_call(marker) if final else SectionScan()
        if text[i] in "{[":
            calls, end, ok = scan_objects(text, i, final=final)
            return close_section(text, calls, end, ok, marker=marker, end_marker=None, final=final)
        m = _MISTRAL_NAME.match(text, i)
        if m is None:
            return not_a_call(marker)
        name = m.group()
        j = m.end()
        if j >= n:
            if final:
                return SectionScan([ScannedCall(name, "")], n)
            return SectionScan()
        if text.startswith("[CALL_ID]", j):
            k = text.find("[ARGS]", j)
            if k < 0:
                return SectionScan([ScannedCall(name, "")], n) if final else SectionScan()
            j = k
        if text.startswith("[ARGS]", j):
            j += len("[ARGS]")
        elif text[j] != "{":
            if partial_prefix(text, j, ("[ARGS]", "[CALL_ID]")) and not final:
                return SectionScan()
            return not_a_call(marker)
        v = skip_ws(text, j)
        if v >= n:
            return SectionScan([ScannedCall(name, "")], n if final else None)
        arguments, end, _ = scan_arguments(text, v, ())
        if end is None:
            return SectionScan([ScannedCall(name, arguments)], n if final else None)
        return SectionScan([ScannedCall(name, arguments)], end)


class KimiK2Syntax(ToolCallSyntax):
    """Kimi-K2: ``<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0
    <|tool_call_argument_begin|>{...}<|tool_call_end|>...<|tool_calls_section_end|>``; the
    name is the call id without ``functions.`` and the ``:index`` suffix."""

    name = "kimi-k2"
    starts = ("<|tool_calls_section_begin|>",)
    description = "Kimi-K2 tool-call section tokens, id functions.NAME:N, JSON arguments"
    form = forms.KIMI_K2

    CALL = "<|tool_call_begin|>"
    ARGS = "<|tool_call_argument_begin|>"
    CALL_END = "<|tool_call_end|>"
    SECTION_END = "<|tool_calls_section_end|>"

    def scan(self, text: str, *, final: bool, schemas: ToolSchemas) -> SectionScan:
        marker = self.starts[0]
        n = len(text)
        calls: list[ScannedCall] = []
        i = len(marker)
        while True:
            i = skip_ws(text, i)
            if text.startswith(self.SECTION_END, i):
                return SectionScan(calls, i + len(self.SECTION_END))
            if i >= n or partial_prefix(text, i, (self.CALL, self.SECTION_END)):
                return SectionScan(calls, n if final else None)
            if not text.startswith(self.CALL, i):
                return SectionScan(calls, i) if calls else not_a_call(marker)
            j = i + len(self.CALL)
            k = text.find(self.ARGS, j)
            if k < 0:
                return SectionScan(calls, n if final else None)
            call = ScannedCall(kimi_name(text[j:k].strip()))
            calls.append(call)
            v = skip_ws(text, k + len(self.ARGS))
            call.arguments, end, _ = scan_arguments(text, v, (self.CALL_END, self.SECTION_END))
            if end is None:
                return SectionScan(calls, n if final else None)
            e = skip_ws(text, end)
            if text.startswith(self.CALL_END, e):
                i = e + len(self.CALL_END)
            elif e >= n or partial_prefix(text, e, (self.CALL_END,)):
                return SectionScan(calls, n if final else None)
            else:
                i = e


def kimi_name(call_id: str) -> str:
    """``functions.get_weather:0`` -> ``get_weather``."""
    name = call_id
    head, sep, tail = name.rpartition(":")
    if sep and tail.isdigit():
        name = head
    name = name.removeprefix("functions.")
    return name


class DeepSeekV3Syntax(ToolCallSyntax):
    """DeepSeek-V3 / R1 and V3.1+ calls between ``<｜tool▁calls▁begin｜>`` and
    ``<｜tool▁calls▁end｜>``: ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```
    <｜tool▁call▁end｜>`` (V3, R1) or ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>``
    (V3.1, V3.2 non-DSML)."""

    name = "deepseek-v3"
    starts = ("<｜tool▁calls▁begin｜>",)
    description = "DeepSeek-V3/R1 (function<sep>name ```json) and V3.1 (name<sep>{json}) tool-call tokens"
    form = forms.DEEPSEEK_V3

    CALL = "<｜tool▁call▁begin｜>"
    SEP = "<｜tool▁sep｜>"
    CALL_END = "<｜tool▁call▁end｜>"
    SECTION_END = "<｜tool▁calls▁end｜>"

    def scan(self, text: str, *, final: bool, schemas: ToolSchemas) -> SectionScan:
        marker = self.starts[0]
        n = len(text)
        calls: list[ScannedCall] = []
        i = len(marker)
        cut = SectionScan(calls, n) if final else SectionScan(calls)
        while True:
            i = skip_ws(text, i)
            if text.startswith(self.SECTION_END, i):
                return SectionScan(calls, i + len(self.SECTION_END))
            if i >= n or partial_prefix(text, i, (self.CALL, self.SECTION_END)):
                return cut
            if not text.startswith(self.CALL, i):
                return SectionScan(calls, i) if calls else not_a_call(marker)
            j = i + len(self.CALL)
            s = text.find(self.SEP, j)
            if s < 0:
                return cut
            head = text[j:s].strip()
            k = s + len(self.SEP)
            fenced = False
            if head == "function":
                ahead = skip_ws(text, k)
                if ahead >= n:
                    return cut
                fenced = text[ahead] != "{"
            if fenced:  # V3: NAME\n```json\n{...}\n```
                nl = text.find("\n", k)
                if nl < 0:
                    return cut
                call = ScannedCall(text[k:nl].strip())
                calls.append(call)
                v = nl + 1
                if partial_prefix(text, v, ("```json",)) and not final:
                    return cut
                for fence in ("```json", "```"):
                    if text.startswith(fence, v):
                        v += len(fence)
                        break
                v = skip_ws(text, v)
                if v >= n:
                    return cut
                call.arguments, end, _ = scan_arguments(text, v, ("```", self.CALL_END))
                if end is None:
                    return cut
                e = skip_ws(text, end)
                if text.startswith("```", e):
                    e = skip_ws(text, e + 3)
                elif e >= n or partial_prefix(text, e, ("```",)):
                    return cut
            else:  # V3.1: NAME<sep>{...}
                call = ScannedCall(head)
                calls.append(call)
                v = skip_ws(text, k)
                if v >= n:
                    return cut
                call.arguments, end, _ = scan_arguments(text, v, (self.CALL_END,))
                if end is None:
                    return cut
                e = skip_ws(text, end)
            if text.startswith(self.CALL_END, e):
                i = e + len(self.CALL_END)
            elif e >= n or partial_prefix(text, e, (self.CALL_END,)):
                return cut
            else:
                return SectionScan(calls, e)
