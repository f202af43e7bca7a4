"""ToolCallParser: content and tool calls out of a model's answer, whole or streamed.

The parser reads the *content* a reasoning parser leaves (or a whole answer of a model
that does not reason). In content it looks for the syntax's section markers; from a
marker on, it hands the section's text to :meth:`ToolCallSyntax.scan` each time more
arrives and streams what changed: a new call's name, more argument text, more content.
Once the section ends, content resumes.

Rules, the same whole and streamed:

- Text that could still be the beginning of a marker is held back until the next chunk
  decides it; a section is held until its scan names a call (or says it is none).
- Whitespace right before a call section and right after one is dropped; everything
  else is content as written. A section that is not a call (``<tool_call>`` followed by
  prose) is content, marker included.
- An output cut off inside a call keeps the call with the arguments written so far.

``parse(text)`` runs the same machine over the whole text in one piece; the property
tests feed every text in random chunks and compare. Each section's text is re-read as
it grows, so a call costs time proportional to its length times the number of chunks
it arrives in; calls are short next to the thoughts and answers around them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from thinkstruct.parsers.tool_calls.syntax import (
    SectionScan,
    ToolCallSyntax,
    get_tool_call_syntax,
)
from thinkstruct.parsers.tool_calls.types import (
    EMPTY_STREAM_RESULT,
    ToolCall,
    ToolCallDelta,
    ToolParseResult,
    ToolSchemas,
    ToolStreamResult,
)

_CONTENT, _SECTION, _DONE = range(3)


class ToolCallParser:
    """Splits an answer into content and tool calls for one tool-call syntax.

    Args:
        syntax: a registered syntax name (``"hermes"``, ``"dsml"``, ...), a
            :class:`ToolCallSyntax`, or a reasoning family (name or entry) whose
            ``tool_call_syntax`` names one.
        tools: the request's tools (OpenAI ``tools`` list or :class:`ToolSchemas`); used
            to read parameter values of syntaxes that do not write JSON.

    Raises:
        UnknownName: unknown syntax or family.
        ValueError: the family has no tool-call syntax.
    """

    __slots__ = (
        "_after",
        "_base",
        "_begin",
        "_calls",
        "_firsts",
        "_hold_max",
        "_leading",
        "_mode",
        "_pending",
        "_section_content",
        "_section_ws",
        "_starts",
        "_ws",
        "schemas",
        "syntax",
    )

    def __init__(
        self, syntax: Any, *, tools: Iterable[Mapping[str, Any]] | ToolSchemas | None = None
    ) -> None:
        self.syntax: ToolCallSyntax = _resolve(syntax)
        self.schemas = ToolSchemas.from_tools(tools)
        self._starts = tuple(self.syntax.starts)
        self._leading = tuple(self.syntax.leading_starts)
        self._firsts = frozenset(m[0] for m in self._starts)
        self._hold_max = max(len(m) for m in (*self._starts, *self._leading))
        self.reset()

    def reset(self) -> None:
        """Forget the stream; the next :meth:`feed` starts a new output."""
        self._mode = _CONTENT
        self._pending = ""  # held text: a possible marker, or the open section
        self._ws = ""  # trailing content whitespace, dropped if a call section follows
        self._begin = True  # nothing but whitespace so far: leading markers count
        self._after = False  # right after a call section: whitespace is dropped
        self._calls: list[list[str]] = []  # [name, arguments emitted] per call
        self._base = 0  # index of the open section's first call
        self._section_content = ""
        self._section_ws = ""

    # ---- API ---------------------------------------------------------------------------

    def parse(self, text: str) -> ToolParseResult:
        """Split a whole answer. Does not touch the streaming state."""
        run = ToolCallParser(self.syntax, tools=self.schemas)
        first = run.feed(text)
        last = run.finish()
        return join_results((first, last))

    def feed(self, chunk: str) -> ToolStreamResult:
        """Take the next piece of the answer; return what it settles.

        Raises:
            RuntimeError: called after :meth:`finish` without :meth:`reset`.
        """
        if self._mode == _DONE:
            raise RuntimeError("feed() after finish(); call reset() to parse another output")
        if not chunk:
            return EMPTY_STREAM_RESULT
        # Hot path: plain content with nothing that could start a marker.
        if (
            self._mode == _CONTENT
            and not self._pending
            and not self._begin
            and not self._after
            and not any(c in chunk for c in self._firsts)
        ):
            body = chunk.rstrip()
            out = self._ws + body if body else ""
            self._ws = chunk[len(body) :] if body else self._ws + chunk
            return ToolStreamResult(out, ()) if out else EMPTY_STREAM_RESULT
        content: list[str] = []
        deltas: list[ToolCallDelta] = []
        text = self._pending + chunk
        self._pending = ""
        self._run(text, False, content, deltas)
        if not content and not deltas:
            return EMPTY_STREAM_RESULT
        return ToolStreamResult("".join(content), tuple(deltas))

    def finish(self) -> ToolStreamResult:
        """End the answer: flush held text, end an open section. Call :meth:`reset` to
        parse another output."""
        if self._mode == _DONE:
            raise RuntimeError("finish() called twice; call reset() to parse another output")
        content: list[str] = []
        deltas: list[ToolCallDelta] = []
        text = self._pending
        self._pending = ""
        self._run(text, True, content, deltas)
        if self._ws and not self._after:
            content.append(self._ws)  # content that ends in whitespace keeps it
        self._ws = ""
        self._mode = _DONE
        return ToolStreamResult("".join(content), tuple(deltas))

    @property
    def in_call(self) -> bool:
        """Whether the stream is inside a call section right now."""
        return self._mode == _SECTION

    @property
    def calls_so_far(self) -> int:
        """How many calls have been named so far."""
        return len(self._calls)

    # ---- the machine -------------------------------------------------------------------

    def _run(self, text: str, final: bool, content: list[str], deltas: list[ToolCallDelta]) -> None:
        while True:
            if self._mode == _SECTION:
                scan = self.syntax.scan(text, final=final, schemas=self.schemas)
                if final and scan.end is None:
                    scan.end = len(text)
                self._emit_section(scan, content, deltas)
                if scan.end is None:
                    self._pending = text
                    return
                if scan.calls:
                    self._after = True
                    self._begin = False
                elif scan.content.strip():
                    self._begin = False
                self._base += len(scan.calls)
                self._section_content = ""
                self._mode = _CONTENT
                text = text[scan.end :]
                continue
            at = self._find_marker(text)
            if at >= 0:
                self._emit_content(text[:at], content)
                # Held whitespace waits for the section: dropped before a call.
                self._section_ws = self._ws
                self._ws = ""
                self._mode = _SECTION
                text = text[at:]
                continue
            hold = 0 if final else self._held_marker(text)
            self._emit_content(text[: len(text) - hold], content)
            self._pending = text[len(text) - hold :]
            return

    def _emit_content(self, text: str, out: list[str]) -> None:
        if not text:
            return
        if self._after:
            text = text.lstrip()
            if not text:
                return
            self._after = False
        body = text.rstrip()
        if not body:
            self._ws += text
            return
        out.append(self._ws + body)
        self._ws = text[len(body) :]
        self._begin = False

    def _emit_section(self, scan: SectionScan, content: list[str], deltas: list[ToolCallDelta]) -> None:
        calls = self._calls
        for j, call in enumerate(scan.calls):
            index = self._base + j
            if index < len(calls):
                sent = calls[index]
                grown = call.arguments[len(sent[1]) :]
                if grown and call.arguments.startswith(sent[1]):
                    deltas.append(ToolCallDelta(index, None, grown))
                    sent[1] = call.arguments
            else:
                self._section_ws = ""  # whitespace before a call is dropped
                calls.append([call.name, call.arguments])
                deltas.append(ToolCallDelta(index, call.name, call.arguments))
        grown = scan.content[len(self._section_content) :]
        if grown and scan.content.startswith(self._section_content):
            if self._after:
                grown = grown.lstrip()
                if grown:
                    self._after = False
            if grown:
                content.append(self._section_ws + grown)
                self._section_ws = ""
            self._section_content = scan.content
        if scan.end is not None:
            if self._section_ws and not calls[self._base :]:
                # A section with neither a call nor content: the whitespace before it
                # is still content, held as any trailing whitespace is.
                self._ws = self._section_ws
            self._section_ws = ""

    def _find_marker(self, text: str) -> int:
        best = -1
        for marker in self._starts:
            at = text.find(marker)
            if at >= 0 and (best < 0 or at < best):
                best = at
        if self._leading and self._begin:
            first = len(text) - len(text.lstrip())
            if (best < 0 or first < best) and any(text.startswith(m, first) for m in self._leading):
                best = first
        return best

    def _held_marker(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that could begin a marker."""
        n = len(text)
        for i in range(max(0, n - self._hold_max + 1), n):
            tail = text[i:]
            if any(m.startswith(tail) for m in self._starts):
                return n - i
            if (
                self._leading
                and self._begin
                and not text[:i].strip()
                and any(m.startswith(tail) for m in self._leading)
            ):
                return n - i
        return 0

    def __repr__(self) -> str:
        return f"ToolCallParser({self.syntax.name!r})"


