"""ReasoningParser on real output shapes of every family, whole and streamed."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
from stream_helpers import run_stream

from thinkstruct.parsers import ParseResult, ReasoningParser, UnknownName, reasoning_families

TOOL_JSON = '{"name": "get_weather", "arguments": {"city": "Paris"}}'

# (family, shape, output text, parser options, expected reasoning, expected content)
SHAPES: list[tuple[str, str, str, dict, str, str]] = [
    # ---- deepseek-r1: the prompt opened <think>; newer checkpoints echo it anyway
    (
        "deepseek-r1",
        "forced, no start tag",
        "Okay, 2+2.\nThat is 4.\n</think>\n\nThe answer is **4**.",
        {},
        "Okay, 2+2.\nThat is 4.",
        "The answer is **4**.",
    ),
    ("deepseek-r1", "echoed start tag", "<think>\nOkay, 2+2.\n</think>\n\n4", {}, "Okay, 2+2.", "4"),
    ("deepseek-r1", "truncated", "Okay, let me count: 1, 2, 3", {}, "Okay, let me count: 1, 2, 3", ""),
    ("deepseek-r1", "empty thought", "\n\n</think>\n\nHello!", {}, "", "Hello!"),
    (
        "deepseek-r1",
        "tags inside the answer are text",
        "Hm.</think>Use <think> tags.</think>",
        {},
        "Hm.",
        "Use <think> tags.</think>",
    ),
    # ---- deepseek-v3 / v4: thinking=true makes the template open <think>
    (
        "deepseek-v3",
        "thinking on",
        "The user greets me.</think>Hello! How can I help?",
        {},
        "The user greets me.",
        "Hello! How can I help?",
    ),
    (
        "deepseek-v3",
        "thinking off: all content",
        "Hello! How can I help?",
        {"enabled": False},
        "",
        "Hello! How can I help?",
    ),
    (
        "deepseek-v3",
        "tool call mid-thought",
        "Need weather.\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{}<｜tool▁call▁end｜>",
        {},
        "Need weather.",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{}<｜tool▁call▁end｜>",
    ),
    ("deepseek-v4", "thinking on", "<think>Compute 6*7.</think>\n42", {}, "Compute 6*7.", "42"),
    ("deepseek-v4", "truncated", "Compute 6*7 = ", {}, "Compute 6*7 =", ""),
    (
        "deepseek-v4",
        "tool call mid-thought",
        'Look it up.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="s">',
        {},
        "Look it up.",
        '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="s">',
    ),
    (
        "deepseek-v4",
        "stray end tag after a call",
        "Look.<｜DSML｜tool_calls>x</｜DSML｜tool_calls></think>Done",
        {},
        "Look.",
        "<｜DSML｜tool_calls>x</｜DSML｜tool_calls>Done",
    ),
    ("deepseek-v4", "empty thought", "</think>Direct answer.", {}, "", "Direct answer."),
    # ---- qwen3: the model writes <think> itself
    (
        "qwen3",
        "with tags",
        "<think>\nThe user wants a haiku.\n</think>\n\nAn old silent pond",
        {},
        "The user wants a haiku.",
        "An old silent pond",
    ),
    ("qwen3", "no tags", "An old silent pond", {}, "", "An old silent pond"),
    (
        "qwen3",
        "enable_thinking=false output",
        "<think>\n\n</think>\n\nAn old pond",
        {"enabled": False},
        "",
        "<think>\n\n</think>\n\nAn old pond",
    ),
    ("qwen3", "empty thought", "<think>\n\n</think>\n\nHi.", {}, "", "Hi."),
    ("qwen3", "truncated", "<think>\nFirst, I need", {}, "First, I need", ""),
    (
        "qwen3",
        "tool call mid-thought",
        f"<think>\nI should check the weather.\n<tool_call>\n{TOOL_JSON}\n</tool_call>",
        {},
        "I should check the weather.",
        f"<tool_call>\n{TOOL_JSON}\n</tool_call>",
    ),
    (
        "qwen3",
        "tool call after thought",
        f"<think>\nCall it.\n</think>\n\n<tool_call>\n{TOOL_JSON}\n</tool_call>",
        {},
        "Call it.",
        f"<tool_call>\n{TOOL_JSON}\n</tool_call>",
    ),
    ("qwen3", "leading whitespace before the tag", "\n\n<think>Hm.</think>Ok.", {}, "Hm.", "Ok."),
    (
        "qwen3",
        "start tag after text is content",
        "Sure. <think>not a thought</think>",
        {},
        "",
        "Sure. <think>not a thought</think>",
    ),
    ("qwen3", "unmatched end tag is dropped", "Hello</think>world", {}, "", "Helloworld"),
    (
        "qwen3",
        "stray end tag after a mid-thought call",
        f"<think>\nCheck.\n<tool_call>\n{TOOL_JSON}\n</tool_call></think>\n\nDone.",
        {},
        "Check.",
        f"<tool_call>\n{TOOL_JSON}\n</tool_call>\n\nDone.",
    ),
    (
        "qwen3",
        "a start tag before the end tag makes them text",
        "<think>a<tool_call>{}</tool_call> <think>b</think>",
        {},
        "a",
        "<tool_call>{}</tool_call> <think>b</think>",
    ),
    # ---- qwen3.5: the template opens <think> unless enable_thinking=false
    (
        "qwen3.5",
        "forced",
        "The user wants weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n"
        "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
        {},
        "The user wants weather.",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
    ),
    (
        "qwen3.5",
        "tool call mid-thought",
        "Need weather.\n<tool_call>\n<function=get_weather>",
        {},
        "Need weather.",
        "<tool_call>\n<function=get_weather>",
    ),
    ("qwen3.5", "thinking off", "Hello!", {"enabled": False}, "", "Hello!"),
    # ---- kimi-k2: the model writes <think>; calls in section tokens
    (
        "kimi-k2",
        "thought then call",
        "<think>Need the weather.</think><|tool_calls_section_begin|><|tool_call_begin|>"
        'functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>',
        {},
        "Need the weather.",
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>',
    ),
    (
        "kimi-k2",
        "call mid-thought, stray end tag",
        "<think>Need it.<|tool_calls_section_begin|>x<|tool_calls_section_end|></think>ok",
        {},
        "Need it.",
        "<|tool_calls_section_begin|>x<|tool_calls_section_end|>ok",
    ),
    ("kimi-k2", "thinking off", "<think></think>Hi", {}, "", "Hi"),
    # ---- glm47: the template opens <think>
    ("glm47", "forced", "Greeting.</think>Hello!", {}, "Greeting.", "Hello!"),
    (
        "glm47",
        "tool call mid-thought",
        "Weather.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>",
        {},
        "Weather.",
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>",
    ),
    ("glm47", "thinking off", "Hello!", {"enabled": False}, "", "Hello!"),
    # ---- hunyuan: <think> written by the model, the answer in <answer> (left in content)
    (
        "hunyuan",
        "with tags",
        "<think>\nThe user greets me.\n</think>\n<answer>\nHello!\n</answer>",
        {},
        "The user greets me.",
        "<answer>\nHello!\n</answer>",
    ),
    (
        "hunyuan",
        "tool call mid-thought",
        '<think>Weather.\n<tool_calls>[{"name": "w", "arguments": {}}]</tool_calls>',
        {},
        "Weather.",
        '<tool_calls>[{"name": "w", "arguments": {}}]</tool_calls>',
    ),
    # ---- gemma4: <|channel>thought ... <channel|>
    (
        "gemma4",
        "with thought",
        "<|channel>thought\nThe user greets me.<channel|>Hello!",
        {},
        "The user greets me.",
        "Hello!",
    ),
    ("gemma4", "no thought", "Hello!", {}, "", "Hello!"),
    (
        "gemma4",
        "tool call mid-thought",
        "<|channel>thought\nCall it.<|tool_call>call:w{}<tool_call|>",
        {},
        "Call it.",
        "<|tool_call>call:w{}<tool_call|>",
    ),
    # ---- nemotron3: the template opens <think>
    ("nemotron3", "forced", "Simple greeting.\n</think>\nHi there!", {}, "Simple greeting.", "Hi there!"),
    ("nemotron3", "empty thought when off", "Hi there!", {"enabled": False}, "", "Hi there!"),
    # ---- minimax-m2: always thinks, the template opens <think>
    (
        "minimax-m2",
        "forced, then a call",
        'The user wants weather.\n</think>\n\n<minimax:tool_call>\n<invoke name="w">\n'
        "</invoke>\n</minimax:tool_call>",
        {},
        "The user wants weather.",
        '<minimax:tool_call>\n<invoke name="w">\n</invoke>\n</minimax:tool_call>',
    ),
    (
        "minimax-m2",
        "call mid-thought",
        'Check.<minimax:tool_call><invoke name="w">',
        {},
        "Check.",
        '<minimax:tool_call><invoke name="w">',
    ),
    # ---- granite: thinking=true; the answer in <response> (left in content)
    (
        "granite",
        "with tags",
        "<think>Let me think.</think><response>Hello!</response>",
        {},
        "Let me think.",
        "<response>Hello!</response>",
    ),
    (
        "granite",
        "tool call",
        '<|tool_call|>[{"name": "w", "arguments": {}}]',
        {},
        "",
        '<|tool_call|>[{"name": "w", "arguments": {}}]',
    ),
    # ---- qwen3-thinking: forced
    (
        "qwen3-thinking",
        "forced",
        "Okay, the user asks for 2+2.\n</think>\n\n4",
        {},
        "Okay, the user asks for 2+2.",
        "4",
    ),
    (
        "qwen3-thinking",
        "tool call mid-thought",
        f"Need a tool.\n<tool_call>\n{TOOL_JSON}\n</tool_call>",
        {},
        "Need a tool.",
        f"<tool_call>\n{TOOL_JSON}\n</tool_call>",
    ),
    ("qwen3-thinking", "truncated", "Let me think about", {}, "Let me think about", ""),
    # ---- kimi
    (
        "kimi",
        "with tags",
        "◁think▷The image shows a cat.◁/think▷It is a cat.",
        {},
        "The image shows a cat.",
        "It is a cat.",
    ),
    ("kimi", "no tags", "It is a cat.", {}, "", "It is a cat."),
    ("kimi", "truncated", "◁think▷The image", {}, "The image", ""),
    ("kimi", "empty thought", "◁think▷◁/think▷Cat.", {}, "", "Cat."),
    # ---- glm45
    ("glm45", "with tags", "<think>Greeting.</think>\nHello!", {}, "Greeting.", "Hello!"),
    (
        "glm45",
        "thinking off",
        "\n<think></think>\nHello!",
        {"enabled": False},
        "",
        "\n<think></think>\nHello!",
    ),
    (
        "glm45",
        "tool call mid-thought",
        "<think>Weather needed.<tool_call>get_weather\n<arg_key>city</arg_key>",
        {},
        "Weather needed.",
        "<tool_call>get_weather\n<arg_key>city</arg_key>",
    ),
    ("glm45", "truncated", "<think>Greeting", {}, "Greeting", ""),
    # ---- mistral
    (
        "mistral",
        "with tags",
        "[THINK]Simple arithmetic.[/THINK]The sum is 4.",
        {},
        "Simple arithmetic.",
        "The sum is 4.",
    ),
    ("mistral", "no tags", "The sum is 4.", {}, "", "The sum is 4."),
    (
        "mistral",
        "tool call mid-thought",
        '[THINK]Use the tool.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
        {},
        "Use the tool.",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
    ),
    ("mistral", "truncated", "[THINK]Simple", {}, "Simple", ""),
    ("mistral", "empty thought", "[THINK][/THINK]4", {}, "", "4"),
    (
        "mistral",
        "stray end tag after a call",
        "[THINK]Use it.[TOOL_CALLS]f[ARGS]{}[/THINK]ok",
        {},
        "Use it.",
        "[TOOL_CALLS]f[ARGS]{}ok",
    ),
    # ---- cohere-command: the template opens <|START_THINKING|>
    (
        "cohere-command",
        "forced",
        "The user wants a joke.<|END_THINKING|><|START_RESPONSE|>Why did...<|END_RESPONSE|>",
        {},
        "The user wants a joke.",
        "<|START_RESPONSE|>Why did...<|END_RESPONSE|>",
    ),
    (
        "cohere-command",
        "tool call mid-thought",
        '<|START_THINKING|>Search first.<|START_ACTION|>[{"tool_name": "search"}]',
        {},
        "Search first.",
        '<|START_ACTION|>[{"tool_name": "search"}]',
    ),
    (
        "cohere-command",
        "reasoning off",
        "<|START_RESPONSE|>Hi<|END_RESPONSE|>",
        {"enabled": False},
        "",
        "<|START_RESPONSE|>Hi<|END_RESPONSE|>",
    ),
    ("cohere-command", "truncated", "The user wants", {}, "The user wants", ""),
    # ---- smollm2-think: plain-text tags; the generation prompt ends with "<think>\n"
    (
        "smollm2-think",
        "forced",
        "The capital of France is Paris.\n</think>\nParis.",
        {},
        "The capital of France is Paris.",
        "Paris.",
    ),
    (
        "smollm2-think",
        "echoed start tag",
        "<think>\nParis is the capital.\n</think>\n\nParis",
        {},
        "Paris is the capital.",
        "Paris",
    ),
    ("smollm2-think", "never closes", "I think the answer is Paris", {}, "I think the answer is Paris", ""),
    ("smollm2-think", "thinking off", "Paris.", {"enabled": False}, "", "Paris."),
    # ---- gpt-oss harmony
    (
        "gpt-oss",
        "analysis then final",
        "<|channel|>analysis<|message|>User asks 2+2.<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>",
        {},
        "User asks 2+2.",
        "4",
    ),
    (
        "gpt-oss",
        "two analysis messages",
        "<|channel|>analysis<|message|>First.<|end|><|start|>assistant<|channel|>analysis<|message|>Second.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Done<|return|>",
        {},
        "First.\nSecond.",
        "Done",
    ),
    (
        "gpt-oss",
        "tool call in commentary",
        "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather"
        ' <|constrain|>json<|message|>{"city":"Paris"}<|call|>',
        {},
        "Need weather.",
        '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>',
    ),
    ("gpt-oss", "truncated analysis", "<|channel|>analysis<|message|>Let me", {}, "Let me", ""),
    (
        "gpt-oss",
        "empty analysis",
        "<|channel|>analysis<|message|><|end|><|start|>assistant<|channel|>final<|message|>Hi",
        {},
        "",
        "Hi",
    ),
    ("gpt-oss", "no harmony framing", "Plain answer.", {}, "", "Plain answer."),
    ("gpt-oss", "no framing, forced", "Plain thought.", {"force_reasoning": True}, "Plain thought.", ""),
    (
        "gpt-oss",
        "header cut off",
        "<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>fin",
        {},
        "Hm.",
        "",
    ),
]


def _ids() -> list[str]:
    return [f"{family}: {shape}" for family, shape, *_ in SHAPES]


@pytest.mark.parametrize("family, shape, text, options, reasoning, content", SHAPES, ids=_ids())
def test_parse(family: str, shape: str, text: str, options: dict, reasoning: str, content: str) -> None:
    assert ReasoningParser(family, **options).parse(text) == ParseResult(reasoning, content)


@pytest.mark.parametrize("stream_reasoning", [True, False], ids=["stream", "hold"])
@pytest.mark.parametrize("family, shape, text, options, reasoning, content", SHAPES, ids=_ids())
def test_stream(
    family: str, shape: str, text: str, options: dict, reasoning: str, content: str, stream_reasoning: bool
) -> None:
    rng = random.Random(f"{family}{shape}")
    for chunking in range(4):
        if chunking == 0:
            chunks = list(text)
        else:
            chunks, i = [], 0
            while i < len(text):
                n = rng.randint(1, 8)
                chunks.append(text[i : i + n])
                i += n
        parser = ReasoningParser(family, stream_reasoning=stream_reasoning, **options)
        assert run_stream(parser, chunks)[1] == ParseResult(reasoning, content), chunks


@pytest.mark.parametrize("family, shape, text, options, reasoning, content", SHAPES, ids=_ids())
def test_every_split_into_two_or_three_chunks(
    family: str, shape: str, text: str, options: dict, reasoning: str, content: str
) -> None:
    """Exhaustive over cut positions: every single cut, and every pair of cuts close
    enough together to split one tag into three pieces."""
    expected = ParseResult(reasoning, content)
    n = len(text)
    for stream_reasoning in (True, False):
        for i in range(n + 1):
            for j in range(i, min(n, i + 14) + 1):
                chunks = [text[:i], text[i:j], text[j:]]
                parser = ReasoningParser(family, stream_reasoning=stream_reasoning, **options)
                assert run_stream(parser, chunks)[1] == expected, chunks


def test_every_family_has_shapes() -> None:
    assert {family for family, *_ in SHAPES} == set(reasoning_families())


# ---- partial tags ---------------------------------------------------------------------


def test_partial_tag_is_held_only_while_it_could_still_be_a_tag() -> None:
    parser = ReasoningParser("qwen3")
    assert parser.feed("<think>a <b") == ParseResult(
        "a <b", ""
    )  # "<b" begins neither </think> nor <tool_call>
    assert parser.feed("> c </thi") == ParseResult("> c", "")  # " </thi" may precede or begin </think>: held
    assert parser.feed("s is not it") == ParseResult(" </this is not it", "")
    assert parser.feed("</think>") == EMPTY
    assert parser.feed("\n\nOK") == ParseResult("", "OK")


def test_partial_start_tag_that_fails_becomes_content() -> None:
    parser = ReasoningParser("qwen3")
    assert parser.feed("<thi") == EMPTY
    assert parser.feed("ng>") == ParseResult("", "<thing>")


def test_hold_mode_returns_the_thought_at_the_end_tag() -> None:
    parser = ReasoningParser("deepseek-r1", stream_reasoning=False)
    assert parser.feed("Step one. ") == EMPTY
    assert parser.feed("Step two.\n</th") == EMPTY
    assert parser.feed("ink>\n\nAnswer") == ParseResult("Step one. Step two.", "Answer")
    assert parser.finish() == EMPTY


def test_hold_mode_returns_a_truncated_thought_at_finish() -> None:
    parser = ReasoningParser("qwen3", stream_reasoning=False)
    assert parser.feed("<think>never ") == EMPTY
    assert parser.feed("ends ") == EMPTY
    assert parser.finish() == ParseResult("never ends", "")


def test_tool_call_start_ends_the_thought_in_the_stream() -> None:
    parser = ReasoningParser("qwen3", stream_reasoning=False)
    assert parser.feed("<think>I will call it.\n<tool_") == EMPTY
    assert parser.feed('call>{"a"') == ParseResult("I will call it.", '<tool_call>{"a"')
    assert parser.feed(": 1}</tool_call>") == ParseResult("", ": 1}</tool_call>")


EMPTY = ParseResult("", "")


# ---- continue_final_message -----------------------------------------------------------


@pytest.mark.parametrize(
    "family, previous, continuation, expected",
    [
        # an unclosed start tag: the continuation is still thought
        ("qwen3", "<think>\nLet me", " see.</think>\n\nDone.", (" see.", "Done.")),
        # not forced and no tag: the continuation is content, kept as written
        ("qwen3", "Sure", ", here it is.", ("", ", here it is.")),
        # forced and no end tag: inside the thought
        ("deepseek-r1", "Thinking so far", " and more.</think>Answer", (" and more.", "Answer")),
        ("smollm2-think", "", "Fresh thought.</think>Answer", ("Fresh thought.", "Answer")),
        # the thought was closed already: content
        ("deepseek-r1", "Hm.</think>The answer", " is 4.", ("", " is 4.")),
        ("qwen3", "<think>x</think>\n", "\nAnswer", ("", "Answer")),
        # harmony: continuing inside an analysis message
        (
            "gpt-oss",
            "<|channel|>analysis<|message|>Part one",
            ", part two.<|end|><|start|>assistant<|channel|>final<|message|>Ok",
            (", part two.", "Ok"),
        ),
    ],
)
def test_continue_final_message(
    family: str, previous: str, continuation: str, expected: tuple[str, str]
) -> None:
    options = {"continue_final_message": True, "previous_content": previous}
    assert ReasoningParser(family, **options).parse(continuation) == ParseResult(*expected)
    assert run_stream(ReasoningParser(family, **options), list(continuation))[1] == ParseResult(*expected)


def test_previous_content_is_ignored_without_continue_final_message() -> None:
    parser = ReasoningParser("qwen3", previous_content="<think>open")
    assert parser.parse("Plain.") == ParseResult("", "Plain.")


def test_in_reasoning_follows_the_stream() -> None:
    parser = ReasoningParser("qwen3")
    assert not parser.in_reasoning
    parser.feed("<think>a")
    assert parser.in_reasoning
    parser.feed("</think>b")
    assert not parser.in_reasoning
    assert ReasoningParser("deepseek-r1").in_reasoning
    assert ReasoningParser("deepseek-r1", enabled=False).in_reasoning is False


# ---- lifecycle and errors -------------------------------------------------------------


def test_parse_does_not_disturb_the_stream() -> None:
    parser = ReasoningParser("qwen3")
    parser.feed("<think>half")
    assert parser.parse("no thought") == ParseResult("", "no thought")
    assert parser.feed(" done</think>x") == ParseResult(" done", "x")


def test_feed_after_finish_is_an_error_until_reset() -> None:
    for family in ("qwen3", "gpt-oss"):
        parser = ReasoningParser(family)
        parser.feed("text")
        parser.finish()
        with pytest.raises(RuntimeError, match="reset"):
            parser.feed("more")
        parser.reset()
        assert run_stream(parser, ["abc"])[1] == parser.parse("abc")


def test_both_formats_word_the_stream_misuse_errors_alike() -> None:
    for family in ("qwen3", "gpt-oss"):
        parser = ReasoningParser(family)
        parser.feed("<")  # held back: the general path, not a fast one
        parser.finish()
        with pytest.raises(
            RuntimeError, match=r"^feed\(\) after finish\(\); call reset\(\) to parse another output$"
        ):
            parser.feed("<")
        with pytest.raises(
            RuntimeError, match=r"^finish\(\) called twice; call reset\(\) to parse another output$"
        ):
            parser.finish()


def test_unknown_family_lists_the_known_ones() -> None:
    with pytest.raises(UnknownName) as err:
        ReasoningParser("qwen4")
    message = str(err.value)
    assert "qwen4" in message
    for known in ("deepseek-r1", "qwen3", "gpt-oss", "smollm2-think"):
        assert known in message


def test_options_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        ReasoningParser("qwen3", True)  # type: ignore[misc]


def test_previous_content_must_be_text() -> None:
    with pytest.raises(TypeError, match="previous_content"):
        ReasoningParser("qwen3", continue_final_message=True, previous_content=42)  # type: ignore[arg-type]


def test_force_reasoning_overrides_the_family() -> None:
    assert ReasoningParser("qwen3", force_reasoning=True).parse("a</think>b") == ParseResult("a", "b")
    # not forced, the text is content; its unmatched end tag is a control tag and is dropped
    assert ReasoningParser("deepseek-r1", force_reasoning=False).parse("a</think>b") == ParseResult("", "ab")


@pytest.mark.parametrize(
    "first_import",
    [
        "thinkstruct.parsers.reasoning_parser",
        "thinkstruct.parsers.tag_parser",
        "thinkstruct.parsers.reasoning_families",
    ],
)
def test_every_format_is_there_whichever_module_is_imported_first(first_import: str) -> None:
    # A fresh interpreter: what one module's import brings in is all there is.
    code = (
        f"import importlib; importlib.import_module({first_import!r})\n"
        "from thinkstruct.parsers.reasoning_parser import ReasoningParser\n"
        "print(type(ReasoningParser('qwen3')).__name__, type(ReasoningParser('gpt-oss')).__name__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.split() == ["TagReasoningParser", "HarmonyReasoningParser"]
