"""Tool-call detectors: real output shapes per syntax, whole and streamed, and the
stream == parse property on random calls and on random text."""

from __future__ import annotations

import functools
import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tool_call_writers import TEXT_VALUED, WRITERS

from thinkstruct.parsers import ReasoningParser, UnknownName, reasoning_families
from thinkstruct.parsers.tool_calls import (
    ToolCall,
    ToolCallParser,
    ToolParseResult,
    join_results,
    tool_call_syntaxes,
)

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


def stream(parser: ToolCallParser, chunks: list[str]) -> ToolParseResult:
    results = [parser.feed(c) for c in chunks]
    results.append(parser.finish())
    return join_results(results)


def calls(*pairs: tuple[str, dict]) -> tuple[ToolCall, ...]:
    return tuple(ToolCall(i, n, json.dumps(a, ensure_ascii=False)) for i, (n, a) in enumerate(pairs))


# (syntax, shape, output, expected content, expected (name, arguments) pairs)
SHAPES: list[tuple[str, str, str, str, tuple]] = [
    (
        "hermes",
        "qwen3 call after text",
        'Let me check.\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "Let me check.",
        (("get_weather", {"city": "Paris"}),),
    ),
    (
        "hermes",
        "two calls",
        '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "b", '
        '"arguments": {"x": [1, 2]}}\n</tool_call>',
        "",
        (("a", {}), ("b", {"x": [1, 2]})),
    ),
    (
        "hermes",
        "smollm2 list",
        '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "f", '
        '"arguments": {}}]</tool_call>',
        "",
        (("get_weather", {"city": "Paris"}), ("f", {})),
    ),
    (
        "hermes",
        "stringified arguments",
        '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>',
        "",
        (("f", {"a": 1}),),
    ),
    (
        "hermes",
        "arguments before name",
        '<tool_call>{"arguments": {"a": 1}, "name": "f"}</tool_call>',
        "",
        (("f", {"a": 1}),),
    ),
    (
        "hermes",
        "qwen3.5 xml",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
        "",
        (("get_weather", {"city": "New York", "days": 3}),),
    ),
    (
        "hermes",
        "multi-line string value",
        "<tool_call>\n<function=write>\n<parameter=text>\nline 1\nline 2\n</parameter>\n"
        "</function>\n</tool_call>",
        "",
        (("write", {"text": "line 1\nline 2"}),),
    ),
    ("hermes", "not a call", "Use <tool_call> tags.", "Use <tool_call> tags.", ()),
    ("hermes", "truncated call", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par', "", None),
    (
        "hermes",
        "text after the call",
        '<tool_call>{"name": "f", "arguments": {}}</tool_call>\n\nDone.',
        "Done.",
        (("f", {}),),
    ),
    (
        "llama3-json",
        "one call",
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        "",
        (("get_weather", {"city": "Paris"}),),
    ),
    (
        "llama3-json",
        "two calls",
        '{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"n": 1}}',
        "",
        (("a", {}), ("b", {"n": 1})),
    ),
    ("llama3-json", "python tag", '<|python_tag|>{"name": "a", "parameters": {}}', "", (("a", {}),)),
    (
        "llama3-json",
        "a JSON answer is content",
        '{"name": "Alice", "age": 3}',
        '{"name": "Alice", "age": 3}',
        (),
    ),
    (
        "llama3-json",
        "text first",
        'Sure: {"name": "a", "parameters": {}}',
        'Sure: {"name": "a", "parameters": {}}',
        (),
    ),
    (
        "mistral",
        "v11 form",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
        "",
        (("get_weather", {"city": "Paris"}),),
    ),
    (
        "mistral",
        "v11 two calls with ids",
        '[TOOL_CALLS]a[CALL_ID]abc123xyz[ARGS]{}[TOOL_CALLS]b[ARGS]{"x": 1}',
        "",
        (("a", {}), ("b", {"x": 1})),
    ),
    ("mistral", "v3 list", '[TOOL_CALLS] [{"name": "a", "arguments": {"x": 1}}]', "", (("a", {"x": 1}),)),
    (
        "deepseek-v3",
        "r1 / v3 fenced",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
        '{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        "",
        (("get_weather", {"city": "Paris"}),),
    ),
    (
        "deepseek-v3",
        "v3.1",
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}'
        "<｜tool▁call▁end｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "",
        (("get_weather", {"city": "Paris"}), ("f", {})),
    ),
    (
        "deepseek-v3",
        "v3.1 tool named function",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>{}"
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "",
        (("function", {}),),
    ),
    (
        "dsml",
        "v4",
        '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">'
        'Beijing</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
        "</｜DSML｜tool_calls>",
        "",
        (("get_weather", {"city": "Beijing", "days": 3}),),
    ),
    (
        "dsml",
        "v3.2 function_calls",
        '<｜DSML｜function_calls>\n<｜DSML｜invoke name="a">\n</｜DSML｜invoke>\n'
        '<｜DSML｜invoke name="b">\n<｜DSML｜parameter name="q" string="false">{"k": [1]}</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n</｜DSML｜function_calls>",
        "",
        (("a", {}), ("b", {"q": {"k": [1]}})),
    ),
    (
        "kimi-k2",
        "two calls",
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
        '{"city": "Paris"}<|tool_call_end|><|tool_call_begin|>functions.f:1<|tool_call_argument_begin|>{}<|tool_call_end|>'
        "<|tool_calls_section_end|>",
        "",
        (("get_weather", {"city": "Paris"}), ("f", {})),
    ),
    (
        "glm45",
        "glm-4.5",
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days"
        "</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
        "",
        (("get_weather", {"city": "Paris", "days": 3}),),
    ),
    (
        "glm45",
        "glm-4.7",
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>",
        "",
        (("get_weather", {"city": "Paris"}),),
    ),
    ("glm45", "no arguments", "<tool_call>now</tool_call>", "", (("now", {}),)),
    (
        "harmony",
        "first message",
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>',
        "",
        (("get_weather", {"city": "Paris"}),),
    ),
    (
        "harmony",
        "preamble then call",
        "<|start|>assistant<|channel|>commentary<|message|>Checking the weather.<|end|>"
        '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>',
        "Checking the weather.",
        (("get_weather", {"city": "Paris"}),),
    ),
    (
        "pythonic",
        "two calls",
        '[get_weather(city="Paris", days=3), now()]',
        "",
        (("get_weather", {"city": "Paris", "days": 3}), ("now", {})),
    ),
    (
        "pythonic",
        "literals",
        "[f(a=[1, 2], b={'k': None}, c=True)]",
        "",
        (("f", {"a": [1, 2], "b": {"k": None}, "c": True}),),
    ),
    ("pythonic", "llama4 tags", '<|python_start|>[f(x="y")]<|python_end|>', "", (("f", {"x": "y"}),)),
    ("pythonic", "a list answer is content", "[1, 2, 3]", "[1, 2, 3]", ()),
    (
        "minimax-m2",
        "call",
        '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
        '<parameter name="days">3</parameter>\n</invoke>\n</minimax:tool_call>',
        "",
        (("get_weather", {"city": "Paris", "days": 3}),),
    ),
    (
        "gemma4",
        "call",
        '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>',
        "",
        (("get_weather", {"city": "Paris", "days": 3}),),
    ),
    (
        "hunyuan",
        "list",
        '<tool_calls>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_calls>',
        "",
        (("get_weather", {"city": "Paris"}),),
    ),
    (
        "granite",
        "list",
        '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
        "",
        (("get_weather", {"city": "Paris"}),),
    ),
    (
        "cohere",
        "action",
        '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"city": "Paris"}}]'
        "<|END_ACTION|>",
        "",
        (("get_weather", {"city": "Paris"}),),
    ),
]