def join_results(results: Iterable[ToolStreamResult]) -> ToolParseResult:
    """Join streamed results into the whole-output result (content concatenated, each
    call's pieces joined by index)."""
    content: list[str] = []
    names: dict[int, str] = {}
    arguments: dict[int, list[str]] = {}
    for result in results:
        content.append(result.content)
        for delta in result.calls:
            if delta.name is not None:
                names.setdefault(delta.index, delta.name)
            arguments.setdefault(delta.index, []).append(delta.arguments)
    calls = tuple(ToolCall(i, names.get(i, ""), "".join(arguments[i])) for i in sorted(arguments))
    return ToolParseResult("".join(content), calls)


def _resolve(syntax: Any) -> ToolCallSyntax:
    if isinstance(syntax, ToolCallSyntax):
        return syntax
    from thinkstruct.parsers.reasoning_families import (
        ReasoningFamily,
        reasoning_families,
    )

    if isinstance(syntax, str) and syntax in reasoning_families() and not _is_syntax_name(syntax):
        syntax = reasoning_families()[syntax]
    if isinstance(syntax, ReasoningFamily):
        if syntax.tool_call_syntax is None:
            raise ValueError(f"reasoning family {syntax.name!r} has no tool-call syntax")
        return get_tool_call_syntax(syntax.tool_call_syntax)
    return get_tool_call_syntax(syntax)


def _is_syntax_name(name: str) -> bool:
    from thinkstruct.parsers.tool_calls.syntax import tool_call_syntaxes

    return name in tool_call_syntaxes()
