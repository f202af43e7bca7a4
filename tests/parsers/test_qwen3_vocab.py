"""The qwen3 families over Qwen3's real 151k vocabulary: the chat template with thinking on
and off as token ids, and the reasoning split and tool calls of outputs written as the
model writes them (``<think>``, ``</think>``, ``<tool_call>`` one token each), detokenized
token by token as the engine does."""

from __future__ import annotations

import json
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stream_helpers import run_stream

from thinkstruct import Tokenizer
from thinkstruct.engine.output.detokenizer import IncrementalDetokenizer, TokenTexts
from thinkstruct.parsers import ChatPrompt, ParseResult, ReasoningParser, render_chat
from thinkstruct.parsers.tool_calls import ToolCall, ToolCallParser, join_results
from thinkstruct.vocabularies import QWEN3

IM_START, IM_END, ENDOFTEXT = (QWEN3.token_id(t) for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"))
THINK, END_THINK = QWEN3.token_id("<think>"), QWEN3.token_id("</think>")
TOOL_CALL, END_TOOL_CALL = QWEN3.token_id("<tool_call>"), QWEN3.token_id("</tool_call>")
TOOL_RESPONSE = QWEN3.token_id("<tool_response>")

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in 東京 tomorrow? 🌦"},
]
WEATHER = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            },
        },
    }
]


def prompt_ids(tok: Tokenizer, prompt: ChatPrompt) -> list[int]:
    """The prompt as the server encodes it: tag texts become their token ids."""
    ids: list[int] = tok.hf(prompt.text, add_special_tokens=False)["input_ids"]
    return ids


def chat(tok: Tokenizer, family: str = "qwen3", messages=CHAT, **kwargs) -> ChatPrompt:
    return render_chat(messages, family=family, tokenizer=tok, **kwargs)


# ---- chat template ------------------------------------------------------------------------


def test_thinking_on_leaves_the_tag_to_the_model(qwen3_tokenizer: Tokenizer) -> None:
    tok = qwen3_tokenizer
    assert tok.chat_template is None  # the family's built-in template renders
    for kwargs in ({}, {"chat_template_kwargs": {"enable_thinking": True}}):
        prompt = chat(tok, **kwargs)
        assert prompt.reasoning_enabled and not prompt.starts_in_thought
        ids = prompt_ids(tok, prompt)
        assert ids.count(IM_START) == 3 and ids.count(IM_END) == 2
        assert ids[-3:] == [IM_START, *tok.encode("assistant\n")]
        assert THINK not in ids
        assert tok.decode(ids) == prompt.text
        # Under a grammar the prompt opens the thought where the model would have.
        opened = prompt_ids(tok, prompt.with_thought_open())
        assert opened == [*ids, THINK, *tok.encode("\n")]


def test_thinking_off_closes_an_empty_thought_in_the_prompt(qwen3_tokenizer: Tokenizer) -> None:
    tok = qwen3_tokenizer
    prompt = chat(tok, chat_template_kwargs={"enable_thinking": False})
    assert not prompt.reasoning_enabled
    ids = prompt_ids(tok, prompt)
    empty_thought = [THINK, *tok.encode("\n\n"), END_THINK, *tok.encode("\n\n")]
    assert ids[-len(empty_thought) :] == empty_thought
    assert ids.count(THINK) == ids.count(END_THINK) == 1
    assert tok.decode(ids) == prompt.text


def test_thinking_family_opens_the_thought_in_the_prompt(qwen3_tokenizer: Tokenizer) -> None:
    prompt = chat(qwen3_tokenizer, family="qwen3-thinking")
    assert prompt.reasoning_enabled and prompt.starts_in_thought
    assert prompt_ids(qwen3_tokenizer, prompt)[-2:] == [THINK, *qwen3_tokenizer.encode("\n")]


def test_history_tools_and_responses_are_single_tokens(qwen3_tokenizer: Tokenizer) -> None:
    tok = qwen3_tokenizer
    messages = [
        *CHAT,
        {
            "role": "assistant",
            "content": "<think>\nlook it up\n</think>\n\n",
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "東京"}'}}
            ],
        },
        {"role": "tool", "content": '{"rain": true}'},
    ]
    ids = prompt_ids(tok, chat(tok, messages=messages, tools=WEATHER))
    # the system prompt's two (format line, example) and the history's call
    assert ids.count(TOOL_CALL) == ids.count(END_TOOL_CALL) == 3
    assert ids.count(TOOL_RESPONSE) == 1
    assert THINK not in ids  # an earlier turn's thought is dropped from the history
    text = tok.decode(ids)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "東京"}}\n</tool_call>' in text


# ---- outputs: reasoning split and tool calls -------------------------------------------------


def detokenized_stream(tok: Tokenizer, ids: list[int]) -> list[str]:
    """The text deltas the engine hands the parsers: one per token (a character whose bytes
    span tokens comes whole, with its last token); stop tokens have no text."""
    detok = IncrementalDetokenizer(TokenTexts(tok))
    return [*(detok.add([i]) for i in ids), detok.flush()]


def thinking_output(tok: Tokenizer, thought: str, answer: str, *, opened: bool = True) -> list[int]:
    """Ids of an output as Qwen3 writes it: ``<think>\\n{thought}\\n</think>\\n\\n{answer}<|im_end|>``."""
    start = [THINK] if opened else []
    return [*start, *tok.encode(f"\n{thought}\n"), END_THINK, *tok.encode(f"\n\n{answer}"), IM_END]


