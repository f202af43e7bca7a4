"""The reasoning protocol of each model family, one registry entry per family.

An entry says how a family's model marks its thought (tags or harmony channels), whether
the chat template opens the thought in the prompt (reasoning *forced*), which
``chat_template_kwargs`` key turns thinking on or off, which token starts a tool call, and
which tokens must not appear while the model thinks. Adding a family is adding an entry:
the parser, the chat-template renderer and :func:`reasoning_enabled` read only entries.

Whether a request reasons is decided in one place, :func:`reasoning_enabled`; the grammar's
reasoning wrapper and the :class:`~thinkstruct.parsers.ReasoningParser` must both be handed
that same value (:class:`~thinkstruct.parsers.ChatPrompt` carries it).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from thinkstruct.parsers import builtin_chat_templates as builtin
from thinkstruct.parsers.errors import InvalidChatRequest, InvalidTemplateSpec
from thinkstruct.registry import Registry


class ReasoningFormat(enum.Enum):
    """How a family's output marks reasoning."""

    TAGS = "tags"
    """A thought between a start and an end tag (``<think>…</think>``), then the answer."""
    HARMONY = "harmony"
    """OpenAI harmony messages: the ``analysis`` channel is reasoning, ``final`` is the
    answer, ``commentary`` carries tool calls."""


class SwitchStyle(enum.Enum):
    """How the value of a thinking switch in ``chat_template_kwargs`` is read."""

    BOOL = "bool"
    """``true`` / ``false`` (``enable_thinking``, ``thinking``, ``reasoning``)."""
    EFFORT = "effort"
    """An effort level string; ``"none"`` turns thinking off, any other level leaves it on
    (``reasoning_effort``)."""


_EFFORT_LEVELS = ("none", "minimal", "low", "medium", "high")


@dataclass(frozen=True, slots=True)
class ThinkingSwitch:
    """The ``chat_template_kwargs`` key that turns a family's thinking on or off.

    Attributes:
        kwarg: the key, e.g. ``"enable_thinking"``; the family's chat template reads it too.
        default: whether thinking is on when the request does not set the key.
        style: how the value is read.
    """

    kwarg: str
    default: bool
    style: SwitchStyle = SwitchStyle.BOOL

    def is_on(self, value: object) -> bool:
        """Whether ``value`` (the request's value of :attr:`kwarg`, not ``None``) turns thinking on."""
        if self.style is SwitchStyle.BOOL:
            if isinstance(value, bool):
                return value
            raise InvalidChatRequest(
                f"chat_template_kwargs[{self.kwarg!r}] must be true or false, got {value!r}"
            )
        if isinstance(value, str) and value.lower() in _EFFORT_LEVELS:
            return value.lower() != "none"
        raise InvalidChatRequest(
            f"chat_template_kwargs[{self.kwarg!r}] must be one of {', '.join(_EFFORT_LEVELS)}, got {value!r}"
        )

    def template_value(self, enabled: bool) -> object | None:
        """The value to hand the chat template so that it agrees with ``enabled``; ``None``
        means leave the key unset (an effort switch that is on keeps the template's level)."""
        if self.style is SwitchStyle.BOOL:
            return enabled
        return None if enabled else "none"


