"""Syntaxes of their own: gpt-oss harmony commentary messages, pythonic call lists and
Gemma 4's ``call:NAME{key:value}``."""

from __future__ import annotations

import ast
import json
import re

from thinkstruct.parsers.tool_calls import forms
from thinkstruct.parsers.tool_calls.json_scan import scan_arguments, skip_ws
from thinkstruct.parsers.tool_calls.syntax import (
    ArgumentsWriter,
    ScannedCall,
    SectionScan,
    ToolCallSyntax,
    held_suffix,
    json_text,
    not_a_call,
    partial_prefix,
)
from thinkstruct.parsers.tool_calls.types import ToolSchemas

# ---- harmony (gpt-oss) -----------------------------------------------------------------

_RECIPIENT = re.compile(r"to=([^\s<]+)")


class HarmonySyntax(ToolCallSyntax):
    """gpt-oss: a message whose header names a recipient is a call,
    ``<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{...}<|call|>``
    (the recipient may also come before the channel). A message without one (a
    commentary preamble, or any channel the reasoning parser passed on raw) is content:
    its body, without the framing."""

    name = "harmony"
    starts = ("<|start|>", "<|channel|>")
    description = "gpt-oss harmony messages; a header with to=functions.NAME is a call, the body its JSON"

    MESSAGE = "<|message|>"
    ENDS = ("<|call|>", "<|end|>", "<|return|>")
    NEXT = ("<|start|>", "<|channel|>")  # a new message begun without ending this one

    def scan(self, text: str, *, final: bool, schemas: ToolSchemas) -> SectionScan:
        n = len(text)
        h = text.find(self.MESSAGE)
        if h < 0:
            # A header cut off before <|message|> carries nothing.
            return SectionScan([], n) if final else SectionScan()
        b = h + len(self.MESSAGE)
        stop, stop_len = -1, 0
        for closer in (*self.ENDS, *self.NEXT):
            at = text.find(closer, b)
            if at >= 0 and (stop < 0 or at < stop):
                stop, stop_len = at, (len(closer) if closer in self.ENDS else 0)
        end = stop + stop_len if stop >= 0 else (n if final else None)
        recipient = _RECIPIENT.search(text, 0, h)
        if recipient is None:
            body = (
                text[b:stop] if stop >= 0 else text[b : n - held_suffix(text[b:], (*self.ENDS, *self.NEXT))]
            )
            return SectionScan([], end, body)
        name = recipient.group(1)
        name = name.removeprefix("functions.")
        v = skip_ws(text, b)
        if stop >= 0:
            # Read as the open body was read, so that the text only grows.
            arguments, _, _ = scan_arguments(text[:stop], v, ())
        else:
            arguments, _, _ = scan_arguments(text, v, (*self.ENDS, *self.NEXT))
        return SectionScan([ScannedCall(name, arguments)], end)


# ---- pythonic ----------------------------------------------------------------------------

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
_PY_STRING = re.compile(
    r"""[rRbBuU]?(?:'''(?:[^\\]|\\.)*?'''|\"\"\"(?:[^\\]|\\.)*?\"\"\"|'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")""",
    re.DOTALL,
)
_OPENERS = {"(": ")", "[": "]", "{": "}"}


def scan_python_value(text: str, i: int) -> int:
    """End of a Python literal starting at ``text[i]`` (it ends before a ``,`` or ``)`` at its
    own level), -1 while the text may still complete it, -2 if it cannot be one."""
    n = len(text)
    closers: list[str] = []
    j = i
    while j < n:
        c = text[j]
        if c in "'\"" or (c in "rRbBuU" and j + 1 < n and text[j + 1] in "'\""):
            m = _PY_STRING.match(text, j)
            if m is None:
                return -1  # an open string (or one the text cuts off)
            j = m.end()
            continue
        if c in _OPENERS:
            closers.append(_OPENERS[c])
        elif c in ")]}":
            if not closers:
                return j if c == ")" and j > i else -2
            if c != closers.pop():
                return -2
        elif c == "," and not closers:
            return j if j > i else -2
        j += 1
    return -1


def python_literal(text: str) -> object:
    """The value of a Python literal, or raise ValueError."""
    try:
        return ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as exc:
        raise ValueError(str(exc)) from None


