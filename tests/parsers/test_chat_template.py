"""Chat templates: the models' own, the built-in ones, the thinking switch, the sandbox."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from thinkstruct.parsers import (
    ChatTemplate,
    ChatTemplateError,
    InvalidChatRequest,
    ParseResult,
    ReasoningFamily,
    ReasoningFormat,
    ReasoningParser,
    chat_template_for,
    reasoning_enabled,
    reasoning_families,
    register_reasoning_family,
    render_chat,
    unregister_reasoning_family,
)
from thinkstruct.parsers.builtin_chat_templates import SMOLLM2_THINK_INSTRUCTION

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2+2?"},
]
HISTORY = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "<think>\ngreeting\n</think>\n\nHello!"},
    {"role": "user", "content": "What is 2+2?"},
]


# ---- the models' own templates --------------------------------------------------------


def test_smollm2_own_template_renders_like_transformers(smollm2_tokenizer) -> None:
    template = ChatTemplate.from_tokenizer(smollm2_tokenizer)
    assert template is not None
    for messages in (CHAT, HISTORY):
        for add in (True, False):
            expected = smollm2_tokenizer.hf.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add
            )
            assert template.render(messages, add_generation_prompt=add) == expected


def test_template_from_gguf_metadata(smollm2_tokenizer) -> None:
    from thinkstruct.tokenizer import smollm2_gguf_path

    template = ChatTemplate.from_path(smollm2_gguf_path())
    assert template is not None
    assert template.source == smollm2_tokenizer.chat_template
    assert template.special_tokens["eos_token"] == "<|im_end|>"


def test_continue_final_message_with_the_models_own_template(smollm2_tokenizer) -> None:
    template = ChatTemplate.from_tokenizer(smollm2_tokenizer)
    messages = [*CHAT, {"role": "assistant", "content": "The answer is"}]
    prompt = template.render(messages, continue_final_message=True)
    assert prompt.endswith("<|im_start|>assistant\nThe answer is")
    empty = template.render([*CHAT, {"role": "assistant", "content": ""}], continue_final_message=True)
    assert empty.endswith("<|im_start|>assistant\n")


def test_template_from_a_model_directory(tmp_path: Path) -> None:
    config = {
        "bos_token": {"content": "<s>", "__type": "AddedToken"},
        "eos_token": "</s>",
        "chat_template": [
            {"name": "tool_use", "template": "TOOLS"},
            {
                "name": "default",
                "template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}",
            },
        ],
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    template = ChatTemplate.from_path(tmp_path)
    assert template.render(CHAT, add_generation_prompt=False) == "<s>[system]Be brief.[user]What is 2+2?"
    (tmp_path / "chat_template.jinja").write_text("J{{ eos_token }}", encoding="utf-8")
    assert (
        ChatTemplate.from_path(tmp_path).render(CHAT) == "J</s>"
    )  # the .jinja file wins, as in transformers


def test_a_model_without_template(tokenizer, tmp_path: Path) -> None:
    assert tokenizer.chat_template is None  # DeepSeek-V4's tokenizer ships none
    assert ChatTemplate.from_tokenizer(tokenizer) is None
    (tmp_path / "tokenizer_config.json").write_text("{}", encoding="utf-8")
    assert ChatTemplate.from_path(tmp_path) is None


# ---- built-in templates and the thinking switch ---------------------------------------


def test_deepseek_v4_uses_its_builtin_template(tokenizer) -> None:
    off = render_chat(CHAT, family="deepseek-v4", tokenizer=tokenizer)
    assert off.reasoning_enabled is False
    assert off.text == "<｜begin▁of▁sentence｜>Be brief.<｜User｜>What is 2+2?<｜Assistant｜></think>"
    on = render_chat(CHAT, family="deepseek-v4", tokenizer=tokenizer, chat_template_kwargs={"thinking": True})
    assert on.reasoning_enabled is True
    assert on.text.endswith("<｜Assistant｜><think>")
    ids = tokenizer.hf.encode(on.text, add_special_tokens=False)
    assert (
        ids[-1] == tokenizer.think_start_ids[0]
    )  # the prompt opens the thought with the single <think> token
    history = render_chat(HISTORY, family="deepseek-v4", tokenizer=tokenizer)
    assert "<｜Assistant｜></think>Hello!<｜end▁of▁sentence｜>" in history.text
    assert "greeting" not in history.text  # earlier thoughts are not sent back


def test_smollm2_think_writes_think_as_text(smollm2_tokenizer) -> None:
    on = render_chat(CHAT, family="smollm2-think", tokenizer=smollm2_tokenizer)
    assert on.reasoning_enabled is True
    assert on.text.endswith("<|im_start|>assistant\n<think>\n")
    assert SMOLLM2_THINK_INSTRUCTION in on.text
    assert on.text.startswith("<|im_start|>system\nBe brief.\n\n")
    # SmolLM2 has no <think> token: the tag is several ordinary tokens
    assert len(smollm2_tokenizer.hf.encode("<think>", add_special_tokens=False)) > 1
    off = render_chat(
        CHAT,
        family="smollm2-think",
        tokenizer=smollm2_tokenizer,
        chat_template_kwargs={"enable_thinking": False},
    )
    assert off.reasoning_enabled is False
    assert off.text.endswith("<|im_start|>assistant\n")
    assert "<think>" not in off.text
    # with thinking off it is SmolLM2's own conversation format, token for token
    own = smollm2_tokenizer.hf.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert off.text == own


FAMILIES = sorted(reasoning_families())


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("switch_on", [True, False], ids=["on", "off"])
def test_builtin_templates_agree_with_their_family(family: str, switch_on: bool) -> None:
    """Forced and on: the prompt opens the thought. Otherwise it leaves none open."""
    spec = reasoning_families()[family]
    kwargs = {}
    if spec.switch is not None:
        kwargs[spec.switch.kwarg] = (
            switch_on if spec.switch.style.value == "bool" else ("high" if switch_on else "none")
        )
    prompt = render_chat(HISTORY, family=family, chat_template_kwargs=kwargs)
    enabled = reasoning_enabled(family, kwargs)
    assert prompt.reasoning_enabled is enabled
    tail = prompt.text.rstrip()
    if spec.format is ReasoningFormat.HARMONY:
        assert tail.endswith("<|start|>assistant")
    elif enabled and spec.forced:
        assert tail.endswith(spec.think_start)
    else:
        assert not tail.endswith(spec.think_start)
    # the decision is read from the prompt, and it agrees with the family's entry
    assert prompt.starts_in_thought is (enabled and spec.forced)
    # and the parser built from the prompt reads a typical answer as the model would write it
    answer = "Four." if not (enabled and spec.forced) else f"Two plus two.{spec.think_end}Four."
    if spec.format is ReasoningFormat.HARMONY:
        answer = "<|channel|>analysis<|message|>Two plus two.<|end|><|start|>assistant<|channel|>final<|message|>Four."
    result = prompt.reasoning_parser().parse(answer)
    assert result.content == "Four."
    assert result.reasoning == ("Two plus two." if answer != "Four." else "")


#: Tag families that end a thought at a tool-call start.
CALLING_TAG_FAMILIES = [
    name
    for name, spec in sorted(reasoning_families().items())
    if spec.format is ReasoningFormat.TAGS and spec.tool_call_start is not None
]


@pytest.mark.parametrize("family", CALLING_TAG_FAMILIES)
def test_under_a_grammar_only_the_end_tag_ends_a_thought(family: str) -> None:
    """A call start written inside a thought ends it for free text, and stays in it where
    a grammar's reasoning wrapper reads the thought (``calls_end_thought=False``), in one
    piece and fed a character at a time."""
    spec = reasoning_families()[family]
    on = (
        {}
        if spec.switch is None
        else {spec.switch.kwarg: True if spec.switch.style.value == "bool" else "high"}
    )
    prompt = render_chat(CHAT, family=family, chat_template_kwargs=on)
    assert prompt.reasoning_enabled
    opening = "" if prompt.starts_in_thought else spec.think_start
    thought = f"Plan {spec.tool_call_start} then stop."
    output = f"{opening}{thought}{spec.think_end}Four."
    free = prompt.reasoning_parser().parse(output)
    assert free.content.startswith(spec.tool_call_start)
    held = prompt.reasoning_parser(calls_end_thought=False)
    assert held.parse(output) == ParseResult(thought, "Four.")
    streamed = prompt.reasoning_parser(calls_end_thought=False)
    pieces = [streamed.feed(c) for c in output] + [streamed.finish()]
    assert ParseResult("".join(p.reasoning for p in pieces), "".join(p.content for p in pieces)) == (
        thought,
        "Four.",
    )


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(
    "kwargs",
    [None, {"enable_thinking": False}, {"enable_thinking": True}, {"thinking": True}, {"reasoning": False}],
    ids=["none", "enable_thinking=F", "enable_thinking=T", "thinking=T", "reasoning=F"],
)
def test_one_decision_reaches_prompt_and_parser(family: str, kwargs: dict | None) -> None:
    prompt = render_chat(CHAT, family=family, chat_template_kwargs=kwargs)
    decided = reasoning_enabled(family, kwargs)
    assert prompt.reasoning_enabled is decided
    assert prompt.reasoning_parser().enabled is decided
    assert prompt.reasoning_parser(stream_reasoning=False).stream_reasoning is False


def test_the_switch_reaches_a_models_own_template_even_when_unset() -> None:
    """The decision is handed to the template explicitly, whatever the template's default."""
    source = "{{ enable_thinking }}|{{ other }}"
    assert (
        render_chat(CHAT, family="qwen3", chat_template=source, chat_template_kwargs={"other": 1}).text
        == "True|1"
    )
    off = render_chat(
        CHAT, family="qwen3", chat_template=source, chat_template_kwargs={"enable_thinking": False}
    )
    assert off.text.startswith("False|")
    assert (
        render_chat(
            CHAT,
            family="mistral",
            chat_template="{{ reasoning_effort }}",
            chat_template_kwargs={"reasoning_effort": "none"},
        ).text
        == "none"
    )


