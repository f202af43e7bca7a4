"""Reasoning parser for OpenAI harmony output (gpt-oss).

The generation prompt ends with ``<|start|>assistant``; the output is a run of messages::

    <|channel|>analysis<|message|>thought<|end|>
    <|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{...}<|call|>
    <|start|>assistant<|channel|>final<|message|>answer<|return|>

- ``analysis`` bodies are reasoning; consecutive analysis messages are joined by ``"\\n"``.
- ``final`` bodies are content (headers and end tokens dropped).
- ``commentary`` (tool calls and preambles) and any other channel go to content *raw*,
  header and end token included, so that a tool-call parser can read them.
- Text outside any message (a model that skips the header) is content, or reasoning when
  reasoning is forced; whitespace between messages is dropped; a header cut off before
  ``<|message|>`` is dropped. Bodies are kept exactly as written.

Both paths drive the same message-level handlers; they differ in how the text is cut into
special tokens and runs of text: ``parse`` uses a regular expression over the whole text,
``feed`` scans each chunk once and holds back only a suffix that could begin a token. The
property tests compare the two.
"""

from __future__ import annotations

import copy
import re

from thinkstruct.parsers.reasoning_families import ReasoningFormat
from thinkstruct.parsers.reasoning_parser import (
    EMPTY_RESULT,
    FEED_AFTER_FINISH,
    FINISH_TWICE,
    HeldReasoning,
    ParseResult,
    ReasoningParser,
    _new_result,
)

START = "<|start|>"
CHANNEL = "<|channel|>"
MESSAGE = "<|message|>"
END = "<|end|>"
RETURN = "<|return|>"
CALL = "<|call|>"
CONSTRAIN = "<|constrain|>"
TOKENS = (START, CHANNEL, MESSAGE, END, RETURN, CALL, CONSTRAIN)
_TERMINATORS = frozenset((END, RETURN, CALL))
_HEADER_OPENERS = frozenset((START, CHANNEL, CONSTRAIN))
_TOKEN_RE = re.compile("|".join(re.escape(t) for t in TOKENS))
_MAX_TOKEN = max(len(t) for t in TOKENS)

# Modes: between messages, reading a header, reading a body, reasoning off (all content).
_IDLE, _HEADER, _BODY, _VERBATIM, _DONE = range(5)
# Body kinds: reasoning, answer (content without framing), raw (content with framing).
_REASON, _ANSWER, _RAW = range(3)


def _channel_kind(header: str) -> int:
    """How a message with this header is routed (``_REASON``, ``_ANSWER`` or ``_RAW``)."""
    i = header.rfind(CHANNEL)
    if i < 0:
        return _ANSWER  # an assistant message without a channel is plain answer text
    name = header[i + len(CHANNEL) :]
    j = name.find("<|")
    if j >= 0:
        name = name[:j]
    words = name.split()
    channel = words[0] if words else ""
    if channel == "analysis":
        return _REASON
    if channel == "final":
        return _ANSWER
    return _RAW


