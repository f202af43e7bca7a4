"""Incremental detokenization and stop strings: streamed text equals whole-text results."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thinkstruct.engine.output.detokenizer import IncrementalDetokenizer, TokenTexts
from thinkstruct.engine.output.stop_strings import StopStringMatcher

# Multi-byte characters that byte-level vocabularies split across tokens.
_TEXT = st.text(
    alphabet=st.sampled_from(
        list('abc xyz{}":,\n') + ["é", "ß", "漢", "字", "🙂", "👍", "\U0001f3fd", "\u200d", "ñ"]
    ),
    max_size=40,
)


@pytest.fixture(scope="module")
def texts(tokenizer) -> TokenTexts:
    return TokenTexts(tokenizer)


@settings(max_examples=60, deadline=None)
@given(text=_TEXT)
def test_token_by_token_gives_the_text_and_never_half_a_character(tokenizer, texts, text: str) -> None:
    ids = tokenizer.encode(text)
    detok = IncrementalDetokenizer(texts)
    pieces = [detok.add([t]) for t in ids] + [detok.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


def test_special_tokens_keep_their_text_and_stop_tokens_have_none(tokenizer, texts) -> None:
    detok = IncrementalDetokenizer(texts)
    think = [*tokenizer.think_start_ids, *tokenizer.encode("hm"), *tokenizer.think_end_ids]
    eos = tokenizer.eos_token_ids[0]
    assert detok.add([*think, eos]) + detok.flush() == "<think>hm</think>"


def test_a_stray_continuation_byte_becomes_a_replacement_character(tokenizer, texts) -> None:
    # A token whose bytes start mid-character, emitted on its own.
    partial = next(i for i in range(tokenizer.vocab_size) if texts[i][:1] and 0x80 <= texts[i][0] < 0xC0)
    detok = IncrementalDetokenizer(texts)
    assert "\ufffd" in detok.add([partial]) + detok.flush()


def _whole(text: str, stops: tuple[str, ...]) -> str:
    # Cut before the stop string that completes first (at a tie, the longer one).
    ends = [(i + len(s), i) for s in stops if (i := text.find(s)) >= 0]
    return text[: min(ends)[1]] if ends else text


def test_the_stop_string_that_completes_first_wins() -> None:
    matcher = StopStringMatcher(("D", "EDD"))
    assert matcher.feed("ED") + matcher.feed("D") + matcher.flush() == "E"
    matcher = StopStringMatcher(("ND", "END"))
    assert matcher.feed("xEND") + matcher.flush() == "x"


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(alphabet="abEND\n", max_size=60),
    stops=st.lists(st.text(alphabet="abEND\n", min_size=1, max_size=5), min_size=1, max_size=3).map(tuple),
    cuts=st.lists(st.integers(0, 60), max_size=8),
)
def test_any_chunking_cuts_where_the_whole_text_would(
    text: str, stops: tuple[str, ...], cuts: list[int]
) -> None:
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    matcher = StopStringMatcher(stops)
    out = "".join(matcher.feed(text[a:b]) for a, b in itertools.pairwise(bounds)) + matcher.flush()
    assert out == _whole(text, stops)
    assert matcher.stopped == any(s in text for s in stops)