@pytest.mark.parametrize(
    "family, previous, continuation, expected_tail, expected",
    [
        (
            "qwen3-thinking",
            "Let me think",
            " more.</think>\n\n4",
            "<|im_start|>assistant\n<think>\nLet me think",
            (" more.", "4"),
        ),
        (
            "smollm2-think",
            "Paris is",
            " the capital.\n</think>\nParis.",
            "assistant\n<think>\nParis is",
            (" the capital.", "Paris."),
        ),
        ("qwen3", "<think>\nHm", ", 4.</think>4", "<|im_start|>assistant\n<think>\nHm", (", 4.", "4")),
        ("qwen3", "The answer", " is 4.", "<|im_start|>assistant\nThe answer", ("", " is 4.")),
        (
            "deepseek-r1",
            "<think>\nStep",
            " two.</think>Done",
            "<｜Assistant｜><think>\nStep",
            (" two.", "Done"),
        ),
    ],
)
def test_continue_final_message_prompt_and_parser_agree(
    family: str, previous: str, continuation: str, expected_tail: str, expected: tuple[str, str]
) -> None:
    messages = [*CHAT, {"role": "assistant", "content": previous}]
    prompt = render_chat(messages, family=family, continue_final_message=True)
    assert prompt.text.endswith(expected_tail)
    assert prompt.previous_content == previous
    assert prompt.reasoning_parser().parse(continuation) == ParseResult(*expected)


