"""Log-probabilities on the wire: chat's ``logprobs`` object and the legacy completions one.

The engine gives, per generated token, a :class:`~thinkstruct.engine.request.TokenLogprob`
under the distribution the grammar allowed (see ``docs/server.md``); this module renders
them. A token's text is its own bytes decoded alone (``U+FFFD`` where a character is split
across tokens; ``bytes`` has the exact bytes).
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import TYPE_CHECKING

from thinkstruct.server.protocol import ChatTokenLogprob, ChoiceLogprobs, CompletionLogprobs, TopLogprob

if TYPE_CHECKING:
    from thinkstruct.engine.output.detokenizer import TokenTexts
    from thinkstruct.engine.request import TokenLogprob


def chat_logprobs(entries: Sequence[TokenLogprob], texts: TokenTexts) -> ChoiceLogprobs:
    """Chat's ``choices[i].logprobs``: the answer's tokens in ``content``, the thought's (a
    request whose reasoning is separated) in the extension ``reasoning_content``."""
    content = [_chat_entry(e, texts) for e in entries if not e.reasoning]
    thought = [_chat_entry(e, texts) for e in entries if e.reasoning]
    return ChoiceLogprobs(content=content, reasoning_content=thought or None)


def _chat_entry(entry: TokenLogprob, texts: TokenTexts) -> ChatTokenLogprob:
    raw = texts[entry.token_id]
    return ChatTokenLogprob(
        token=_text(raw),
        logprob=entry.logprob,
        bytes=list(raw),
        top_logprobs=[
            TopLogprob(token=_text(texts[t]), logprob=v, bytes=list(texts[t])) for t, v in entry.top
        ],
    )


class LegacyLogprobs:
    """One completion choice's legacy ``logprobs`` (``tokens``, ``token_logprobs``,
    ``top_logprobs``, ``text_offset``), rendered piece by piece as a stream goes on: the
    offsets count characters of the choice's text from ``offset`` (the echoed prompt's
    length, else 0)."""

    def __init__(self, texts: TokenTexts, *, offset: int = 0) -> None:
        self._texts = texts
        self._offset = offset
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def render(self, entries: Sequence[TokenLogprob]) -> CompletionLogprobs:
        """The next tokens' entries. ``top_logprobs`` holds the most likely tokens and, as
        OpenAI's legacy API does, the sampled one too (up to ``logprobs + 1`` entries)."""
        out = CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
        for entry in entries:
            raw = self._texts[entry.token_id]
            token = _text(raw)
            out.tokens.append(token)
            out.token_logprobs.append(entry.logprob)
            out.text_offset.append(self._offset)
            top: dict[str, float] = {}
            for t, v in (*entry.top, (entry.token_id, entry.logprob)):
                text = _text(self._texts[t])
                top[text] = max(v, top.get(text, v))
            out.top_logprobs.append(top)
            self._offset += len(self._decoder.decode(raw))
        return out


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")
