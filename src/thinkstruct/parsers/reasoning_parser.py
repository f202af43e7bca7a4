"""Split a model's output into reasoning and content, whole or streamed.

``ReasoningParser(family, ...)`` builds the parser for the family's format (tags or
harmony channels); every parser offers the same three calls:

- ``parse(text)``: a whole output at once.
- ``feed(chunk)`` for each streamed piece, then ``finish()`` once at the end.

For any output and any way of cutting it into chunks, the concatenated results of
``feed``/``finish`` equal ``parse`` of the whole output (the test suite checks this with
hypothesis). Each format states its whitespace rule, applied identically in both paths
(tags: whitespace right after the start tag, right before the end tag and right after the
end tag is dropped; harmony: bodies are kept exactly as written).
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

from thinkstruct.parsers.reasoning_families import ReasoningFamily, ReasoningFormat, get_reasoning_family


class ParseResult(NamedTuple):
    """What a piece of output contributes: reasoning text and content text (either may be ``""``)."""

    reasoning: str = ""
    content: str = ""


# Building the tuple directly skips NamedTuple's Python-level __new__: feed() runs per
# token, and at ~2 µs per call the constructor is a visible share.
_new_result = tuple.__new__
EMPTY_RESULT = ParseResult("", "")

FEED_AFTER_FINISH = "feed() after finish(); call reset() to parse another output"
FINISH_TWICE = "finish() called twice; call reset() to parse another output"


class HeldReasoning:
    """Reasoning held back while ``stream_reasoning`` is off.

    Chunks are joined in groups as they come, so that a long thought is kept as a few
    large strings instead of one small string per chunk: memory and cache traffic stay
    proportional to the text, not to the number of chunks.
    """

    __slots__ = ("_parts", "_recent")
    _GROUP = 256

    def __init__(self) -> None:
        self._recent: list[str] = []
        self._parts: list[str] = []

    def add(self, text: str) -> None:
        recent = self._recent
        recent.append(text)
        if len(recent) >= self._GROUP:
            self._parts.append("".join(recent))
            recent.clear()

    def take(self) -> str:
        """All held text, and forget it."""
        parts = self._parts
        parts.append("".join(self._recent))
        out = "".join(parts)
        self._recent = []
        self._parts = []
        return out

    def __bool__(self) -> bool:
        return bool(self._recent or self._parts)


class ReasoningParser:
    """Splits one model output into reasoning and content for a reasoning family.

    Args:
        family: a registered family name (``"qwen3"``, ``"deepseek-r1"``, ...) or a
            :class:`~thinkstruct.parsers.ReasoningFamily`.
        enabled: whether this request reasons at all; pass the value of
            :func:`~thinkstruct.parsers.reasoning_enabled` (the one the grammar gets).
            When ``False`` the whole output is content.
        force_reasoning: whether the output starts inside a thought (the prompt opened
            it); ``None`` takes the family's setting.
        stream_reasoning: when ``False``, reasoning is held back and returned in one piece
            when the thought ends (end tag, tool call, or :meth:`finish`).
        continue_final_message: the output continues ``previous_content`` (an assistant
            message the prompt ended with) instead of starting a new turn.
        previous_content: the assistant message text being continued. The parser starts
            in the state that text leaves it in: inside the thought if the text has an
            unclosed start tag, or if reasoning is forced and the text has no end tag.

    Raises:
        UnknownName: unknown family (the message lists the known ones).
    """

    __slots__ = (
        "_pending",
        "continue_final_message",
        "enabled",
        "family",
        "forced",
        "previous_content",
        "stream_reasoning",
    )

    #: The class that parses each format; a subclass declares its format in its class
    #: statement (``class TagReasoningParser(ReasoningParser, implements=...)``).
    _implementations: ClassVar[dict[ReasoningFormat, type[ReasoningParser]]] = {}
    _pending: str  # set by each format's _setup/reset

    def __init_subclass__(cls, *, implements: ReasoningFormat | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if implements is not None:
            ReasoningParser._implementations[implements] = cls

    def __new__(cls, *args: Any, **kwargs: Any) -> ReasoningParser:
        # ReasoningParser(family) picks the class of the family's format; a subclass (or
        # copy.copy, which passes no arguments) gets itself. The formats' modules are
        # imported by the package (thinkstruct.parsers), which Python loads before this
        # module.
        if cls is ReasoningParser:
            family = args[0] if args else kwargs.get("family")
            spec = get_reasoning_family(family)  # type: ignore[arg-type]
            cls = ReasoningParser._implementations[spec.format]
        return object.__new__(cls)

    def __init__(
        self,
        family: str | ReasoningFamily,
        *,
        enabled: bool = True,
        force_reasoning: bool | None = None,
        stream_reasoning: bool = True,
        continue_final_message: bool = False,
        previous_content: str | None = "",
    ) -> None:
        self.family: ReasoningFamily = get_reasoning_family(family)
        self.enabled = bool(enabled)
        self.forced = self.family.forced if force_reasoning is None else bool(force_reasoning)
        self.stream_reasoning = bool(stream_reasoning)
        self.continue_final_message = bool(continue_final_message)
        if previous_content is None:
            previous_content = ""
        if not isinstance(previous_content, str):
            raise TypeError(f"previous_content must be a str, got {type(previous_content).__name__}")
        self.previous_content = previous_content if self.continue_final_message else ""
        self._setup()

    # ---- the API every format implements -------------------------------------------

    def parse(self, text: str) -> ParseResult:
        """Split a whole output. Does not touch the streaming state."""
        raise NotImplementedError

    def feed(self, chunk: str) -> ParseResult:
        """Take the next piece of a streamed output; return what it settles.

        Text that could still be the beginning of a tag is held back until the next chunk
        decides it (or :meth:`finish`). Work is proportional to the chunk.

        Raises:
            RuntimeError: called after :meth:`finish` without :meth:`reset`.
        """
        raise NotImplementedError

    def finish(self) -> ParseResult:
        """End the stream: flush held-back text. An output cut off inside a thought
        (no end tag) is reasoning. Call :meth:`reset` to parse another stream."""
        raise NotImplementedError

    def reset(self) -> None:
        """Forget the stream; the next :meth:`feed` starts a new output."""
        raise NotImplementedError

    @property
    def in_reasoning(self) -> bool:
        """Whether the stream is inside a thought right now."""
        raise NotImplementedError

    def _setup(self) -> None:
        raise NotImplementedError

    # ---- the general stream path, shared by the formats -------------------------------
    # A format keeps in ``_pending`` the text that could still begin a tag or token, and
    # implements ``_consume``: run its machine over a text, appending settled output and
    # holding back (in ``_pending``) a suffix the next chunk must decide.

    def _consume(self, text: str, reasoning: list[str], content: list[str]) -> None:
        raise NotImplementedError

    def _feed_pending(self, chunk: str) -> ParseResult:
        """``feed`` off the format's fast path: the held-back text and ``chunk`` through
        :meth:`_consume`."""
        if self._pending:
            chunk = self._pending + chunk
            self._pending = ""
        reasoning: list[str] = []
        content: list[str] = []
        self._consume(chunk, reasoning, content)
        return _new_result(ParseResult, ("".join(reasoning), "".join(content)))

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.family.name!r}, enabled={self.enabled}, forced={self.forced}, "
            f"stream_reasoning={self.stream_reasoning})"
        )