def test_add_generation_prompt_and_continue_conflict() -> None:
    with pytest.raises(InvalidChatRequest, match="continue_final_message"):
        render_chat(
            [*CHAT, {"role": "assistant", "content": "x"}],
            family="qwen3",
            add_generation_prompt=True,
            continue_final_message=True,
        )


def test_content_parts_are_rendered_as_text() -> None:
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Hello "},
                {"type": "image"},
                {"type": "text", "text": "there"},
            ],
        }
    ]
    assert "<|im_start|>user\nHello there<|im_end|>" in render_chat(messages, family="qwen3").text


# ---- sandbox, helpers and errors ------------------------------------------------------


def test_helpers_like_transformers() -> None:
    template = ChatTemplate("{{ tools | tojson }}|{{ strftime_now('%Y') }}")
    tools = [{"name": "météo", "parameters": {}}]
    text = template.render(CHAT, tools=tools)
    encoded, year = text.split("|")
    assert json.loads(encoded) == tools and "météo" in encoded  # not ASCII-escaped
    assert year == str(datetime.datetime.now().year)


def test_raise_exception_is_a_clear_error() -> None:
    template = ChatTemplate(
        "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}",
        name="strict",
    )
    with pytest.raises(ChatTemplateError, match="strict.*Conversation must start with user"):
        template.render(CHAT)


