"""A tool-call syntax: where calls start in the content and how a call section is read.

A :class:`ToolCallSyntax` is one registry entry. It names the texts that open a *call
section* (``<tool_call>``, ``[TOOL_CALLS]``, ``<｜DSML｜tool_calls>``...) and implements
:meth:`ToolCallSyntax.scan`: given the text of a section from its opening marker to
wherever the output has got to, it returns the calls read so far, the content the
section itself carries (a harmony preamble, or the marker when the section is not a call
after all) and where the section ends.

``scan`` is a pure function of the text, and what it reports for a prefix is a prefix of
what it reports for any longer text: names appear once complete, argument text and
content only grow. :class:`~thinkstruct.parsers.tool_calls.ToolCallParser` relies on this
to stream a call by re-reading its section as text arrives, and the property tests check
it by comparing every chunking of an output with the whole.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from thinkstruct.parsers.tool_calls.forms import CallForm
from thinkstruct.parsers.tool_calls.types import ToolSchemas
from thinkstruct.registry import Registry


@dataclass(slots=True)
class ScannedCall:
    """A call read from a section: its name and the argument JSON text settled so far."""

    name: str
    arguments: str = ""


@dataclass(slots=True)
class SectionScan:
    """What :meth:`ToolCallSyntax.scan` read.

    Attributes:
        calls: the calls whose names are known, in order.
        end: the index in the scanned text where the section ends (content resumes
            there); ``None`` while it may still go on.
        content: content carried by the section, settled so far. A section that turns
            out not to be a call ends after its marker with the marker as content.
    """

    calls: list[ScannedCall] = field(default_factory=list)
    end: int | None = None
    content: str = ""


def not_a_call(marker: str) -> SectionScan:
    """The scan of a section that is not a tool call: its marker is plain content."""
    return SectionScan([], len(marker), marker)


class ToolCallSyntax:
    """One way of writing tool calls. Subclasses set the class attributes and :meth:`scan`.

    Attributes:
        name: registry name (``"hermes"``, ``"dsml"``, ...).
        starts: texts that open a section wherever they appear in the content.
        leading_starts: texts that open a section only at the very beginning of the
            content (after whitespace): Llama 3's bare ``{`` and the pythonic ``[``.
        description: one line for docs.
        form: how a grammar writes a call of this syntax
            (:class:`~thinkstruct.parsers.tool_calls.forms.CallForm`); ``None`` when calls
            cannot be constrained (the answer is then only parsed).
    """

    name: str = ""
    starts: tuple[str, ...] = ()
    leading_starts: tuple[str, ...] = ()
    description: str = ""
    form: CallForm | None = None

    def scan(self, text: str, *, final: bool, schemas: ToolSchemas) -> SectionScan:
        """Read the section at the start of ``text`` (which begins with one of the
        markers). ``final``: the output ends with ``text``; the section must then end too
        (a cut-off call keeps the arguments written so far)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<tool-call syntax {self.name!r}>"


def _check_syntax(syntax: ToolCallSyntax) -> None:
    if not syntax.name or not (syntax.starts or syntax.leading_starts):
        raise ValueError("a tool-call syntax needs a name and at least one start marker")


_syntaxes: Registry[ToolCallSyntax] = Registry("tool-call syntax", ToolCallSyntax, check=_check_syntax)
register_tool_call_syntax = _syntaxes.register
unregister_tool_call_syntax = _syntaxes.unregister
get_tool_call_syntax = _syntaxes.get
tool_call_syntaxes = _syntaxes.snapshot


# ---- helpers shared by the syntaxes ------------------------------------------------------


def partial_prefix(text: str, i: int, options: Iterable[str]) -> bool:
    """Whether ``text[i:]`` (non-empty or empty) is a proper beginning of one of ``options``:
    the text ends before it can be told apart."""
    rest = text[i:]
    return any(len(rest) < len(o) and o.startswith(rest) for o in options)


def held_suffix(text: str, closers: Iterable[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper beginning of a closer."""
    best = 0
    for closer in closers:
        for k in range(min(len(closer) - 1, len(text)), best, -1):
            if text.endswith(closer[:k]):
                best = k
                break
    return best


def json_text(value: object) -> str:
    """``value`` as JSON text, as ``json.dumps`` writes it (``", "`` and ``": "``)."""
    return json.dumps(value, ensure_ascii=False)


def escape_piece(text: str) -> str:
    """``text`` as the inside of a JSON string; escaping is per character, so the pieces of
    a string escape to the pieces of its escape."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


def convert_value(raw: str, kind: str) -> str:
    """JSON text for a complete raw parameter value of ``kind`` (see
    :meth:`~thinkstruct.parsers.tool_calls.ToolSchemas.kind`)."""
    if kind != "string":
        stripped = raw.strip()
        try:
            return json_text(json.loads(stripped))
        except ValueError:
            pass
    return json_text(raw)


class ArgumentsWriter:
    """Builds a call's argument object from ``key = raw value`` pairs, settled prefix only.

    A string value streams as it is written; any other value is written once complete
    (it must be parsed first). Nothing of a pair is written before its kind is known, so
    the text only ever grows.
    """

    __slots__ = ("_count", "_open", "_parts")

    def __init__(self) -> None:
        self._parts = ["{"]
        self._count = 0
        self._open = True  # False once a pair is cut off: nothing may follow it

    def pair(self, key: str, raw: str, *, kind: str, complete: bool) -> None:
        """Add a pair whose value is ``raw`` so far (``complete`` when it has ended)."""
        if not self._open:
            return
        if kind == "string":
            head = (", " if self._count else "") + json_text(key) + ': "'
            self._parts.append(head + escape_piece(raw) + ('"' if complete else ""))
        elif complete:
            self._parts.append(
                (", " if self._count else "") + json_text(key) + ": " + convert_value(raw, kind)
            )
        else:
            self._open = False
            return
        self._count += 1
        if not complete:
            self._open = False

    def text(self, *, closed: bool) -> str:
        """The argument text so far; ``closed`` adds the closing brace."""
        body = "".join(self._parts)
        return body + "}" if closed and self._open else body