class PythonicSyntax(ToolCallSyntax):
    """``[get_weather(city="Paris"), f(n=1)]`` at the start of the answer (Llama 3.2/4,
    ToolACE), or after ``<|python_start|>`` (until ``<|python_end|>``). Keyword values are
    Python literals, written to the arguments as JSON once each is complete."""

    name = "pythonic"
    starts = ("<|python_start|>",)
    leading_starts = ("[",)
    description = "pythonic [f(a=1), g(b='x')] at the start of the answer"

    END = "<|python_end|>"

    def scan(self, text: str, *, final: bool, schemas: ToolSchemas) -> SectionScan:
        marker = self.starts[0] if text.startswith(self.starts[0]) else "["
        n = len(text)
        calls: list[ScannedCall] = []
        i = 0
        if marker != "[":
            i = skip_ws(text, len(marker))
            if i >= n:
                return not_a_call(marker) if final else SectionScan()
            if text[i] != "[":
                return not_a_call(marker)
        i += 1

        def stop(at: int | None) -> SectionScan:
            if not calls:
                return not_a_call(marker) if (at is not None or final) else SectionScan()
            return SectionScan(calls, at if at is not None else (n if final else None))

        while True:
            i = skip_ws(text, i)
            if i >= n:
                return stop(None)
            if text[i] == "]":
                end = i + 1
                j = skip_ws(text, end)
                if marker != "[":
                    if text.startswith(self.END, j):
                        end = j + len(self.END)
                    elif (j >= n or partial_prefix(text, j, (self.END,))) and not final:
                        return SectionScan(calls)
                return SectionScan(calls, end) if calls else not_a_call(marker)
            if calls:
                if text[i] != ",":
                    return stop(i)
                i = skip_ws(text, i + 1)
                if i >= n:
                    return stop(None)
            m = _DOTTED.match(text, i)
            if m is None:
                return stop(i)
            j = skip_ws(text, m.end())
            if j >= n:
                return stop(None)
            if text[j] != "(":
                return stop(i)
            # The call is reported once it is clearly one: a first keyword or ")".
            call = ScannedCall(m.group())
            writer = ArgumentsWriter()
            pairs = 0
            p = j + 1
            while True:
                call.arguments = writer.text(closed=False)
                p = skip_ws(text, p)
                if p >= n:
                    return stop(None)
                if text[p] == ")":
                    call.arguments = writer.text(closed=True)
                    if not pairs:
                        calls.append(call)
                    i = p + 1
                    break
                if pairs:
                    if text[p] != ",":
                        return stop(p)
                    p = skip_ws(text, p + 1)
                    if p >= n:
                        return stop(None)
                    if text[p] == ")":
                        continue
                k = _IDENT.match(text, p)
                if k is None:
                    return stop(p)
                q = skip_ws(text, k.end())
                if q >= n:
                    return stop(None)
                if text[q] != "=":
                    return stop(p)
                if not pairs:
                    calls.append(call)
                pairs += 1
                v = skip_ws(text, q + 1)
                if v >= n:
                    return stop(None)
                e = scan_python_value(text, v)
                if e == -1:
                    return stop(None)
                if e == -2:
                    return stop(v)
                try:
                    value = python_literal(text[v:e])
                except ValueError:
                    return stop(v)
                try:
                    writer.pair(k.group(), json_text(value), kind="json", complete=True)
                except (TypeError, ValueError):  # a literal JSON has no form for (a set, bytes)
                    writer.pair(k.group(), json_text(repr(value)), kind="json", complete=True)
                p = e


# ---- Gemma 4 -------------------------------------------------------------------------------

_GEMMA_QUOTE = '<|"|>'
_GEMMA_KEY = re.compile(r"[A-Za-z0-9_\-]+")
_GEMMA_SCALAR = re.compile(r"[^,}\]]+")