def test_syntax_error_names_the_line() -> None:
    with pytest.raises(ChatTemplateError) as err:
        ChatTemplate("line one\n{% for m in messages %}\n{{ m.content }\n", name="broken")
    assert err.value.line is not None and "broken" in str(err.value) and "line" in str(err.value)


def test_runtime_errors_in_a_template_do_not_crash() -> None:
    template = ChatTemplate("ok\n{{ messages[0].content + 1 }}", name="buggy")
    with pytest.raises(ChatTemplateError) as err:
        template.render(CHAT)
    assert err.value.line == 2
    assert "buggy" in str(err.value)


def test_the_sandbox_refuses_mutation_and_internals() -> None:
    with pytest.raises(ChatTemplateError, match="(?i)unsafe|security|not safely"):
        ChatTemplate("{{ messages.append({'role': 'x'}) }}").render(CHAT)
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ ''.__class__.__mro__[1].__subclasses__() }}").render(CHAT)


@pytest.mark.parametrize(
    "messages, message",
    [
        ([], "messages is empty"),
        ("hello", "must be a list"),
        ([{"content": "x"}], r"messages\[0\]\.role"),
        ([{"role": "user", "content": "a"}, {"role": "user", "content": 5}], r"messages\[1\]\.content"),
        (["x"], r"messages\[0\] must be an object"),
    ],
)
def test_malformed_messages_name_the_message(messages, message: str) -> None:
    with pytest.raises(InvalidChatRequest, match=message):
        render_chat(messages, family="qwen3")


def test_reserved_template_variables_cannot_be_overridden() -> None:
    with pytest.raises(InvalidChatRequest, match="add_generation_prompt"):
        render_chat(CHAT, family="qwen3", chat_template_kwargs={"add_generation_prompt": False})


def test_bad_switch_value_names_the_key() -> None:
    with pytest.raises(InvalidChatRequest, match="thinking"):
        render_chat(CHAT, family="deepseek-v4", chat_template_kwargs={"thinking": "on"})


def test_a_family_without_any_template_is_a_clear_error() -> None:
    register_reasoning_family(ReasoningFamily("test-bare", "<t>", "</t>", forced=False, switch=None))
    try:
        with pytest.raises(ChatTemplateError, match="test-bare.*no built-in chat template"):
            chat_template_for("test-bare")
        # a template given with the request is enough
        assert render_chat(CHAT, family="test-bare", chat_template="{{ messages | length }}").text == "2"
    finally:
        unregister_reasoning_family("test-bare")


def test_continuation_text_must_appear_in_the_rendered_prompt() -> None:
    template = ChatTemplate("{% for m in messages %}{{ m.content | upper }}{% endfor %}", name="shouty")
    with pytest.raises(ChatTemplateError, match="verbatim"):
        template.render([{"role": "assistant", "content": "quiet words"}], continue_final_message=True)


def test_parser_from_prompt_reads_the_stream_it_will_get(smollm2_tokenizer) -> None:
    prompt = render_chat(CHAT, family="smollm2-think", tokenizer=smollm2_tokenizer)
    parser = prompt.reasoning_parser()
    output = "Two and two make four.\n</think>\nFour."
    pieces = [parser.feed(output[i : i + 3]) for i in range(0, len(output), 3)] + [parser.finish()]
    assert "".join(p.reasoning for p in pieces) == "Two and two make four."
    assert "".join(p.content for p in pieces) == "Four."
    assert isinstance(parser, ReasoningParser)


