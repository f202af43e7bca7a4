"""Checked keywords while decoding: :class:`CheckedAnswer`, one request's answer held to
the keywords its grammar cannot enforce.

The grammar holds the answer to what its backend enforces; the rest of the schema (a
:class:`~thinkstruct.grammar.schema.checks.CheckPlan`: ``uniqueItems``, ``not``,
``format`` ...) is checked by a :class:`~thinkstruct.grammar.runtime.value_checks.ValueChecker`
on the answer's text, token by token, as each value closes (in an answer held to a
structural tag, a request's tool calls: each call's arguments, by a
:class:`~thinkstruct.grammar.runtime.tag_checks.TagChecker`). Between the executor (which
settles tokens) and the output processor (which turns them into text for the caller)
this keeps back the tokens of an open value that holds checked keywords, so the caller
never sees text that is later undone, and says what to undo when a value fails:

- the thought is never checked nor held (the checker starts with the answer);
- when a value fails, the tokens from the first sampled token of the failed part that
  *says something* to the end are undone (the failed part: the value, or the member its
  error is about, as ``legs`` when ``then`` fails on it), and that token is banned at
  its position, so the next draw there differs. A token that only opens the value (whitespace, ``"``,
  ``[``, ``{``, as ``' "'`` before ``red``) is kept: every other value would open the
  same way, and banning it would leave little but whitespace to draw there. Tokens the
  grammar forced are never the banned one (they would come again);
- at the end of the answer (a stop token) a number at the root closes and is checked.

Units: token counts; the checker's offsets are characters of the answer text.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from typing import TYPE_CHECKING

from thinkstruct.engine.output.processor import ThoughtTracker
from thinkstruct.engine.sampling.logprobs import SampledLogprob
from thinkstruct.grammar.runtime.tag_checks import AnswerChecker, answer_checker

if TYPE_CHECKING:
    from collections.abc import Mapping

    from thinkstruct.engine.output.detokenizer import TokenTexts
    from thinkstruct.grammar.runtime.end_tag import EndTagMatcher
    from thinkstruct.grammar.runtime.value_checks import CheckFailure
    from thinkstruct.grammar.schema.tag_checks import Checks


#: Characters that only open a value: a token's text made of them alone says nothing yet.
_OPENING = ' \t\n\r"[{'


@dataclass(frozen=True, slots=True)
class SettledToken:
    """A generated token on its way to the output processor.

    Attributes:
        token: its id.
        sampled: drawn (else forced by the grammar).
        logprob: its log-probability and alternatives (sampled tokens of a request that
            asked for them).
        allowed: how many tokens its step's mask allowed (1 for a forced token).
    """

    token: int
    sampled: bool
    logprob: SampledLogprob | None
    allowed: int


@dataclass(frozen=True, slots=True)
class Undo:
    """A failed value to take back.

    Attributes:
        tokens: generated tokens to undo (stop tokens, which produce no output, not
            counted), counted from the last one settled.
        grammar_tokens: tokens to roll the grammar back (every token it accepted since,
            a stop token included).
        banned: the token to forbid at the position the undo returns to (the failed
            value's first sampled token).
        failure: what failed, for the error when the tries run out.
    """

    tokens: int
    grammar_tokens: int
    banned: int
    failure: CheckFailure

    @property
    def possible(self) -> bool:
        """Whether the value can be tried again (some of it was drawn, none of it sent)."""
        return self.banned >= 0


@dataclass(frozen=True, slots=True)
class Settled:
    """What a group of settled tokens comes to: tokens the caller may now see, and a
    failed value to undo (``None`` when everything checked so far holds)."""

    release: list[SettledToken]
    undo: Undo | None


class CheckedAnswer:
    """One request's answer checked as it is generated.

    Args:
        plan: the keywords to check, by instance location (a JSON schema's), or by tag
            (a structural tag's: each tool call's arguments against its tool's schema).
        texts: the bytes each token id stands for.
        end_tag: the family's end-of-thought tag (``None``: no thought).
        thinking: the request starts inside a thought.
        stop_ids: tokens that end the output (no text; they close the answer).
        names: for a structural tag, the tool each call's begin text names (errors name
            the tool).
    """

    def __init__(
        self,
        plan: Checks,
        *,
        texts: TokenTexts,
        end_tag: EndTagMatcher | None,
        thinking: bool,
        stop_ids: frozenset[int],
        names: Mapping[str, str] | None = None,
    ) -> None:
        self._plan = plan
        self._names = names
        self._texts = texts
        self._thought = ThoughtTracker(end_tag, thinking=thinking)
        self._stop_ids = stop_ids
        self._checker: AnswerChecker | None = None
        # Per answer token fed to the checker: the token, and the decoder state before it.
        self._held: list[SettledToken] = []
        self._fed: list[SettledToken] = []
        #: Per answer token fed: where its text starts in the answer text, and the text.
        self._texts_fed: list[tuple[int, str]] = []
        self._decoders: list[tuple[bytes, int]] = []
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def settle(
        self, tokens: list[int], *, forced: int, logprob: SampledLogprob | None, allowed: int
    ) -> Settled:
        """Take a group of settled tokens (the first sampled unless all were forced, the
        last ``forced`` forced; a stop token only last)."""
        release: list[SettledToken] = []
        for k, token in enumerate(tokens):
            sampled = k < len(tokens) - forced
            settled = SettledToken(token, sampled, logprob if sampled else None, allowed if sampled else 1)
            if token in self._stop_ids:
                failure = self._checker.finish() if self._checker is not None else None
                if failure is not None:
                    return self._undo(failure, after=tokens[k:])
                release.extend(self._held)
                self._held.clear()
                continue
            if self._checker is None and self._thought.step(token):
                release.append(settled)  # the thought: never held, never checked
                continue
            failure = self._feed(settled)
            if failure is not None:
                return self._undo(failure, after=tokens[k + 1 :])
        release.extend(self._release())
        return Settled(release=release, undo=None)

    def release_all(self) -> list[SettledToken]:
        """Everything still held (the answer ends: cut short, or failed for good)."""
        held, self._held = self._held, []
        return held

    # ---- internals -------------------------------------------------------------------

    def _feed(self, settled: SettledToken) -> CheckFailure | None:
        if self._checker is None:
            self._checker = answer_checker(self._plan, names=self._names)
        self._decoders.append(self._decoder.getstate())
        piece = self._decoder.decode(self._texts[settled.token])
        last = self._texts_fed[-1] if self._texts_fed else (0, "")
        self._texts_fed.append((last[0] + len(last[1]), piece))
        self._fed.append(settled)
        self._held.append(settled)
        return self._checker.feed(piece)

    def _release(self) -> list[SettledToken]:
        """The held tokens no open checked value covers any more."""
        checker = self._checker
        if checker is None or not self._held:
            return []
        start = checker.held_from()
        keep = 0 if start is None else checker.pieces_since(start)
        cut = len(self._held) - keep
        out, self._held = self._held[:cut], self._held[cut:]
        return out

    def _undo(self, failure: CheckFailure, *, after: list[int]) -> Settled:
        """Undo back to the failed value's first sampled token; ``after``: the group's
        tokens the grammar accepted after the last one fed (the stop token that closed
        the answer, or forced tokens)."""
        checker = self._checker
        if checker is None:
            raise RuntimeError("a value failed before the answer started")
        span = checker.pieces_since(failure.start)
        fed = self._fed[len(self._fed) - span :]
        texts = self._texts_fed[len(self._texts_fed) - span :]
        drawn = [i for i, t in enumerate(fed) if t.sampled]

        def says_something(i: int) -> bool:  # its text from the failed part's start on
            start, text = texts[i]
            return bool(text[max(0, failure.start - start) :].strip(_OPENING))

        first = next((i for i in drawn if says_something(i)), drawn[0] if drawn else None)
        if first is not None:
            pieces = span - first
        else:  # the grammar forced the whole value: undo to the last token drawn before it
            before = self._fed[: len(self._fed) - span]
            last = next((i for i in range(len(before) - 1, -1, -1) if before[i].sampled), None)
            pieces = len(self._fed) - last if last is not None else len(self._fed) + 1
        if pieces > len(self._held):
            # Part of it already reached the caller (or nothing was drawn): no new try.
            return Settled(release=[], undo=Undo(tokens=0, grammar_tokens=0, banned=-1, failure=failure))
        banned = self._fed[-pieces].token
        checker.rollback(pieces)
        del self._fed[-pieces:]
        del self._texts_fed[-pieces:]
        del self._held[-pieces:]
        self._decoder.setstate(self._decoders[-pieces])
        del self._decoders[-pieces:]
        visible = sum(1 for t in after if t not in self._stop_ids)
        undo = Undo(
            tokens=pieces + visible, grammar_tokens=pieces + len(after), banned=banned, failure=failure
        )
        return Settled(release=[], undo=undo)