def _ids() -> list[str]:
    return [f"{s}: {shape}" for s, shape, *_ in SHAPES]


@pytest.mark.parametrize("syntax, shape, text, content, expected", SHAPES, ids=_ids())
def test_real_shapes(syntax: str, shape: str, text: str, content: str, expected: tuple | None) -> None:
    parser = ToolCallParser(syntax, tools=WEATHER)
    whole = parser.parse(text)
    assert whole.content == content
    if expected is None:  # cut off: the call keeps what was written
        assert [c.name for c in whole.calls] == ["get_weather"]
        assert whole.calls[0].arguments == '{"city": "Par'
    else:
        assert [(c.name, json.loads(c.arguments)) for c in whole.calls] == list(expected)
    assert [c.index for c in whole.calls] == list(range(len(whole.calls)))
    # streamed one character at a time, and cut at random, it is the same
    assert stream(ToolCallParser(syntax, tools=WEATHER), list(text)) == whole
    rng = random.Random(len(text))
    for _ in range(5):
        cuts = sorted(rng.sample(range(1, len(text)), min(3, len(text) - 1)))
        chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        assert stream(ToolCallParser(syntax, tools=WEATHER), chunks) == whole


def test_a_call_streams_its_name_first_then_argument_pieces() -> None:
    parser = ToolCallParser("hermes")
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}</tool_call>'
    deltas = [d for c in text for d in parser.feed(c).calls] + list(parser.finish().calls)
    assert deltas[0].name == "get_weather" and all(d.name is None for d in deltas[1:])
    assert len(deltas) > 10  # the arguments arrive in pieces, not at the end
    assert "".join(d.arguments for d in deltas) == '{"city": "Paris", "unit": "celsius"}'


