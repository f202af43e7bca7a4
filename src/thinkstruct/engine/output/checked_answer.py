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
- when a value fails, the tokens from a sampled token of the failed part that *says
  something* to the end are undone, and that token is banned at its position with
  every token that would fail the same way (:mod:`.token_bans`), so the next draw
  there differs. The failed part is the least that can mend the failure (the value, the
  member its error is about, an item or key a container's prefix breaks, the closing
  bracket of a container that wants more; see
  :mod:`~thinkstruct.grammar.runtime.value_checks`). A part that must be one of some
  values is drawn again from the token where its text stops leading to one of them;
  a key, a closing bracket or a separator from its first drawn token; any other part from its last drawn token,
  then earlier ones (:data:`LATER_TRIES` each), then its first. A token that only opens
  the value (whitespace, ``"``, ``[``, ``{``, as ``' "'`` before ``red``) is kept: every
  other value would open the same way, and banning it would leave little but
  whitespace to draw there. Tokens the grammar forced are never the banned one (they
  would come again). Where every token the grammar allows at the position returned to
  was tried, :meth:`CheckedAnswer.back_off` undoes further;
- at the end of the answer (a stop token) a number at the root closes and is checked.

Units: token counts; the checker's offsets are characters of the answer text.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from typing import TYPE_CHECKING

from thinkstruct.engine.output.processor import ThoughtTracker
from thinkstruct.engine.output.token_bans import STRUCTURAL, Targets, TokenBans
from thinkstruct.engine.sampling.logprobs import SampledLogprob
from thinkstruct.grammar.runtime.tag_checks import AnswerChecker, answer_checker

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from thinkstruct.engine.output.detokenizer import TokenTexts
    from thinkstruct.grammar.runtime.end_tag import EndTagMatcher
    from thinkstruct.grammar.runtime.value_checks import CheckFailure
    from thinkstruct.grammar.schema.tag_checks import Checks


#: Characters that only open a value: a token's text made of them alone says nothing yet.
_OPENING = ' \t\n\r"[{'
_WHITESPACE = " \t\n\r"
#: Tries at a failed part's later drawn token before an earlier one is drawn again (the
#: part's first drawn token has the engine's ``check_tries_per_value``).
LATER_TRIES = 2


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
        banned: the tokens to forbid at the position the undo returns to (the failed
            part's first sampled token, and those that would fail the same way there).
        failure: what failed, for the error when the tries run out.
    """

    tokens: int
    grammar_tokens: int
    banned: frozenset[int]
    failure: CheckFailure

    @property
    def possible(self) -> bool:
        """Whether the value can be tried again (some of it was drawn, none of it sent)."""
        return bool(self.banned)


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
        self._bans = TokenBans.of(texts)
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
        self,
        tokens: list[int],
        *,
        forced: int,
        logprob: SampledLogprob | None,
        allowed: int,
        tries: Callable[[int], int] = lambda back: 0,
    ) -> Settled:
        """Take a group of settled tokens (the first sampled unless all were forced, the
        last ``forced`` forced; a stop token only last). ``tries(n)``: how many times the
        position ``n`` generated tokens back (counted from the last of ``tokens``) was
        drawn again already."""
        release: list[SettledToken] = []
        for k, token in enumerate(tokens):
            sampled = k < len(tokens) - forced
            settled = SettledToken(token, sampled, logprob if sampled else None, allowed if sampled else 1)
            if token in self._stop_ids:
                failure = self._checker.finish() if self._checker is not None else None
                if failure is not None:
                    return Settled(release=[], undo=self._undo(failure, after=tokens[k:], tries=tries))
                release.extend(self._held)
                self._held.clear()
                continue
            if self._checker is None and self._thought.step(token):
                release.append(settled)  # the thought: never held, never checked
                continue
            failure = self._feed(settled)
            if failure is not None:
                return Settled(release=[], undo=self._undo(failure, after=tokens[k + 1 :], tries=tries))
        release.extend(self._release())
        return Settled(release=release, undo=None)

    def back_off(self, failure: CheckFailure, *, tries: Callable[[int], int]) -> Undo:
        """Where the part of ``failure`` was taken back to, every token the grammar allows
        was tried (a dead end: ``2024-02-3`` with ``0`` and ``1`` banned): undo further, to
        the part's last drawn token still kept, or the last drawn before it
        (``tries`` as in :meth:`settle`)."""
        return self._undo(failure, after=[], tries=tries)

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

    def _undo(self, failure: CheckFailure, *, after: list[int], tries: Callable[[int], int]) -> Undo:
        """Undo back to a drawn token of the failed part (:meth:`_points`: the first
        tried fewer than :data:`LATER_TRIES` times, else the part's first, whose tries
        the engine bounds); ``after``: the group's tokens the grammar
        accepted after the last one fed (the stop token that closed the answer, or forced
        tokens)."""
        checker = self._checker
        if checker is None:
            raise RuntimeError("a value failed before the answer started")
        visible = sum(1 for t in after if t not in self._stop_ids)
        points = [
            p for p in self._points(failure, checker.pieces_since(failure.start)) if p <= len(self._held)
        ]
        if not points:
            # Part of it already reached the caller (or nothing was drawn): no new try.
            return Undo(tokens=0, grammar_tokens=0, banned=frozenset(), failure=failure)
        pieces = next((p for p in points[:-1] if tries(p + visible) < LATER_TRIES), points[-1])
        banned = {self._fed[-pieces].token} | self._same_failures(failure, pieces)
        checker.rollback(pieces)
        del self._fed[-pieces:]
        del self._texts_fed[-pieces:]
        del self._held[-pieces:]
        self._decoder.setstate(self._decoders[-pieces])
        del self._decoders[-pieces:]
        return Undo(
            tokens=pieces + visible,
            grammar_tokens=pieces + len(after),
            banned=frozenset(banned),
            failure=failure,
        )

    def _points(self, failure: CheckFailure, span: int) -> list[int]:
        """Where the failed part may be drawn again from, best first, each as the number
        of fed tokens to undo: its drawn tokens that say something (a token that only
        opens it, as ``' "'`` before ``red``, is kept: every other value would open the
        same way). A part that must be one of a few values, or a closing bracket or
        separator, is drawn again from its first such token; any other from its last,
        then each one before it (the least that can mend it first: ``9.7`` of ``9.74``
        still becomes a multiple of 0.25). A part the grammar forced whole: the last
        token drawn before it."""
        fed = self._fed[len(self._fed) - span :]
        texts = self._texts_fed[len(self._texts_fed) - span :]

        def part(i: int) -> str:  # its text inside the failed part
            start, text = texts[i]
            return text[max(0, failure.start - start) : max(0, failure.end - start)]

        sayers = [i for i, t in enumerate(fed) if t.sampled and part(i).strip(_OPENING)]
        if not sayers:
            before = self._fed[: len(self._fed) - span]
            last = next((i for i in range(len(before) - 1, -1, -1) if before[i].sampled), None)
            return [] if last is None else [len(self._fed) - last]
        first = sayers[0]
        if failure.expected is not None:
            return [span - _diverging(failure.start, Targets(failure.expected), fed, texts, first)]
        if failure.keyword == "propertyNames" or part(first).lstrip(_WHITESPACE)[:1] in STRUCTURAL:
            return [span - first]  # a key, a bracket or a separator: drawn again whole
        return [span - i for i in reversed(sayers)]

    def _same_failures(self, failure: CheckFailure, pieces: int) -> frozenset[int]:
        """The tokens that would fail as the last ``pieces`` fed tokens' first did, at its
        position (see :mod:`~thinkstruct.engine.output.token_bans`)."""
        start, text = self._texts_fed[-pieces]
        if start + len(text) <= failure.start:
            return frozenset()  # a token before the part: only it is banned
        cut = max(0, failure.start - start)
        head, tail = text[:cut], text[cut:].lstrip(_WHITESPACE)
        if tail[:1] in STRUCTURAL and failure.expected is None:
            return self._bans.structural(head, tail[0])
        if failure.expected is not None:
            kept = [
                t for s, t in self._texts_fed[: len(self._texts_fed) - pieces] if s + len(t) > failure.start
            ]
            written = "".join(kept)
            if kept:
                first = len(self._texts_fed) - pieces - len(kept)
                written = written[max(0, failure.start - self._texts_fed[first][0]) :]
            return self._bans.beginning_none_of(written, failure.expected)
        return frozenset()


def _diverging(
    start: int, targets: Targets, fed: list[SettledToken], texts: list[tuple[int, str]], first: int
) -> int:
    """The drawn token (an index into ``fed``, whose ``texts`` hold each token's offset and
    text) from which the failed part's text, from offset ``start``, can no longer become
    one of ``targets`` (``1.1`` of ``1.19`` for a multiple of 0.25: ``1.`` may still
    become ``1.25``); ``first`` (the part's first drawn token) where none is found."""
    written = ""
    drawn = first
    for i, (offset, text) in enumerate(texts):
        written += text[max(0, start - offset) :]
        if i >= first and fed[i].sampled:
            drawn = i
        if written and not targets.toward(written):
            return drawn
    return first