def gemma_value(text: str, i: int) -> tuple[object, int] | int:
    """Gemma 4's value syntax at ``text[i]``: ``<|"|>text<|"|>`` strings, bare keys in
    ``{k:v}``, lists, numbers and literals. ``(value, end)``, or -1 (open) / -2 (not one)."""
    n = len(text)
    if i >= n:
        return -1
    if text.startswith(_GEMMA_QUOTE, i):
        close = text.find(_GEMMA_QUOTE, i + len(_GEMMA_QUOTE))
        if close < 0:
            return -1
        return text[i + len(_GEMMA_QUOTE) : close], close + len(_GEMMA_QUOTE)
    if partial_prefix(text, i, (_GEMMA_QUOTE,)):
        return -1
    c = text[i]
    if c in "{[":
        closer = "}" if c == "{" else "]"
        items: list[object] = []
        obj: dict[str, object] = {}
        j = i + 1
        first = True
        while True:
            j = skip_ws(text, j)
            if j >= n:
                return -1
            if text[j] == closer:
                return (obj if c == "{" else items), j + 1
            if not first:
                if text[j] != ",":
                    return -2
                j = skip_ws(text, j + 1)
                if j >= n:
                    return -1
            first = False
            if c == "{":
                m = _GEMMA_KEY.match(text, j)
                if m is None:
                    return -2
                if m.end() >= n:
                    return -1
                if text[m.end()] != ":":
                    return -2
                found = gemma_value(text, skip_ws(text, m.end() + 1))
                if isinstance(found, int):
                    return found
                obj[m.group()] = found[0]
            else:
                found = gemma_value(text, j)
                if isinstance(found, int):
                    return found
                items.append(found[0])
            j = found[1]
    m = _GEMMA_SCALAR.match(text, i)
    if m is None:
        return -2
    if m.end() >= n:
        return -1
    raw = m.group().strip()
    try:
        return json.loads(raw), m.end()
    except ValueError:
        return raw, m.end()


class Gemma4Syntax(ToolCallSyntax):
    """Gemma 4: ``<|tool_call>call:NAME{key:<|"|>text<|"|>,n:3}<tool_call|>``. Each top-level
    argument is written as JSON once complete."""

    name = "gemma4"
    starts = ("<|tool_call>",)
    description = 'Gemma 4: <|tool_call>call:NAME{key:<|"|>v<|"|>,...}<tool_call|>'
    form = forms.GEMMA4

    END = "<tool_call|>"

    def scan(self, text: str, *, final: bool, schemas: ToolSchemas) -> SectionScan:
        marker = self.starts[0]
        n = len(text)
        cut = n if final else None
        i = skip_ws(text, len(marker))
        if partial_prefix(text, i, ("call:",)):
            return not_a_call(marker) if final else SectionScan()
        if not text.startswith("call:", i):
            return not_a_call(marker)
        j = i + len("call:")
        b = text.find("{", j)
        if b < 0:
            if any(c in text[j:] for c in "<}\n"):
                return not_a_call(marker)
            return not_a_call(marker) if final else SectionScan()
        name = text[j:b].strip()
        if not name or any(c in name for c in "<>{}\n "):
            return not_a_call(marker)
        writer = ArgumentsWriter()
        call = ScannedCall(name, writer.text(closed=False))
        p = b + 1
        first = True
        while True:
            p = skip_ws(text, p)
            if p >= n:
                return SectionScan([call], cut)
            if text[p] == "}":
                call.arguments = writer.text(closed=True)
                e = skip_ws(text, p + 1)
                if text.startswith(self.END, e):
                    return SectionScan([call], e + len(self.END))
                if (e >= n or partial_prefix(text, e, (self.END,))) and not final:
                    return SectionScan([call])
                return SectionScan([call], p + 1)
            if not first:
                if text[p] != ",":
                    return SectionScan([call], p)
                p = skip_ws(text, p + 1)
                if p >= n:
                    return SectionScan([call], cut)
            first = False
            m = _GEMMA_KEY.match(text, p)
            if m is None:
                return SectionScan([call], p)
            if m.end() >= n:
                return SectionScan([call], cut)
            if text[m.end()] != ":":
                return SectionScan([call], p)
            found = gemma_value(text, skip_ws(text, m.end() + 1))
            if found == -1:
                return SectionScan([call], cut)
            if isinstance(found, int):
                return SectionScan([call], p)
            writer.pair(m.group(), json_text(found[0]), kind="json", complete=True)
            call.arguments = writer.text(closed=False)
            p = found[1]