@dataclass(frozen=True, slots=True)
class ReasoningFamily:
    """One model family's reasoning protocol.

    Attributes:
        name: registry name, e.g. ``"qwen3"``.
        think_start, think_end: the texts that open and close a thought. For a harmony
            family these are the analysis message's header and its end token.
        forced: when reasoning is on, the chat template already opens the thought in the
            prompt, so the output starts inside it (an echoed start tag is dropped).
        switch: the chat-template kwarg that turns thinking on or off; ``None`` when the
            family always thinks.
        tool_call_start: the text that starts a tool call; met during a thought, it ends
            the thought and goes (with what follows) to content, for the tool-call parser.
        tool_call_syntax: the name of the family's tool-call syntax in the
            :mod:`~thinkstruct.parsers.tool_calls` registry (``None``: no tool calls).
        banned_while_thinking: special-token texts the grammar keeps out of a thought:
            the start tag (a nested thought would desynchronise the parser and the
            grammar's end detection) and protocol tokens that cannot occur inside one.
            The tool-call start is listed where it is a token: under a grammar a call can
            then only come after the thought, where the grammar holds it, so parser and
            grammar agree on where the thought ends (without a grammar the parser still
            ends a thought at a call). End-of-sequence tokens are not listed: they are
            the model's, not the family's, and whether a thought may end the output is
            the grammar's policy.
            Multi-token plain-text tags cannot be banned as tokens and are not listed.
        format: how the output marks reasoning.
        chat_template: a built-in jinja2 chat template for models that ship none.
        prefer_builtin_template: use :attr:`chat_template` even when the model has its
            own (for a family whose protocol the model's template does not know).
        description: one line for docs and error messages.
        model_patterns: regular expressions (searched, case-insensitive) that recognise
            this family's models by name (directory, GGUF ``general.name``) or, failing
            that, by architecture (``config.model_type``, ``architectures``); the longest
            match over all families wins, so ``qwen3.*thinking`` beats ``qwen3``.
    """

    name: str
    think_start: str
    think_end: str
    forced: bool
    switch: ThinkingSwitch | None
    tool_call_start: str | None = None
    banned_while_thinking: tuple[str, ...] = ()
    format: ReasoningFormat = ReasoningFormat.TAGS
    chat_template: str | None = field(default=None, repr=False)
    prefer_builtin_template: bool = False
    description: str = ""
    model_patterns: tuple[str, ...] = ()
    tool_call_syntax: str | None = None

    def __post_init__(self) -> None:
        where = f"reasoning family {self.name!r}"
        if not self.name:
            raise InvalidTemplateSpec("a reasoning family needs a non-empty name")
        tags = {"think_start": self.think_start, "think_end": self.think_end}
        if self.tool_call_start is not None:
            tags["tool_call_start"] = self.tool_call_start
        for label, tag in tags.items():
            # The parsers strip whitespace around tags; a tag that begins or ends with
            # whitespace would make that rule ambiguous.
            if not isinstance(tag, str) or not tag or tag != tag.strip():
                raise InvalidTemplateSpec(
                    f"{where}: {label} must be a non-empty string without surrounding whitespace, got {tag!r}"
                )
        if self.tool_call_syntax is not None and self.tool_call_start is None:
            raise InvalidTemplateSpec(
                f"{where}: tool_call_syntax needs a tool_call_start (where a call begins)"
            )
        if self.prefer_builtin_template and not self.chat_template:
            raise InvalidTemplateSpec(f"{where}: prefer_builtin_template needs a chat_template")
        for pattern in self.model_patterns:
            try:
                re.compile(pattern)
            except (re.error, TypeError) as exc:
                raise InvalidTemplateSpec(
                    f"{where}: model pattern {pattern!r} is not a regular expression: {exc}"
                ) from None

    @property
    def always_thinks(self) -> bool:
        """Whether no request can turn this family's thinking off."""
        return self.switch is None

    def enabled(self, chat_template_kwargs: Mapping[str, Any] | None = None) -> bool:
        """Whether a request with these ``chat_template_kwargs`` reasons (see :func:`reasoning_enabled`)."""
        if self.switch is None:
            return True
        value = (chat_template_kwargs or {}).get(self.switch.kwarg)
        if value is None:
            return self.switch.default
        return self.switch.is_on(value)


_families: Registry[ReasoningFamily] = Registry("reasoning family", ReasoningFamily)
register_reasoning_family = _families.register
unregister_reasoning_family = _families.unregister
get_reasoning_family = _families.get
reasoning_families = _families.snapshot


def reasoning_enabled(
    family: str | ReasoningFamily, chat_template_kwargs: Mapping[str, Any] | None = None
) -> bool:
    """Whether a request to a ``family`` model with these ``chat_template_kwargs`` reasons.

    This is the one place the decision is made. Render the prompt, build the grammar's
    reasoning wrapper and build the :class:`~thinkstruct.parsers.ReasoningParser` from the
    same returned value (``render_chat`` returns it in :attr:`ChatPrompt.reasoning_enabled`).

    Raises:
        UnknownName: unknown family.
        InvalidChatRequest: the switch's value is of the wrong kind (names the key).
    """
    return get_reasoning_family(family).enabled(chat_template_kwargs)


