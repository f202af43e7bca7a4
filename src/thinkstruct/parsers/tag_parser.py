"""Reasoning parser for families that wrap the thought in a start and an end tag.

Output shapes it reads (``<think>``/``</think>`` standing for the family's tags)::

    <think>thought</think>answer          the model opens the thought itself
    thought</think>answer                 reasoning forced: the prompt opened it
    <think>thought<tool_call>{...}        a tool call ends the thought; it goes to content
    <think>thought                        truncated: all reasoning
    answer                                no thought (not forced)

Content that no end tag opened (no thought at all, or one a tool call cut short) drops
its first end tag unless a start tag comes before it: an unmatched ``</think>`` is a
control tag, not text for the user.

The streaming side is a small state machine. Its steady state, inside a thought, costs
one ``in`` test for the first character of the tags that could end it; only a chunk that
contains that character, or that ends in whitespace, takes the general path. Held-back
text is bounded by the longest tag, so nothing already seen is scanned again.

The batch side (:meth:`TagReasoningParser.parse`) is written independently with
``str.find``, from the same rules, so that the two can be checked against each other.
"""

from __future__ import annotations

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

# Parser states. ``_PRE``: not forced, nothing but whitespace seen; a start tag here opens
# the thought. ``_OPENING``: inside a thought that has no text yet (whitespace and echoed
# start tags are dropped). ``_THINK``: inside a thought. ``_CLOSING``: right after the end
# tag (whitespace is dropped). ``_CONTENT``: everything from here on is content.
# ``_STRAY``: content that no end tag opened; its first end tag, if no start tag comes
# first, is dropped.
_PRE, _OPENING, _THINK, _CLOSING, _CONTENT, _DONE, _STRAY = range(7)