class HarmonyReasoningParser(ReasoningParser, implements=ReasoningFormat.HARMONY):
    """:class:`ReasoningParser` for harmony channels (gpt-oss)."""

    __slots__ = (
        "_bare_kind",
        "_fresh",
        "_header",
        "_held",
        "_initial",
        "_kind",
        "_mode",
        "_reason_any",
    )

    def _setup(self) -> None:
        self._bare_kind = _REASON if self.forced else _ANSWER
        # (mode, kind, header pieces, reason_any, fresh): the state reset() returns to.
        self._initial: tuple[int, int, tuple[str, ...], bool, bool] = (
            _IDLE if self.enabled else _VERBATIM,
            _ANSWER,
            (),
            False,
            False,
        )
        self.reset()
        if self.continue_final_message and self.previous_content:
            self._consume(self.previous_content, [], [])
            # A token cut in half at the end of the previous text is not completed by the
            # continuation's first characters: the model starts a fresh token there.
            self._initial = (self._mode, self._kind, tuple(self._header), self._reason_any, self._fresh)
            self.reset()

    def reset(self) -> None:
        mode, kind, header, reason_any, fresh = self._initial
        self._mode = mode
        self._kind = kind
        self._header = list(header)
        self._reason_any = reason_any
        self._fresh = fresh
        self._pending = ""
        self._held = HeldReasoning()

    @property
    def in_reasoning(self) -> bool:
        return self._mode == _BODY and self._kind == _REASON

    # ---- whole output -----------------------------------------------------------------

    def parse(self, text: str) -> ParseResult:
        run = copy.copy(self)
        run.reset()
        reasoning: list[str] = []
        content: list[str] = []
        pos = 0
        for m in _TOKEN_RE.finditer(text):
            if m.start() > pos:
                run._text(text[pos : m.start()], reasoning, content)
            run._token(m.group(), reasoning, content)
            pos = m.end()
        if pos < len(text):
            run._text(text[pos:], reasoning, content)
        run._close(reasoning)
        return ParseResult("".join(reasoning), "".join(content))

    # ---- stream ------------------------------------------------------------------------

    def feed(self, chunk: str) -> ParseResult:
        mode = self._mode
        if mode == _BODY and not self._pending and "<" not in chunk:
            kind = self._kind
            if kind != _REASON:
                return _new_result(ParseResult, ("", chunk))
            if not self._fresh:
                if self.stream_reasoning:
                    return _new_result(ParseResult, (chunk, ""))
                self._held.add(chunk)
                return EMPTY_RESULT
        elif mode == _VERBATIM:
            return _new_result(ParseResult, ("", chunk))
        if mode == _DONE:
            raise RuntimeError(FEED_AFTER_FINISH)
        return self._feed_pending(chunk)

    def finish(self) -> ParseResult:
        if self._mode == _DONE:
            raise RuntimeError(FINISH_TWICE)
        reasoning: list[str] = []
        content: list[str] = []
        if self._pending:
            self._text(self._pending, reasoning, content)
            self._pending = ""
        self._close(reasoning)
        self._mode = _DONE
        return ParseResult("".join(reasoning), "".join(content))

    def _consume(self, text: str, reasoning: list[str], content: list[str]) -> None:
        """Cut ``text`` into runs and tokens and hand them to the handlers; hold back a
        suffix that could still become a token."""
        n = len(text)
        pos = 0  # start of the text run not yet handed over
        search = 0
        while True:
            j = text.find("<", search)
            if j < 0:
                break
            window = text[j : j + _MAX_TOKEN]
            token = None
            if window.startswith("<|"):
                for t in TOKENS:
                    if window.startswith(t):
                        token = t
                        break
            if token is not None:
                if j > pos:
                    self._text(text[pos:j], reasoning, content)
                self._token(token, reasoning, content)
                pos = search = j + len(token)
                continue
            if n - j < _MAX_TOKEN and any(t.startswith(window) for t in TOKENS):
                if j > pos:
                    self._text(text[pos:j], reasoning, content)
                self._pending = text[j:]
                return
            search = j + 1
        if pos < n:
            self._text(text[pos:], reasoning, content)

    # ---- message-level handlers, shared by both paths ---------------------------------

    def _text(self, s: str, reasoning: list[str], content: list[str]) -> None:
        mode = self._mode
        if mode == _BODY:
            self._route(s, reasoning, content)
        elif mode == _HEADER:
            self._header.append(s)
        elif mode == _IDLE:
            rest = s.lstrip()
            if rest:
                self._open_body(self._bare_kind, reasoning)
                self._route(rest, reasoning, content)
        elif mode == _VERBATIM:
            content.append(s)

    def _token(self, t: str, reasoning: list[str], content: list[str]) -> None:
        mode = self._mode
        if mode == _BODY:
            if t in _TERMINATORS:
                if self._kind == _RAW:
                    content.append(t)
                self._mode = _IDLE
            elif t in (START, CHANNEL):  # the model began a new message without ending this one
                self._mode = _HEADER
                self._header = [t]
            else:
                self._route(t, reasoning, content)
        elif mode == _HEADER:
            if t == MESSAGE:
                header = "".join(self._header)
                self._header = []
                kind = _channel_kind(header)
                if kind == _RAW:
                    content.append(header)
                    content.append(t)
                self._open_body(kind, reasoning)
            else:
                self._header.append(t)
        elif mode == _IDLE:
            if t in _HEADER_OPENERS:
                self._mode = _HEADER
                self._header = [t]
            elif t == MESSAGE:
                self._open_body(self._bare_kind, reasoning)
            # a stray end token between messages carries nothing
        elif mode == _VERBATIM:
            content.append(t)

    def _open_body(self, kind: int, reasoning: list[str]) -> None:
        self._mode = _BODY
        self._kind = kind
        self._fresh = True
        if kind != _REASON and self._held:  # the thought is over: release it
            reasoning.append(self._held.take())

    def _route(self, s: str, reasoning: list[str], content: list[str]) -> None:
        if self._kind != _REASON:
            content.append(s)
            return
        if self._fresh:
            self._fresh = False
            if self._reason_any:
                s = "\n" + s
            self._reason_any = True
        if self.stream_reasoning:
            reasoning.append(s)
        else:
            self._held.add(s)

    def _close(self, reasoning: list[str]) -> None:
        if self._mode == _HEADER:
            self._header = []  # a header without a message carries no text
            self._mode = _IDLE
        if self._held:
            reasoning.append(self._held.take())
