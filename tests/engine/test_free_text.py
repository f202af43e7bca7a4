"""Free text after a thought (:class:`FreeTextMatcher` with ``blank_ids``): the response may
stop only once the answer has a token that is not whitespace, whatever was accepted and
rolled back before."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thinkstruct import Tokenizer
from thinkstruct.engine.core.thinking_budget import FreeTextMatcher, blank_token_ids
from thinkstruct.grammar.runtime.bitmask import allocate_bitmask, is_allowed

STOP = 0
BLANK = frozenset({1, 2})
VOCAB = 8  # ids 3..7 have text


def _stop_allowed(matcher: FreeTextMatcher) -> bool:
    mask = allocate_bitmask(1, VOCAB)
    matcher.fill_bitmask(mask, 0)
    return is_allowed(mask, 0, STOP)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.integers(1, VOCAB - 1), st.integers(-4, -1)), max_size=30))
def test_a_stop_only_after_text(actions: list[int]) -> None:
    matcher = FreeTextMatcher(frozenset({STOP}), blank_ids=BLANK)
    accepted: list[int] = []
    for action in actions:
        if action > 0:
            assert matcher.accept_token(action)
            accepted.append(action)
        else:
            n = min(-action, len(accepted))
            matcher.rollback(n)
            del accepted[len(accepted) - n :]
        has_text = any(t not in BLANK for t in accepted)
        assert _stop_allowed(matcher) is has_text
        assert matcher.validate_tokens([STOP]) == int(has_text)
    has_text = any(t not in BLANK for t in accepted)
    assert matcher.accept_token(STOP) is has_text
    assert matcher.is_terminated() is has_text


def test_without_blank_ids_a_stop_may_come_at_once() -> None:
    matcher = FreeTextMatcher(frozenset({STOP}))
    assert _stop_allowed(matcher)
    assert matcher.accept_token(STOP) and matcher.is_terminated()


def test_copies_keep_the_rule_and_start_over() -> None:
    matcher = FreeTextMatcher(frozenset({STOP}), blank_ids=BLANK)
    matcher.accept_token(5)
    fresh = matcher.copy()
    assert _stop_allowed(matcher) and not _stop_allowed(fresh)


@pytest.mark.parametrize(
    "text, blank", [(" ", True), ("\n\n", True), ("\t", True), ("a", False), (" the", False)]
)
def test_blank_ids_on_the_real_tokenizer(text: str, blank: bool) -> None:
    tokenizer = Tokenizer.default()
    (token,) = tokenizer.encode(text)
    assert (token in blank_token_ids(tokenizer)) is blank
