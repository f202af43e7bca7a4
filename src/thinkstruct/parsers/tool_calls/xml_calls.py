"""Syntaxes that write each parameter as an XML-like element: Qwen3-Coder's
``<function=f><parameter=p>v</parameter></function>``, DeepSeek's DSML, MiniMax-M2's
``<invoke name="f"><parameter name="p">v</parameter></invoke>`` and GLM-4.5/4.7's
``<arg_key>p</arg_key><arg_value>v</arg_value>`` pairs.

A value is text; whether it is a string or JSON comes from the tool's parameter schema
(DSML says so itself with ``string="true|false"``). The arguments are rebuilt as a JSON
object in the order the parameters were written; a string value streams as it is
written, any other once complete.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from thinkstruct.parsers.tool_calls import forms
from thinkstruct.parsers.tool_calls.forms import CallForm
from thinkstruct.parsers.tool_calls.json_scan import skip_ws
from thinkstruct.parsers.tool_calls.syntax import (
    ArgumentsWriter,
    ScannedCall,
    SectionScan,
    ToolCallSyntax,
    held_suffix,
    not_a_call,
    partial_prefix,
)
from thinkstruct.parsers.tool_calls.types import ToolSchemas


@dataclass(frozen=True, slots=True)
class XmlDialect:
    """How one syntax spells invocations and parameters.

    Attributes:
        invoke_open, name_end, invoke_close: ``<function=`` NAME ``>`` … ``</function>``.
        param_open, param_close: ``<parameter=`` HEADER ``>`` VALUE ``</parameter>``.
        quoted: the header is ``name="p" attr="v"`` (else the bare name).
        strip_newlines: whitespace right after the opening and right before the closing
            element is layout, not the value.
    """

    invoke_open: str
    name_end: str
    invoke_close: str
    param_open: str
    param_close: str
    quoted: bool
    strip_newlines: bool


QWEN_XML = XmlDialect(
    "<function=", ">", "</function>", "<parameter=", "</parameter>", quoted=False, strip_newlines=True
)
MINIMAX_XML = XmlDialect(
    '<invoke name="', '">', "</invoke>", '<parameter name="', "</parameter>", quoted=True, strip_newlines=True
)
DSML_XML = XmlDialect(
    '<｜DSML｜invoke name="',
    '">',
    "</｜DSML｜invoke>",
    '<｜DSML｜parameter name="',
    "</｜DSML｜parameter>",
    quoted=True,
    strip_newlines=False,
)

_STRING_ATTR = re.compile(r'\bstring="(true|false)"')


def settled_value(raw: str, *, complete: bool, strip_newlines: bool) -> str:
    """The part of a raw value that is settled: with ``strip_newlines``, whitespace around
    the value is layout, as the grammars of these syntaxes read it (Qwen writes
    ``<parameter=p>\nvalue\n</parameter>``), so it is dropped, and while the value is
    open trailing whitespace is held (more text may follow it)."""
    if strip_newlines:
        return raw.strip()
    return raw


def read_value(
    text: str, v: int, close: str, writer: ArgumentsWriter, key: str, kind: str, *, strip_newlines: bool
) -> int | None:
    """Read the value starting at ``text[v]`` up to ``close`` into ``writer``; the index
    after ``close``, or ``None`` while the value is open."""
    c = text.find(close, v)
    if c < 0:
        raw = text[v:]
        raw = raw[: len(raw) - held_suffix(raw, (close,))]
        writer.pair(
            key, settled_value(raw, complete=False, strip_newlines=strip_newlines), kind=kind, complete=False
        )
        return None
    writer.pair(
        key, settled_value(text[v:c], complete=True, strip_newlines=strip_newlines), kind=kind, complete=True
    )
    return c + len(close)


def scan_invokes(
    text: str,
    i: int,
    dialect: XmlDialect,
    schemas: ToolSchemas,
    *,
    final: bool,
    section_end: tuple[str, ...],
    multiple: bool,
) -> tuple[list[ScannedCall], int | None, bool]:
    """Invocations from ``text[i]`` on, up to one of ``section_end``.

    Returns ``(calls, end, ok)`` as :func:`~thinkstruct.parsers.tool_calls.json_calls.scan_objects`.
    """
    n = len(text)
    calls: list[ScannedCall] = []
    cut = n if final else None
    d = dialect
    while True:
        i = skip_ws(text, i)
        for closer in section_end:
            if text.startswith(closer, i):
                return calls, i + len(closer), True
        if i >= n or partial_prefix(text, i, (d.invoke_open, *section_end)):
            return calls, cut, True
        if not text.startswith(d.invoke_open, i) or (calls and not multiple):
            return calls, i, False
        j = i + len(d.invoke_open)
        k = text.find(d.name_end, j)
        if k < 0:
            return calls, cut, True
        name = text[j:k].strip()
        if not name or "\n" in name or "<" in name:
            return calls, i, False
        writer = ArgumentsWriter()
        call = ScannedCall(name, writer.text(closed=False))
        calls.append(call)
        p = k + len(d.name_end)
        while True:
            p = skip_ws(text, p)
            if text.startswith(d.invoke_close, p):
                call.arguments = writer.text(closed=True)
                i = p + len(d.invoke_close)
                break
            if p >= n or partial_prefix(text, p, (d.invoke_close, d.param_open)):
                call.arguments = writer.text(closed=False)
                return calls, cut, True
            if not text.startswith(d.param_open, p):
                call.arguments = writer.text(closed=False)
                return calls, p, False
            h = p + len(d.param_open)
            he = text.find(">", h)
            if he < 0:
                call.arguments = writer.text(closed=False)
                return calls, cut, True
            header = text[h:he]
            if d.quoted:
                key, _, attrs = header.partition('"')
                m = _STRING_ATTR.search(attrs)
                kind = ("string" if m.group(1) == "true" else "json") if m else schemas.kind(name, key)
            else:
                key = header.strip()
                kind = schemas.kind(name, key)
            after = read_value(
                text, he + 1, d.param_close, writer, key, kind, strip_newlines=d.strip_newlines
            )
            call.arguments = writer.text(closed=False)
            if after is None:
                return calls, cut, True
            p = after


class XmlSectionSyntax(ToolCallSyntax):
    """A section marker, invocations in an :class:`XmlDialect`, an end marker."""

    def __init__(
        self,
        name: str,
        starts: tuple[str, ...],
        ends: tuple[str, ...],
        dialect: XmlDialect,
        *,
        description: str = "",
        form: CallForm | None = None,
    ) -> None:
        self.name = name
        self.starts = starts
        self.ends = ends
        self.dialect = dialect
        self.description = description
        self.form = form

    def scan(self, text: str, *, final: bool, schemas: ToolSchemas) -> SectionScan:
        marker = next(m for m in self.starts if text.startswith(m))
        calls, end, ok = scan_invokes(
            text, len(marker), self.dialect, schemas, final=final, section_end=self.ends, multiple=True
        )
        if not calls:
            if end is None:
                return SectionScan()
            if ok and any(text.startswith(e, end - len(e)) for e in self.ends):
                return SectionScan([], end)  # an empty section carries nothing
            return not_a_call(marker)
        return SectionScan(calls, end)


class Glm45Syntax(ToolCallSyntax):
    """GLM-4.5/4.6 ``<tool_call>NAME\\n<arg_key>k</arg_key>\\n<arg_value>v</arg_value>\\n</tool_call>``
    and GLM-4.7's same form without the newlines."""

    name = "glm45"
    starts = ("<tool_call>",)
    description = "GLM-4.5/4.7: <tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>"

    def __init__(self, name: str = "glm45", *, form: CallForm | None = forms.GLM45) -> None:
        self.name = name
        self.form = form

    END = "</tool_call>"
    KEY, KEY_END = "<arg_key>", "</arg_key>"
    VALUE, VALUE_END = "<arg_value>", "</arg_value>"

    def scan(self, text: str, *, final: bool, schemas: ToolSchemas) -> SectionScan:
        marker = self.starts[0]
        n = len(text)
        cut = n if final else None
        # GLM writes the name right after the marker; layout whitespace is tolerated.
        s = skip_ws(text, len(marker))
        if s >= n:
            return not_a_call(marker) if final else SectionScan()
        if not _glm_name_start(text[s]):
            return not_a_call(marker)
        ends = [at for at in (text.find("\n", s), text.find(self.KEY, s), text.find(self.END, s)) if at >= 0]
        if not ends:
            return not_a_call(marker) if final else SectionScan()
        k = min(ends)
        name = text[s:k].strip()
        if any(c in name for c in '<>{}"\n'):
            return not_a_call(marker)
        writer = ArgumentsWriter()
        call = ScannedCall(name, writer.text(closed=False))
        p = k
        while True:
            p = skip_ws(text, p)
            if text.startswith(self.END, p):
                call.arguments = writer.text(closed=True)
                return SectionScan([call], p + len(self.END))
            if p >= n or partial_prefix(text, p, (self.END, self.KEY)):
                call.arguments = writer.text(closed=False)
                return SectionScan([call], cut)
            if not text.startswith(self.KEY, p):
                call.arguments = writer.text(closed=False)
                return SectionScan([call], p)
            ke = text.find(self.KEY_END, p + len(self.KEY))
            if ke < 0:
                return SectionScan([call], cut)
            key = text[p + len(self.KEY) : ke].strip()
            q = skip_ws(text, ke + len(self.KEY_END))
            if q >= n or partial_prefix(text, q, (self.VALUE,)):
                return SectionScan([call], cut)
            if not text.startswith(self.VALUE, q):
                return SectionScan([call], q)
            after = read_value(
                text,
                q + len(self.VALUE),
                self.VALUE_END,
                writer,
                key,
                schemas.kind(name, key),
                strip_newlines=True,
            )
            call.arguments = writer.text(closed=False)
            if after is None:
                return SectionScan([call], cut)
            p = after


def _glm_name_start(c: str) -> bool:
    return c.isalnum() or c == "_"
