"""The family registry and the one reasoning decision."""

from __future__ import annotations

import pytest

from thinkstruct.parsers import (
    DuplicateName,
    InvalidChatRequest,
    InvalidTemplateSpec,
    ParseResult,
    ReasoningFamily,
    ReasoningFormat,
    ReasoningParser,
    ThinkingSwitch,
    UnknownName,
    get_reasoning_family,
    reasoning_enabled,
    reasoning_families,
    register_reasoning_family,
    render_chat,
    unregister_reasoning_family,
)

REQUIRED = {
    "deepseek-r1",
    "deepseek-v3",
    "deepseek-v4",
    "qwen3",
    "qwen3-thinking",
    "qwen3.5",
    "kimi",
    "kimi-k2",
    "glm45",
    "glm47",
    "hunyuan",
    "gemma4",
    "nemotron3",
    "minimax-m2",
    "granite",
    "mistral",
    "gpt-oss",
    "cohere-command",
    "smollm2-think",
}


def test_the_required_families_are_registered() -> None:
    assert set(reasoning_families()) >= REQUIRED


# (family, start, end, forced, switch kwarg or None, switch default, tool-call start, tool-call syntax)
ENTRIES = [
    ("deepseek-r1", "<think>", "</think>", True, None, None, "<｜tool▁calls▁begin｜>", "deepseek-v3"),
    (
        "deepseek-v3",
        "<think>",
        "</think>",
        True,
        "thinking",
        False,
        "<｜tool▁calls▁begin｜>",
        "deepseek-v3.1",
    ),
    # V4's DSML block is <｜DSML｜tool_calls> (V3.2 wrote function_calls)
    ("deepseek-v4", "<think>", "</think>", True, "thinking", False, "<｜DSML｜tool_calls>", "dsml"),
    ("qwen3", "<think>", "</think>", False, "enable_thinking", True, "<tool_call>", "hermes"),
    ("qwen3-thinking", "<think>", "</think>", True, None, None, "<tool_call>", "hermes"),
    ("qwen3.5", "<think>", "</think>", True, "enable_thinking", True, "<tool_call>", "qwen3-coder"),
    ("kimi", "◁think▷", "◁/think▷", False, None, None, None, None),
    ("kimi-k2", "<think>", "</think>", False, "thinking", True, "<|tool_calls_section_begin|>", "kimi-k2"),
    ("glm45", "<think>", "</think>", False, "enable_thinking", True, "<tool_call>", "glm45"),
    ("glm47", "<think>", "</think>", True, "enable_thinking", True, "<tool_call>", "glm47"),
    ("hunyuan", "<think>", "</think>", False, "enable_thinking", True, "<tool_calls>", "hunyuan"),
    ("gemma4", "<|channel>thought", "<channel|>", False, "enable_thinking", False, "<|tool_call>", "gemma4"),
    ("nemotron3", "<think>", "</think>", True, "enable_thinking", True, "<tool_call>", "qwen3-coder"),
    ("minimax-m2", "<think>", "</think>", True, None, None, "<minimax:tool_call>", "minimax-m2"),
    ("granite", "<think>", "</think>", False, "thinking", False, "<|tool_call|>", "granite"),
    ("mistral", "[THINK]", "[/THINK]", False, "reasoning_effort", True, "[TOOL_CALLS]", "mistral"),
    (
        "gpt-oss",
        "<|channel|>analysis<|message|>",
        "<|end|>",
        False,
        None,
        None,
        "<|channel|>commentary",
        "harmony",
    ),
    (
        "cohere-command",
        "<|START_THINKING|>",
        "<|END_THINKING|>",
        True,
        "reasoning",
        True,
        "<|START_ACTION|>",
        "cohere",
    ),
    ("smollm2-think", "<think>", "</think>", True, "enable_thinking", True, "<tool_call>", "hermes-list"),
]


@pytest.mark.parametrize(
    "name, start, end, forced, kwarg, default, tool, syntax", ENTRIES, ids=[e[0] for e in ENTRIES]
)
def test_entry(
    name: str,
    start: str,
    end: str,
    forced: bool,
    kwarg: str | None,
    default: bool | None,
    tool: str | None,
    syntax: str | None,
) -> None:
    family = get_reasoning_family(name)
    assert (family.think_start, family.think_end, family.forced, family.tool_call_start) == (
        start,
        end,
        forced,
        tool,
    )
    assert family.tool_call_syntax == syntax
    if kwarg is None:
        assert family.switch is None and family.always_thinks
    else:
        assert family.switch is not None
        assert (family.switch.kwarg, family.switch.default) == (kwarg, default)
    assert family.format is (ReasoningFormat.HARMONY if name == "gpt-oss" else ReasoningFormat.TAGS)
    assert family.description
    # a thought must not open another one
    if family.format is ReasoningFormat.TAGS and name not in ("smollm2-think", "gemma4"):
        assert family.think_start in family.banned_while_thinking
    if name == "gemma4":  # its start is <|channel> plus the word "thought": the channel token is banned
        assert "<|channel>" in family.banned_while_thinking


@pytest.mark.parametrize("name", sorted(reasoning_families()))
def test_the_tool_call_start_opens_a_section_of_the_familys_syntax(name: str) -> None:
    """The reasoning parser ends a thought at tool_call_start; the tool-call parser must
    take a section from exactly there."""
    from thinkstruct.parsers.tool_calls import get_tool_call_syntax

    family = get_reasoning_family(name)
    if family.tool_call_syntax is None:
        assert family.tool_call_start is None
        return
    syntax = get_tool_call_syntax(family.tool_call_syntax)
    assert any(family.tool_call_start.startswith(start) for start in syntax.starts)