def test_a_file_that_is_not_gguf_is_a_clear_error(tmp_path: Path) -> None:
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"GGML\x00\x00")
    with pytest.raises(ChatTemplateError, match="model.gguf.*not a GGUF file"):
        ChatTemplate.from_path(fake)
    truncated = tmp_path / "short.gguf"
    truncated.write_bytes(b"GGUF\x03\x00\x00\x00\x00")
    with pytest.raises(ChatTemplateError, match="ends early"):
        ChatTemplate.from_path(truncated)


# ---- the prompt decides where the output starts ---------------------------------------

QWEN35_STYLE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking %}<think>\n{% else %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


def test_a_template_that_opens_the_thought_is_noticed() -> None:
    """Family qwen3 writes its own <think>, but this template opens it in the prompt."""
    prompt = render_chat(CHAT, family="qwen3", chat_template=QWEN35_STYLE)
    assert prompt.starts_in_thought is True
    assert prompt.reasoning_parser().parse("Let me think.\n</think>\n\nHello!") == ParseResult(
        "Let me think.", "Hello!"
    )
    off = render_chat(
        CHAT, family="qwen3", chat_template=QWEN35_STYLE, chat_template_kwargs={"enable_thinking": False}
    )
    assert off.starts_in_thought is False and off.reasoning_enabled is False
    assert off.reasoning_parser().parse("Hello!") == ParseResult("", "Hello!")
    # and the other way: a forced family whose own template leaves the tag to the model
    plain = "{% for m in messages %}{{ m.content }}{% endfor %}<｜Assistant｜>"
    r1 = render_chat(CHAT, family="deepseek-r1", chat_template=plain)
    assert r1.starts_in_thought is False
    assert r1.reasoning_parser().parse("<think>\nHm.\n</think>\n\n4") == ParseResult("Hm.", "4")


def test_a_thought_can_be_opened_in_the_prompt_for_a_grammar() -> None:
    prompt = render_chat(CHAT, family="qwen3")
    assert prompt.starts_in_thought is False and prompt.reasoning_enabled is True
    opened = prompt.with_thought_open()
    assert opened.text == prompt.text + "<think>\n" and opened.starts_in_thought is True
    assert opened.reasoning_parser().parse("Hm.</think>4") == ParseResult("Hm.", "4")
    assert opened.with_thought_open() is opened
    off = render_chat(CHAT, family="qwen3", chat_template_kwargs={"enable_thinking": False})
    assert off.with_thought_open() is off  # a request that does not reason opens nothing
    harmony = render_chat(CHAT, family="gpt-oss")
    assert harmony.with_thought_open() is harmony


# ---- tools through the built-in templates ---------------------------------------------

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
]
QUESTION = "What is the weather in Paris?"
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 3}'},
}
TOOL_FAMILIES = sorted(name for name, f in reasoning_families().items() if f.tool_call_syntax)


@pytest.mark.parametrize("family", TOOL_FAMILIES)
def test_builtin_templates_write_calls_the_tool_parser_reads(family: str) -> None:
    """An earlier assistant call, rendered by the family's template, parses back to itself
    with the family's tool-call parser; tools are described and results sent back."""
    messages = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
    ]
    prompt = render_chat(messages, family=family, tools=TOOLS, add_generation_prompt=False)
    assert "get_weather" in prompt.text.split(QUESTION)[0]  # the tool is described before the question
    tail = prompt.text.split(QUESTION)[-1]
    found = prompt.tool_parser(TOOLS).parse(tail)
    assert [(c.name, json.loads(c.arguments)) for c in found.calls] == [
        ("get_weather", {"city": "Paris", "days": 3})
    ]
    result = {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "sunny, 24 C"}
    follow = render_chat([*messages, result], family=family, tools=TOOLS)
    assert "sunny, 24 C" in follow.text.split(QUESTION)[-1]
    assert follow.text.index("sunny, 24 C") > follow.text.index(QUESTION)


def test_tool_call_arguments_reach_a_models_template_as_an_object() -> None:
    source = "{% for m in messages %}{% for tc in m.tool_calls or [] %}{{ tc.function.arguments.city }}{% endfor %}{% endfor %}"
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [CALL]}]
    assert (
        render_chat(messages, family="qwen3", chat_template=source, add_generation_prompt=False).text
        == "Paris"
    )