def test_string_values_of_xml_syntaxes_stream_as_they_are_written() -> None:
    parser = ToolCallParser("hermes", tools=WEATHER)
    text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n</function>\n</tool_call>"
    seen = []
    for c in text:
        for d in parser.feed(c).calls:
            seen.append(d.arguments)
    assert '{"city": "San Fr' in ["".join(seen[:k]) for k in range(len(seen) + 1)]  # before the value ended
    assert "".join(seen) + "".join(d.arguments for d in parser.finish().calls) == '{"city": "San Francisco"}'


def test_value_types_come_from_the_schema() -> None:
    text = "<tool_call>f<arg_key>code</arg_key><arg_value>007</arg_value><arg_key>n</arg_key><arg_value>7</arg_value></tool_call>"
    tools = [
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {
                    "type": "object",
                    "properties": {"code": {"type": "string"}, "n": {"type": "integer"}},
                },
            },
        }
    ]
    assert json.loads(ToolCallParser("glm45", tools=tools).parse(text).calls[0].arguments) == {
        "code": "007",
        "n": 7,
    }
    # without a schema a value is JSON when it parses, text otherwise
    assert json.loads(ToolCallParser("glm45").parse(text).calls[0].arguments) == {"code": "007", "n": 7}
    untyped = "<tool_call>f<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"
    assert json.loads(ToolCallParser("glm45").parse(untyped).calls[0].arguments) == {"city": "Paris"}


def test_a_family_names_its_syntax() -> None:
    assert ToolCallParser("deepseek-v4").syntax.name == "dsml"
    assert ToolCallParser("qwen3").syntax.name == "hermes"
    with pytest.raises(ValueError, match="kimi"):
        ToolCallParser("kimi")
    with pytest.raises(UnknownName, match="tool-call syntax"):
        ToolCallParser("no-such-syntax")


def test_feed_after_finish_is_refused() -> None:
    parser = ToolCallParser("hermes")
    parser.finish()
    with pytest.raises(RuntimeError, match="reset"):
        parser.feed("x")
    parser.reset()
    assert parser.parse('<tool_call>{"name": "f"}</tool_call>').calls == (ToolCall(0, "f", "{}"),)


# ---- a tool call inside a thought ends it ------------------------------------------------


@pytest.mark.parametrize(
    "family, output",
    [
        (
            "qwen3",
            '<think>\nI need the weather.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            "</tool_call></think>",
        ),
        (
            "deepseek-v4",
            'I need the weather.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n'
            '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>',
        ),
        (
            "kimi-k2",
            "<think>I need the weather.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
            '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>',
        ),
        (
            "glm47",
            "I need the weather.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>",
        ),
        ("mistral", '[THINK]I need the weather.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'),
        (
            "gpt-oss",
            "<|channel|>analysis<|message|>I need the weather.<|end|><|start|>assistant<|channel|>commentary "
            'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>',
        ),
    ],
)
def test_a_call_made_while_thinking_reaches_the_tool_parser(family: str, output: str) -> None:
    reasoning = ReasoningParser(family, force_reasoning=reasoning_families()[family].forced)
    split = reasoning.parse(output)
    assert split.reasoning == "I need the weather."
    found = ToolCallParser(family, tools=WEATHER).parse(split.content)
    assert found.content == ""
    assert [(c.name, json.loads(c.arguments)) for c in found.calls] == [("get_weather", {"city": "Paris"})]
    # streamed through both parsers, token-sized pieces, the same
    reasoning.reset()
    tools = ToolCallParser(family, tools=WEATHER)
    pieces = []
    for i in range(0, len(output), 3):
        pieces.append(tools.feed(reasoning.feed(output[i : i + 3]).content))
    pieces.append(tools.feed(reasoning.finish().content))
    pieces.append(tools.finish())
    assert join_results(pieces) == found


# ---- stream == parse, on random calls ------------------------------------------------------