def test_deepseek_tags_are_single_tokens_of_the_default_tokenizer(tokenizer) -> None:
    for name in ("deepseek-r1", "deepseek-v3", "deepseek-v4"):
        family = get_reasoning_family(name)
        for text in (family.think_start, family.think_end, *family.banned_while_thinking):
            ids = tokenizer.hf.encode(text, add_special_tokens=False)
            assert len(ids) == 1, f"{name}: {text!r} -> {ids}"
    tool = tokenizer.hf.encode(get_reasoning_family("deepseek-v3").tool_call_start, add_special_tokens=False)
    assert len(tool) == 1
    # V4's DSML tags are spelled with the one ｜DSML｜ token, which is what a thought bans
    dsml = tokenizer.hf.encode(get_reasoning_family("deepseek-v4").tool_call_start, add_special_tokens=False)
    assert tokenizer.hf.convert_tokens_to_ids("｜DSML｜") in dsml


@pytest.mark.parametrize(
    "family, kwargs, expected",
    [
        ("deepseek-r1", None, True),
        (
            "deepseek-r1",
            {"thinking": False},
            True,
        ),  # R1 always thinks; other families' keys are not its switch
        ("deepseek-v3", None, False),
        ("deepseek-v3", {"thinking": True}, True),
        ("deepseek-v4", {"thinking": False}, False),
        ("deepseek-v4", {"enable_thinking": True}, False),  # not its switch
        ("qwen3", None, True),
        ("qwen3", {}, True),
        ("qwen3", {"enable_thinking": False}, False),
        ("qwen3", {"enable_thinking": None}, True),
        ("qwen3-thinking", {"enable_thinking": False}, True),
        ("glm45", {"enable_thinking": False}, False),
        ("mistral", None, True),
        ("mistral", {"reasoning_effort": "none"}, False),
        ("mistral", {"reasoning_effort": "HIGH"}, True),
        ("gpt-oss", {"reasoning_effort": "low"}, True),
        ("cohere-command", {"reasoning": False}, False),
        ("kimi", None, True),
        ("smollm2-think", {"enable_thinking": False}, False),
        ("smollm2-think", None, True),
    ],
)
def test_reasoning_enabled(family: str, kwargs: dict | None, expected: bool) -> None:
    assert reasoning_enabled(family, kwargs) is expected
    assert get_reasoning_family(family).enabled(kwargs) is expected


@pytest.mark.parametrize(
    "family, kwargs, key",
    [
        ("qwen3", {"enable_thinking": "yes"}, "enable_thinking"),
        ("deepseek-v3", {"thinking": 1}, "thinking"),
        ("mistral", {"reasoning_effort": "extreme"}, "reasoning_effort"),
        ("mistral", {"reasoning_effort": True}, "reasoning_effort"),
    ],
)
def test_a_bad_switch_value_names_the_key(family: str, kwargs: dict, key: str) -> None:
    with pytest.raises(InvalidChatRequest, match=key):
        reasoning_enabled(family, kwargs)


def test_unknown_family_lists_the_known_ones() -> None:
    with pytest.raises(UnknownName) as err:
        reasoning_enabled("llama-think")
    assert "llama-think" in str(err.value)
    assert all(name in str(err.value) for name in REQUIRED)
    assert isinstance(err.value, KeyError)


def test_a_new_family_is_only_an_entry() -> None:
    """Registering an entry is all it takes: parser, decision and chat rendering follow."""
    family = ReasoningFamily(
        name="test-bracket",
        think_start="[[think]]",
        think_end="[[/think]]",
        forced=False,
        switch=ThinkingSwitch("think", default=False),
        tool_call_start="[[call]]",
        chat_template="{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% if think %} [[think]]{% endif %}{% endif %}",
        description="a test family",
    )
    register_reasoning_family(family)
    try:
        assert reasoning_enabled("test-bracket") is False
        assert reasoning_enabled("test-bracket", {"think": True}) is True
        parser = ReasoningParser("test-bracket")
        assert parser.parse("[[think]] a [[/think]] b") == ParseResult("a", "b")
        assert parser.parse("[[think]] a [[call]]{}") == ParseResult("a", "[[call]]{}")
        prompt = render_chat(
            [{"role": "user", "content": "hi"}], family="test-bracket", chat_template_kwargs={"think": True}
        )
        assert prompt.text == "user: hi\nassistant: [[think]]"
        assert prompt.reasoning_enabled is True
        with pytest.raises(DuplicateName):
            register_reasoning_family(family)
    finally:
        unregister_reasoning_family("test-bracket")
    with pytest.raises(UnknownName):
        get_reasoning_family("test-bracket")


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"think_start": " <t>"}, "think_start"),
        ({"think_end": ""}, "think_end"),
        ({"tool_call_start": "<call>\n"}, "tool_call_start"),
        ({"name": ""}, "name"),
        ({"prefer_builtin_template": True}, "prefer_builtin_template"),
    ],
)
def test_malformed_entries_are_refused(changes: dict, message: str) -> None:
    fields = {"name": "bad", "think_start": "<t>", "think_end": "</t>", "forced": False, "switch": None}
    fields.update(changes)
    with pytest.raises(InvalidTemplateSpec, match=message):
        ReasoningFamily(**fields)