_THINK = "<think>"
_END_THINK = "</think>"
_TOOL_CALL = "<tool_call>"
_DEEPSEEK_CALLS = "<｜tool▁calls▁begin｜>"
_DSML = "｜DSML｜"  # the DSML token; every DSML tag is spelled with it

for _family in (
    ReasoningFamily(
        name="deepseek-r1",
        think_start=_THINK,
        think_end=_END_THINK,
        forced=True,
        switch=None,
        tool_call_start=_DEEPSEEK_CALLS,
        tool_call_syntax="deepseek-v3",
        banned_while_thinking=(_THINK, _DEEPSEEK_CALLS),
        chat_template=builtin.DEEPSEEK_R1,
        description="DeepSeek-R1: always thinks; the template opens <think> in the prompt.",
        model_patterns=(r"deepseek[-_ ]?r1", r"r1[-_ ]distill"),
    ),
    ReasoningFamily(
        name="deepseek-v3",
        think_start=_THINK,
        think_end=_END_THINK,
        forced=True,
        switch=ThinkingSwitch("thinking", default=False),
        tool_call_start=_DEEPSEEK_CALLS,
        tool_call_syntax="deepseek-v3.1",
        banned_while_thinking=(_THINK, _DEEPSEEK_CALLS),
        chat_template=builtin.DEEPSEEK_V3,
        description="DeepSeek-V3.1+: thinks only with thinking=true; the template then opens <think>.",
        model_patterns=(r"deepseek[-_ ]?v3",),
    ),
    ReasoningFamily(
        name="deepseek-v4",
        think_start=_THINK,
        think_end=_END_THINK,
        forced=True,
        switch=ThinkingSwitch("thinking", default=False),
        # V4 writes <｜DSML｜tool_calls>; <｜DSML｜function_calls> is V3.2's (the DSML
        # syntax reads both).
        tool_call_start="<｜DSML｜tool_calls>",
        tool_call_syntax="dsml",
        banned_while_thinking=(_THINK, _DSML),
        chat_template=builtin.DEEPSEEK_V4,
        description="DeepSeek-V4: thinks only with thinking=true; DSML tool calls; its tokenizer ships no chat template.",
        model_patterns=(r"deepseek[-_ ]?v4",),
    ),
    ReasoningFamily(
        name="qwen3",
        think_start=_THINK,
        think_end=_END_THINK,
        forced=False,
        switch=ThinkingSwitch("enable_thinking", default=True),
        tool_call_start=_TOOL_CALL,
        tool_call_syntax="hermes",
        banned_while_thinking=(_THINK, _TOOL_CALL, "</tool_call>", "<|im_start|>"),
        chat_template=builtin.QWEN3,
        description="Qwen3 hybrid: writes <think> itself unless enable_thinking=false.",
        model_patterns=(r"qwen3",),
    ),
    ReasoningFamily(
        name="qwen3-thinking",
        think_start=_THINK,
        think_end=_END_THINK,
        forced=True,
        switch=None,
        tool_call_start=_TOOL_CALL,
        tool_call_syntax="hermes",
        banned_while_thinking=(_THINK, _TOOL_CALL, "</tool_call>", "<|im_start|>"),
        chat_template=builtin.QWEN3_THINKING,
        description="Qwen3 *-Thinking: always thinks; the template opens <think> in the prompt.",
        model_patterns=(r"qwen3.*thinking",),
    ),
    ReasoningFamily(
        name="qwen3.5",
        think_start=_THINK,
        think_end=_END_THINK,
        forced=True,
        switch=ThinkingSwitch("enable_thinking", default=True),
        tool_call_start=_TOOL_CALL,
        tool_call_syntax="qwen3-coder",
        banned_while_thinking=(_THINK, _TOOL_CALL, "</tool_call>", "<|im_start|>"),
        chat_template=builtin.QWEN35,
        description="Qwen3.5 hybrid: the template opens <think> unless enable_thinking=false; "
        "Qwen3-Coder XML tool calls.",
        model_patterns=(r"qwen3\.5", r"qwen3_5"),
    ),
    ReasoningFamily(
        name="kimi",
        think_start="◁think▷",
        think_end="◁/think▷",
        forced=False,
        switch=None,
        banned_while_thinking=("◁think▷",),
        chat_template=builtin.KIMI,
        description="Kimi thinking models: ◁think▷…◁/think▷ written by the model.",
        model_patterns=(r"kimi",),
    ),
    ReasoningFamily(
        name="kimi-k2",
        think_start=_THINK,
        think_end=_END_THINK,
        forced=False,
        switch=ThinkingSwitch("thinking", default=True),
        tool_call_start="<|tool_calls_section_begin|>",
        tool_call_syntax="kimi-k2",
        banned_while_thinking=(_THINK, "<|tool_calls_section_begin|>", "<|im_user|>", "<|im_system|>"),
        chat_template=builtin.KIMI_K2,
        description="Kimi-K2 Thinking / K2.5: writes <think> itself; thinking=false closes an empty one; "
        "tool-call section tokens.",
        model_patterns=(r"kimi[-_ ]?k2",),
    ),
    ReasoningFamily(
        name="glm45",
        think_start=_THINK,
        think_end=_END_THINK,
        forced=False,
        switch=ThinkingSwitch("enable_thinking", default=True),
        tool_call_start=_TOOL_CALL,
        tool_call_syntax="glm45",
        banned_while_thinking=(_THINK, _TOOL_CALL, "</tool_call>", "<|user|>", "<|observation|>"),
        chat_template=builtin.GLM45,
        description="GLM-4.5: writes <think> itself unless enable_thinking=false.",
        model_patterns=(r"glm[-_ ]?4\.[56]", r"glm4_moe"),
    ),
    ReasoningFamily(
        name="glm47",
        think_start=_THINK,
        think_end=_END_THINK,
        forced=True,
        switch=ThinkingSwitch("enable_thinking", default=True),
        tool_call_start=_TOOL_CALL,
        tool_call_syntax="glm47",
        banned_while_thinking=(_THINK, _TOOL_CALL, "</tool_call>", "<|user|>", "<|observation|>"),
        chat_template=builtin.GLM47,
        description="GLM-4.7 / GLM-5: the template opens <think> (</think> with enable_thinking=false).",
        model_patterns=(r"glm[-_ ]?4\.7", r"glm[-_ ]?5"),
    ),
    ReasoningFamily(
        name="hunyuan",
        think_start=_THINK,
        think_end=_END_THINK,
        forced=False,
        switch=ThinkingSwitch("enable_thinking", default=True),
        tool_call_start="<tool_calls>",
        tool_call_syntax="hunyuan",
        banned_while_thinking=(_THINK, "<tool_calls>", "<answer>"),
        chat_template=builtin.HUNYUAN,
        description="Hunyuan-A13B: writes <think> itself (an empty one with enable_thinking=false), "
        "answers in <answer>…</answer>.",
        model_patterns=(r"hunyuan",),
    ),
    ReasoningFamily(
        name="gemma4",
        think_start="<|channel>thought",
        think_end="<channel|>",
        forced=False,
        switch=ThinkingSwitch("enable_thinking", default=False),
        tool_call_start="<|tool_call>",
        tool_call_syntax="gemma4",
        banned_while_thinking=("<|channel>", "<|tool_call>", "<|turn>"),
        chat_template=builtin.GEMMA4,
        description="Gemma 4: enable_thinking=true puts <|think|> in the system turn; the model then "
        "writes <|channel>thought…<channel|>.",
        model_patterns=(r"gemma[-_ ]?4",),
    ),
    ReasoningFamily(
        name="nemotron3",
        think_start=_THINK,
        think_end=_END_THINK,
        forced=True,
        switch=ThinkingSwitch("enable_thinking", default=True),
        tool_call_start=_TOOL_CALL,
        tool_call_syntax="qwen3-coder",
        banned_while_thinking=(_THINK, _TOOL_CALL, "</tool_call>", "<|im_start|>"),
        chat_template=builtin.NEMOTRON3,
        description="NVIDIA Nemotron 3: the template opens <think> (closes an empty one with "
        "enable_thinking=false); Qwen3-Coder XML tool calls.",
        model_patterns=(r"nemotron[-_ ]?3",),
    ),
    ReasoningFamily(
        name="minimax-m2",
        think_start=_THINK,
        think_end=_END_THINK,
        forced=True,
        switch=None,
        tool_call_start="<minimax:tool_call>",
        tool_call_syntax="minimax-m2",
        banned_while_thinking=(_THINK, "<minimax:tool_call>"),
        chat_template=builtin.MINIMAX_M2,
        description="MiniMax-M2: always thinks; the template opens <think>; XML invoke tool calls.",
        model_patterns=(r"minimax[-_ ]?m2",),
    ),
    ReasoningFamily(
        name="granite",
        think_start=_THINK,
        think_end=_END_THINK,
        forced=False,
        switch=ThinkingSwitch("thinking", default=False),
        tool_call_start="<|tool_call|>",
        tool_call_syntax="granite",
        banned_while_thinking=(_THINK, "<|tool_call|>", "<|start_of_role|>"),
        chat_template=builtin.GRANITE,
        description="IBM Granite 3.2/3.3: thinking=true asks for <think>…</think> then <response>…</response>.",
        model_patterns=(r"granite",),
    ),
    ReasoningFamily(
        name="mistral",
        think_start="[THINK]",
        think_end="[/THINK]",
        forced=False,
        switch=ThinkingSwitch("reasoning_effort", default=True, style=SwitchStyle.EFFORT),
        tool_call_start="[TOOL_CALLS]",
        tool_call_syntax="mistral",
        banned_while_thinking=("[THINK]", "[INST]", "[TOOL_CALLS]"),
        chat_template=builtin.MISTRAL,
        description="Magistral / Mistral reasoning models: [THINK]…[/THINK]; reasoning_effort=none turns it off.",
        model_patterns=(r"magistral",),
    ),
    ReasoningFamily(
        name="gpt-oss",
        think_start="<|channel|>analysis<|message|>",
        think_end="<|end|>",
        forced=False,
        switch=None,
        tool_call_start="<|channel|>commentary",
        tool_call_syntax="harmony",
        banned_while_thinking=("<|return|>", "<|call|>", "<|constrain|>"),
        format=ReasoningFormat.HARMONY,
        chat_template=builtin.GPT_OSS,
        description="gpt-oss harmony: analysis channel is reasoning, final is content, commentary is tool calls.",
        model_patterns=(r"gpt[-_ ]?oss",),
    ),
    ReasoningFamily(
        name="cohere-command",
        think_start="<|START_THINKING|>",
        think_end="<|END_THINKING|>",
        forced=True,
        switch=ThinkingSwitch("reasoning", default=True),
        tool_call_start="<|START_ACTION|>",
        tool_call_syntax="cohere",
        banned_while_thinking=(
            "<|START_THINKING|>",
            "<|START_RESPONSE|>",
            "<|END_RESPONSE|>",
            "<|START_ACTION|>",
        ),
        chat_template=builtin.COHERE_COMMAND,
        description="Cohere Command A reasoning: the template opens <|START_THINKING|> unless reasoning=false.",
        model_patterns=(r"command[-_ ]a[-_ ]reasoning",),
    ),
    ReasoningFamily(
        name="smollm2-think",
        think_start=_THINK,
        think_end=_END_THINK,
        forced=True,
        switch=ThinkingSwitch("enable_thinking", default=True),
        tool_call_start=_TOOL_CALL,
        tool_call_syntax="hermes-list",
        # The tags are plain text (several tokens each) for SmolLM2: nothing to ban as a token.
        banned_while_thinking=(),
        chat_template=builtin.SMOLLM2_THINK,
        prefer_builtin_template=True,
        description="SmolLM2 (no thinking tokens): a system instruction and an opening '<think>\\n' "
        "in the generation prompt make it think in plain-text tags; tool calls as "
        "<tool_call>[{...}]</tool_call>.",
        model_patterns=(r"smollm2",),
    ),
):
    register_reasoning_family(_family)
del _family