class TagReasoningParser(ReasoningParser, implements=ReasoningFormat.TAGS):
    """:class:`ReasoningParser` for tag families (``<think>…</think>`` and the like)."""

    __slots__ = (
        "_end",
        "_first",
        "_firsts",
        "_held",
        "_hold_max",
        "_initial",
        "_start",
        "_state",
        "_stops",
        "_tag_firsts",
        "_tag_hold",
        "_tags",
        "_ws",
    )

    def _setup(self) -> None:
        family = self.family
        self._start = family.think_start
        self._end = family.think_end
        # Tags that end a thought, in priority order for a tie (none can tie: different texts
        # starting at the same place would have to be prefixes of each other).
        stops = [family.think_end]
        if family.tool_call_start:
            stops.append(family.tool_call_start)
        self._stops = tuple(stops)
        self._firsts = "".join(sorted({s[0] for s in stops}))
        # The hot path tests one character; families whose stop tags start differently
        # take the general path for every chunk that has any of them.
        self._first = self._firsts if len(self._firsts) == 1 else None
        self._hold_max = max(len(s) for s in stops) - 1
        self._tags = (family.think_start, family.think_end)
        self._tag_firsts = frozenset(t[0] for t in self._tags)
        self._tag_hold = max(len(t) for t in self._tags) - 1
        if not self.enabled:
            initial = _CONTENT
        elif self.forced:
            initial = _OPENING
        else:
            initial = _PRE
        self._state = initial
        self._pending = ""
        self._ws: list[str] = []
        self._held = HeldReasoning()
        if self.continue_final_message and self.previous_content:
            # The state the previous text leaves the machine in is where this output starts;
            # what that text itself would have produced is not part of this output.
            self._consume(self.previous_content, [], [])
            initial = self._state
        self._initial = initial
        self.reset()

    def reset(self) -> None:
        self._state = self._initial
        self._pending = ""
        self._ws = []
        self._held = HeldReasoning()

    @property
    def in_reasoning(self) -> bool:
        return self._state in (_OPENING, _THINK)

    # ---- whole output -----------------------------------------------------------------

    def parse(self, text: str) -> ParseResult:
        start = self._start
        state = self._initial
        if state == _CONTENT:
            return ParseResult("", text)
        if state == _CLOSING:
            return ParseResult("", text.lstrip())
        if state == _STRAY:
            return ParseResult("", self._drop_stray(text))
        rest = text
        if state == _PRE:
            rest = text.lstrip()
            if not rest.startswith(start):
                return ParseResult("", self._drop_stray(text))
            rest = rest[len(start) :]
            state = _OPENING
        if state == _OPENING:
            rest = rest.lstrip()
            while rest.startswith(start):
                rest = rest[len(start) :].lstrip()
        cut, tag = _first_stop(rest, self._stops)
        if cut < 0:
            return ParseResult(rest.rstrip(), "")
        reasoning = rest[:cut].rstrip()
        if tag == self._end:
            return ParseResult(reasoning, rest[cut + len(tag) :].lstrip())
        return ParseResult(reasoning, self._drop_stray(rest[cut:]))

    def _drop_stray(self, content: str) -> str:
        """``content`` without its first end tag, if no start tag comes before it."""
        end = content.find(self._end)
        if end < 0:
            return content
        start = content.find(self._start, 0, end)
        if start >= 0:
            return content
        return content[:end] + content[end + len(self._end) :]

    # ---- stream ------------------------------------------------------------------------

    def feed(self, chunk: str) -> ParseResult:
        state = self._state
        if state == _CONTENT:
            return _new_result(ParseResult, ("", chunk))
        if state == _STRAY and not self._pending and not any(c in chunk for c in self._tag_firsts):
            return _new_result(ParseResult, ("", chunk))
        if state == _THINK and not self._pending:
            first = self._first
            if first is not None and first not in chunk:
                if not self.stream_reasoning:
                    # Trailing whitespace is dropped when the held reasoning is released.
                    self._held.add(chunk)
                    return EMPTY_RESULT
                body = chunk.rstrip()
                if body is chunk:  # no trailing whitespace: the common case
                    if self._ws and chunk:
                        body = "".join(self._ws) + chunk
                        self._ws = []
                    return _new_result(ParseResult, (body, ""))
                if not body:
                    self._ws.append(chunk)
                    return EMPTY_RESULT
                # Trailing whitespace may be the whitespace before the end tag: hold it.
                tail = chunk[len(body) :]
                if self._ws:
                    body = "".join(self._ws) + body
                self._ws = [tail]
                return _new_result(ParseResult, (body, ""))
        if state == _DONE:
            raise RuntimeError(FEED_AFTER_FINISH)
        return self._feed_pending(chunk)

    def finish(self) -> ParseResult:
        state = self._state
        if state == _DONE:
            raise RuntimeError(FINISH_TWICE)
        pending = self._pending
        self._pending = ""
        self._state = _DONE
        if state == _PRE:
            content = "".join(self._ws) + pending
            self._ws = []
            return ParseResult("", content)
        if state == _STRAY:
            return ParseResult("", pending)
        if state in (_OPENING, _THINK):
            # Cut off inside the thought: what is held back was reasoning after all.
            return ParseResult(self._emit_reasoning(pending) + self._end_thought(), "")
        return EMPTY_RESULT

    # ---- the machine -------------------------------------------------------------------

    def _consume(self, text: str, reasoning: list[str], content: list[str]) -> None:
        """Consume ``text`` from the current state, appending settled output."""
        start = self._start
        while True:
            state = self._state
            if state == _THINK:
                cut, tag = _first_stop(text, self._stops)
                if cut < 0:
                    hold = self._partial_stop_at_end(text)
                    reasoning.append(self._emit_reasoning(text[:hold]))
                    self._pending = text[hold:]
                    return
                reasoning.append(self._emit_reasoning(text[:cut]))
                reasoning.append(self._end_thought())
                if tag == self._end:
                    self._state = _CLOSING
                    text = text[cut + len(tag) :]
                else:  # a tool call: it and all that follows is content
                    self._state = _STRAY
                    text = text[cut:]
            elif state == _CONTENT:
                content.append(text)
                return
            elif state == _STRAY:
                end = text.find(self._end)
                begin = text.find(self._start, 0, end if end >= 0 else len(text))
                if begin >= 0:  # a start tag first: tags are text from here on
                    self._state = _CONTENT
                    continue
                if end >= 0:
                    content.append(text[:end])
                    self._state = _CONTENT
                    text = text[end + len(self._end) :]
                    continue
                hold = self._partial_tag_at_end(text)
                content.append(text[:hold])
                self._pending = text[hold:]
                return
            elif state == _CLOSING:
                rest = text.lstrip()
                if rest:
                    self._state = _CONTENT
                    content.append(rest)
                return
            elif state == _OPENING:
                rest = text.lstrip()
                if not rest:
                    return
                if rest.startswith(start):
                    text = rest[len(start) :]
                elif len(rest) < len(start) and start.startswith(rest):
                    self._pending = rest
                    return
                else:
                    self._state = _THINK
                    text = rest
            elif state == _PRE:
                rest = text.lstrip()
                if not rest:
                    self._ws.append(text)  # may yet be followed by the start tag
                    return
                if rest.startswith(start):
                    self._ws = []
                    self._state = _OPENING
                    text = rest[len(start) :]
                elif len(rest) < len(start) and start.startswith(rest):
                    self._ws.append(text[: len(text) - len(rest)])
                    self._pending = rest
                    return
                else:
                    self._state = _STRAY
                    content.append("".join(self._ws))
                    self._ws = []
            else:
                raise RuntimeError("feed() after finish(); call reset() to parse another output")

    def _emit_reasoning(self, text: str) -> str:
        """Reasoning text to hand out now; trailing whitespace is held (it may precede the
        end tag), and nothing is handed out when reasoning is not streamed."""
        if not text:
            return ""
        if not self.stream_reasoning:
            self._held.add(text)
            return ""
        body = text.rstrip()
        if not body:
            self._ws.append(text)
            return ""
        if self._ws:
            out = "".join(self._ws) + body
            self._ws = []
        else:
            out = body
        if len(body) < len(text):
            self._ws = [text[len(body) :]]
        return out

    def _end_thought(self) -> str:
        """The thought is over: drop held whitespace, release held reasoning."""
        self._ws = []
        if self._held:
            return self._held.take().rstrip()
        return ""

    def _partial_tag_at_end(self, text: str) -> int:
        """Where the longest suffix of ``text`` that could begin the start or end tag starts."""
        n = len(text)
        firsts = self._tag_firsts
        for i in range(max(0, n - self._tag_hold), n):
            if text[i] in firsts:
                tail = text[i:]
                if self._start.startswith(tail) or self._end.startswith(tail):
                    return i
        return n

    def _partial_stop_at_end(self, text: str) -> int:
        """Where the longest suffix of ``text`` that could begin a stop tag starts
        (``len(text)`` when none can)."""
        n = len(text)
        firsts = self._firsts
        for i in range(max(0, n - self._hold_max), n):
            if text[i] in firsts:
                tail = text[i:]
                for stop in self._stops:
                    if stop.startswith(tail):
                        return i
        return n


def _first_stop(text: str, stops: tuple[str, ...]) -> tuple[int, str]:
    """The earliest stop tag in ``text``: (index, tag), or (-1, "")."""
    best, found = -1, ""
    for stop in stops:
        i = text.find(stop)
        if i >= 0 and (best < 0 or i < best):
            best, found = i, stop
    return best, found
