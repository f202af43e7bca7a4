"""The tokens banned where a failed part of a checked answer is drawn again, over
SmolLM2's vocabulary: a ban never takes away the way to write a value that mends the
failure, and takes away every token that would fail the same way."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thinkstruct.engine.output.detokenizer import TokenTexts
from thinkstruct.engine.output.token_bans import Targets, TokenBans

VALUES = st.integers(-20, 120) | st.sampled_from(["red", "green", "x", "meow", "2024-02-29", True, None])


@pytest.fixture(scope="module")
def bans(tokenizer: Any) -> TokenBans:
    return TokenBans.of(TokenTexts(tokenizer))


@settings(max_examples=60, deadline=None)
@given(expected=st.lists(VALUES, min_size=1, max_size=3, unique_by=lambda v: json.dumps(v)))
def test_the_tokens_that_begin_an_expected_value_stay_allowed(
    tokenizer: Any, bans: TokenBans, expected: list[Any]
) -> None:
    banned = bans.beginning_none_of("", tuple(expected))
    for value in expected:
        text = json.dumps(value)
        for written in (text, " " + text):  # as the value begins, after a separator or not
            assert tokenizer.encode(written)[0] not in banned, written
    # Every other digit alone begins none of them: banned.
    texts = {json.dumps(v) for v in expected}
    for digit in "0123456789":
        if not any(t.startswith(digit) for t in texts):
            assert tokenizer.encode(digit)[0] in banned


def test_a_value_under_way_is_continued_only_toward_an_expected_one(tokenizer: Any, bans: TokenBans) -> None:
    # '"' written so far, 'red' or 'green' wanted: 'g' continues one, 'b' neither.
    banned = bans.beginning_none_of('"', ("red", "green"))
    assert tokenizer.encode("g")[0] not in banned and tokenizer.encode("red")[0] not in banned
    assert tokenizer.encode("b")[0] in banned


def test_a_closing_bracket_is_banned_whatever_whitespace_it_carries(tokenizer: Any, bans: TokenBans) -> None:
    banned = bans.structural("", "]")
    texts = TokenTexts(tokenizer)
    closing = [
        i for i in range(len(texts)) if texts[i].decode("utf-8", "replace").strip(" \n\t\r").startswith("]")
    ]
    assert len(closing) > 3 and set(closing) <= banned
    assert tokenizer.encode(",")[0] not in banned and tokenizer.encode(", ")[0] not in banned
    # After the last item's text in the same token ('7]'): only tokens holding that text first.
    assert bans.structural("7", "]") <= {i for i in range(len(texts)) if texts[i].lstrip().startswith(b"7")}


@settings(max_examples=300, deadline=None)
@given(
    expected=st.lists(VALUES, min_size=1, max_size=5),
    text=st.text(alphabet='0123456789.-"redgnx ,]}', max_size=8),
)
def test_a_text_leads_to_an_expected_value_when_it_begins_one_or_is_one_then_its_end(
    expected: list[Any], text: str
) -> None:
    texts = {json.dumps(v, separators=(",", ":")) for v in expected}
    begins = any(t.startswith(text) for t in texts)
    ended = any(text.startswith(t) and len(text) > len(t) and text[len(t)] in " ,]}" for t in texts)
    assert Targets(tuple(expected)).toward(text) == (begins or ended)
