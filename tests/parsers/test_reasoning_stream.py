"""Streaming and whole-text parsing agree, for every family, option and chunking.

Texts are drawn from an alphabet of the family's tag fragments, whitespace and a few
letters, so that tags occur, nearly occur, and get split across chunk boundaries.
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stream_helpers import run_stream

from thinkstruct.parsers import ParseResult, ReasoningFormat, ReasoningParser, reasoning_families

FAMILIES = sorted(reasoning_families())
HARMONY_WORDS = ["analysis", "final", "commentary", " to=functions.f", "json", "assistant", "<|", "|>"]
WHITESPACE = [" ", "\n", "\n\n", "\t", "  \n"]
LETTERS = ["a", "b", "x y", "<", "|", "/", ">", "[", "◁", "é", "\u00a0", "\r\n"]


def fragments(family_name: str) -> list[str]:
    family = reasoning_families()[family_name]
    tags = [family.think_start, family.think_end]
    if family.tool_call_start:
        tags.append(family.tool_call_start)
    if family.format is ReasoningFormat.HARMONY:
        from thinkstruct.parsers.harmony_parser import TOKENS

        tags += list(TOKENS) + HARMONY_WORDS
    pieces = set(tags)
    for tag in tags:  # prefixes and suffixes, so that near-misses and splits are common
        for k in range(1, len(tag)):
            if k <= 3 or k >= len(tag) - 3:
                pieces.add(tag[:k])
                pieces.add(tag[k:])
    return sorted(pieces)


@functools.cache
def pieces(family_name: str) -> st.SearchStrategy[list[str]]:
    frags = fragments(family_name)
    piece = st.one_of(
        st.sampled_from(frags),
        st.sampled_from(frags),  # tags twice as likely as anything else
        st.sampled_from(WHITESPACE),
        st.sampled_from(LETTERS),
    )
    return st.lists(piece, max_size=14)


def texts(family_name: str) -> st.SearchStrategy[str]:
    return pieces(family_name).map("".join)


@st.composite
def chunked_text(draw: st.DrawFn, family_name: str) -> tuple[str, list[str]]:
    """A text and a cut of it into chunks. Cuts fall at piece boundaries (so a chunk often
    ends exactly on a tag prefix) and inside pieces (so tags get split anywhere)."""
    parts = draw(pieces(family_name))
    chunks: list[str] = []
    current = ""
    for part in parts:
        action = draw(st.integers(min_value=0, max_value=3))
        if action == 0:  # keep going: the chunk spans this piece
            current += part
        elif action == 1:  # end the chunk after this piece
            chunks.append(current + part)
            current = ""
        else:  # cut inside this piece
            k = draw(st.integers(min_value=0, max_value=len(part)))
            chunks.append(current + part[:k])
            current = part[k:]
    chunks.append(current)
    return "".join(parts), chunks


@st.composite
def case(draw: st.DrawFn, family_name: str):
    text, chunks = draw(chunked_text(family_name))
    options = {
        "enabled": draw(st.sampled_from([True, True, True, False])),
        "force_reasoning": draw(st.sampled_from([None, None, True, False])),
    }
    if draw(st.booleans()):
        options["continue_final_message"] = True
        options["previous_content"] = draw(texts(family_name))
    return text, chunks, options


SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
QUICK = settings(SETTINGS, max_examples=40)


@pytest.mark.parametrize("stream_reasoning", [True, False], ids=["stream", "hold"])
@pytest.mark.parametrize("family", FAMILIES)
def test_any_chunking_gives_the_whole_text_result(family: str, stream_reasoning: bool) -> None:
    @SETTINGS
    @given(case(family))
    def check(drawn) -> None:
        text, chunks, options = drawn
        whole = ReasoningParser(family, stream_reasoning=stream_reasoning, **options).parse(text)
        streamed = run_stream(ReasoningParser(family, stream_reasoning=stream_reasoning, **options), chunks)[
            1
        ]
        assert streamed == whole, f"chunks={chunks!r} options={options!r}"

    check()


@pytest.mark.parametrize("family", FAMILIES)
def test_held_reasoning_is_released_only_when_the_thought_ends(family: str) -> None:
    """With stream_reasoning=False no reasoning comes out while the thought is still open."""

    @QUICK
    @given(case(family))
    def check(drawn) -> None:
        _, chunks, options = drawn
        parser = ReasoningParser(family, stream_reasoning=False, **options)
        for chunk in chunks:
            result = parser.feed(chunk)
            if result.reasoning:
                assert not parser.in_reasoning, f"reasoning released mid-thought: chunks={chunks!r}"
        parser.finish()

    check()


@pytest.mark.parametrize("family", FAMILIES)
def test_one_character_chunks_match_parse_on_a_real_shape(family: str) -> None:
    spec = reasoning_families()[family]
    if spec.format is ReasoningFormat.HARMONY:
        text = (
            "<|channel|>analysis<|message|>Need the weather.<|end|>"
            "<|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>"
        )
    else:
        text = f"{spec.think_start}\nStep 1: read.\nStep 2: answer.\n{spec.think_end}\n\nThe answer is 4."
    parser = ReasoningParser(family, force_reasoning=False)
    results, joined = run_stream(parser, list(text))
    assert joined == ReasoningParser(family, force_reasoning=False).parse(text)
    assert joined.content.endswith("4.") or joined.content == "It is sunny."
    # Streamed means streamed: the reasoning arrives over many calls, not all at the end.
    assert sum(1 for r in results if r.reasoning) > 5


def test_stream_results_are_parse_results() -> None:
    parser = ReasoningParser("qwen3")
    result = parser.feed("<think>hi")
    assert isinstance(result, ParseResult)
    assert result == ParseResult("hi", "")
    assert result.reasoning == "hi" and result.content == ""