def split(parser: ReasoningParser, deltas: list[str]) -> ParseResult:
    _, joined = run_stream(parser, deltas)
    assert parser.parse("".join(deltas)) == joined  # streamed == whole
    return joined


# A thought or answer: any text (tag fragments often) but the tags themselves, no
# surrounding whitespace (the parser strips it around tags), in the normal form the
# tokenizer's NFC gives back.
TAGS = ("<think>", "</think>", "<tool_call>", "<|im_end|>")
FRAGMENTS = st.sampled_from(["<", "</", "think", ">", "/think>", "<tool", "_call>", "<|im", " ", "\n"])
prose = (
    st.lists(
        st.one_of(FRAGMENTS, st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)), max_size=8
    )
    .map(lambda parts: unicodedata.normalize("NFC", "".join(parts)).strip())
    .filter(lambda s: bool(s) and not any(t in s for t in TAGS))
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(thought=prose, answer=prose)
def test_reasoning_split_of_token_streams(qwen3_tokenizer: Tokenizer, thought: str, answer: str) -> None:
    tok = qwen3_tokenizer
    on = chat(tok)
    deltas = detokenized_stream(tok, thinking_output(tok, thought, answer))
    assert split(on.reasoning_parser(), deltas) == (thought, answer)
    held = on.reasoning_parser(stream_reasoning=False)
    assert split(held, deltas) == (thought, answer)
    # -Thinking: the prompt opened the thought, the model writes only its end
    forced = chat(tok, family="qwen3-thinking")
    deltas = detokenized_stream(tok, thinking_output(tok, thought, answer, opened=False))
    assert split(forced.reasoning_parser(), deltas) == (thought, answer)
    # thinking off: all of it is the answer
    off = chat(tok, chat_template_kwargs={"enable_thinking": False})
    deltas = detokenized_stream(tok, [*tok.encode(answer), IM_END])
    assert split(off.reasoning_parser(), deltas) == ("", answer)


def test_multibyte_characters_split_across_tokens_arrive_whole(qwen3_tokenizer: Tokenizer) -> None:
    tok = qwen3_tokenizer
    ids = thinking_output(tok, "🧠 thinking 🤔", "答案是 42 🎉")
    deltas = detokenized_stream(tok, ids)
    assert len(deltas) == len(ids) + 1
    assert any(d == "" for d in deltas[:-2])  # some emoji took more than one token
    assert "\ufffd" not in "".join(deltas)
    assert split(chat(tok).reasoning_parser(), deltas) == ("🧠 thinking 🤔", "答案是 42 🎉")


def call_ids(tok: Tokenizer, name: str, arguments: dict) -> list[int]:
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return [TOOL_CALL, *tok.encode(f"\n{body}\n"), END_TOOL_CALL]


def tool_split(tok: Tokenizer, prompt: ChatPrompt, ids: list[int]) -> tuple[str, tuple[ToolCall, ...], str]:
    """Reasoning, then the content's text and calls, streamed token by token through the
    reasoning parser into the tool-call parser (and checked against the whole parse)."""
    reasoning = prompt.reasoning_parser()
    tools = prompt.tool_parser(WEATHER)
    thought, pieces = [], []
    for delta in [*detokenized_stream(tok, ids), None]:
        step = reasoning.finish() if delta is None else reasoning.feed(delta)
        thought.append(step.reasoning)
        pieces.append(tools.feed(step.content))
    pieces.append(tools.finish())
    streamed = join_results(pieces)
    content = reasoning.parse(tok.decode([i for i in ids if i != IM_END])).content
    assert ToolCallParser(prompt.family, tools=WEATHER).parse(content) == streamed
    return "".join(thought), streamed.calls, streamed.content


def test_tool_calls_after_the_thought(qwen3_tokenizer: Tokenizer) -> None:
    tok = qwen3_tokenizer
    ids = [
        THINK,
        *tok.encode("\nTwo cities, two calls.\n"),
        END_THINK,
        *tok.encode("\n\nChecking.\n\n"),
        *call_ids(tok, "get_weather", {"city": "東京", "days": 2}),
        *tok.encode("\n"),
        *call_ids(tok, "get_weather", {"city": "Zürich 🇨🇭"}),
        IM_END,
    ]
    thought, calls, content = tool_split(tok, chat(tok, tools=WEATHER), ids)
    assert thought == "Two cities, two calls."
    assert content == "Checking."
    assert [(c.index, c.name, json.loads(c.arguments)) for c in calls] == [
        (0, "get_weather", {"city": "東京", "days": 2}),
        (1, "get_weather", {"city": "Zürich 🇨🇭"}),
    ]


def test_a_tool_call_token_ends_an_unclosed_thought(qwen3_tokenizer: Tokenizer) -> None:
    tok = qwen3_tokenizer
    ids = [THINK, *tok.encode("\nneed data\n\n"), *call_ids(tok, "get_weather", {"city": "Oslo"}), IM_END]
    thought, calls, content = tool_split(tok, chat(tok, tools=WEATHER), ids)
    assert (thought, content) == ("need data", "")
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Oslo"})]


@pytest.mark.parametrize("stop", [IM_END, ENDOFTEXT])
def test_stop_tokens_add_no_text(qwen3_tokenizer: Tokenizer, stop: int) -> None:
    tok = qwen3_tokenizer
    deltas = detokenized_stream(tok, [*tok.encode("ok"), stop])
    assert "".join(deltas) == "ok"