_TEXT = st.text(alphabet="abcXYZ 019-_.,:;!?'\"\\/é{}[]()<>\n", min_size=0, max_size=12).map(str.strip)
_KEY = st.from_regex(r"[a-z][a-z_0-9]{0,6}", fullmatch=True)
_NAME = st.from_regex(r"[a-z][a-z_0-9]{0,8}", fullmatch=True)
_SCALARS = {
    "string": _TEXT,
    "integer": st.integers(-1000, 10**6),
    "boolean": st.booleans(),
    "array": st.lists(st.integers(0, 9), max_size=3),
    "object": st.dictionaries(_KEY, st.integers(0, 9), max_size=2),
}


@st.composite
def tool_calls(draw: st.DrawFn, text_valued: bool) -> tuple[list[tuple[str, dict]], list[dict]]:
    """Calls and the tools whose schemas they follow (one type per parameter)."""
    schemas: dict[str, dict[str, str]] = {}
    for name in draw(st.lists(_NAME, min_size=1, max_size=3, unique=True)):
        keys = draw(st.lists(_KEY, max_size=3, unique=True))
        schemas[name] = {k: draw(st.sampled_from(sorted(_SCALARS))) for k in keys}
    out = []
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(sorted(schemas)))
        args = {}
        for key, kind in schemas[name].items():
            value = draw(_SCALARS[kind])
            if text_valued and kind == "string" and not value:
                value = "x"  # an empty text value is written the same as a missing one
            args[key] = value
        out.append((name, args))
    tools = [
        {
            "type": "function",
            "function": {
                "name": n,
                "parameters": {"type": "object", "properties": {k: {"type": t} for k, t in p.items()}},
            },
        }
        for n, p in schemas.items()
    ]
    return out, tools


def _chunks(draw: st.DrawFn, text: str) -> list[str]:
    cuts = sorted(set(draw(st.lists(st.integers(0, len(text)), max_size=12))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("label, syntax, writer, leading", WRITERS, ids=[w[0] for w in WRITERS])
def test_random_calls_round_trip_and_stream_like_parse(
    label: str, syntax: str, writer, leading: bool
) -> None:
    text_valued = label in TEXT_VALUED or label in ("gemma4",)

    @PROPERTY
    @given(st.data())
    def check(data) -> None:
        written, tools = data.draw(tool_calls(text_valued))
        before = "" if leading else data.draw(st.sampled_from(["", "Let me check.", "I'll call it.\n\n"]))
        after = data.draw(st.sampled_from(["", "\n", "\n\nDone."]))
        text = before + writer(written) + after
        whole = ToolCallParser(syntax, tools=tools).parse(text)
        assert [(c.name, json.loads(c.arguments)) for c in whole.calls] == written, text
        # whitespace right before and right after the calls is dropped, the rest is content
        assert whole.content == before.rstrip() + ("Done." if "Done." in after else "")
        chunks = _chunks(data.draw, text)
        assert stream(ToolCallParser(syntax, tools=tools), chunks) == whole, chunks

    check()


# ---- stream == parse, on random text made of the syntax's pieces -----------------------------


@functools.cache
def _fragments(syntax: str) -> list[str]:
    from tool_call_writers import WRITERS as W

    samples = [w([("f", {"a": "x y", "n": 1})]) for label, s, w, _ in W if s == syntax]
    pieces: set[str] = set()
    for sample in samples:
        # cut the sample at its markup: tags and punctuation become pieces
        token = ""
        for ch in sample:
            token += ch
            if ch in '>]}|\n"' or len(token) > 12:
                pieces.add(token)
                token = ""
        if token:
            pieces.add(token)
    starts = tool_call_syntaxes()[syntax].starts + tool_call_syntaxes()[syntax].leading_starts
    for marker in starts:
        pieces.add(marker)
        pieces.update(marker[:k] for k in range(1, len(marker)))
    return sorted(pieces)


@pytest.mark.parametrize("syntax", sorted(tool_call_syntaxes()))
def test_any_chunking_of_any_text_gives_the_whole_text_result(syntax: str) -> None:
    frags = _fragments(syntax)
    piece = st.one_of(
        st.sampled_from(frags), st.sampled_from(frags), st.sampled_from([" ", "\n", "x", "{", "}", '"', ","])
    )

    @PROPERTY
    @given(st.lists(piece, max_size=16), st.data())
    def check(parts: list[str], data) -> None:
        text = "".join(parts)
        whole = ToolCallParser(syntax).parse(text)
        assert stream(ToolCallParser(syntax), _chunks(data.draw, text)) == whole
        assert stream(ToolCallParser(syntax), list(text)) == whole

    check()
