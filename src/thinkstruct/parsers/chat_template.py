"""Render chat messages into a prompt with a model's jinja2 chat template.

The template comes from the model (its tokenizer config, ``chat_template.jinja`` or GGUF
metadata) or, where the model has none, from its reasoning family's built-in one. It
runs in jinja2's immutable sandbox with the helpers Hugging Face templates expect
(``raise_exception``, ``tojson``, ``strftime_now``); any failure is a
:class:`~thinkstruct.parsers.errors.ChatTemplateError` naming the template and line.

:func:`render_chat` decides once, with
:func:`~thinkstruct.parsers.reasoning_enabled`, whether the request reasons, hands that
decision to the template through the family's switch kwarg, and returns it in the
:class:`ChatPrompt` together with the prompt, so that the grammar and the reasoning parser
receive the very same value.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from thinkstruct.parsers.errors import ChatTemplateError, InvalidChatRequest
from thinkstruct.parsers.reasoning_families import ReasoningFamily, get_reasoning_family
from thinkstruct.parsers.reasoning_parser import ReasoningParser

if TYPE_CHECKING:
    from jinja2 import Template
    from jinja2.sandbox import ImmutableSandboxedEnvironment

# Variables the renderer sets itself; chat_template_kwargs may not replace them.
_RESERVED = frozenset({"messages", "add_generation_prompt", "continue_final_message", "tools"})
_SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")
# Stands in for an empty final message so that its place in the rendered prompt can be found.
_SENTINEL = "\ue000thinkstruct-final-message\ue001"


class _TemplateRaised(Exception):
    """raise_exception() called by a template; carries the template's own message."""


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # jinja2's own tojson HTML-escapes; chat templates want the JSON text itself.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@functools.cache
def _environment() -> ImmutableSandboxedEnvironment:
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@functools.lru_cache(maxsize=64)
def _compile(source: str, name: str) -> Template:
    from jinja2 import TemplateSyntaxError

    try:
        return _environment().from_string(source)
    except TemplateSyntaxError as exc:
        raise ChatTemplateError(f"syntax error: {exc.message}", template=name, line=exc.lineno) from None


def _template_line(exc: BaseException) -> int | None:
    """The template line a rendering error happened on, from the traceback jinja2 rewrites."""
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


class ChatTemplate:
    """A compiled jinja2 chat template.

    Args:
        source: the template text.
        name: a label for error messages (its file, or ``"built-in qwen3"``).
        special_tokens: ``bos_token``, ``eos_token``, ... made available to the template.

    Raises:
        ChatTemplateError: the template does not compile (names the line).
    """

    def __init__(
        self, source: str, *, name: str = "chat template", special_tokens: Mapping[str, str] | None = None
    ):
        if not isinstance(source, str) or not source.strip():
            raise ChatTemplateError("the chat template is empty", template=name)
        self.source = source
        self.name = name
        self.special_tokens: dict[str, str] = {
            k: v for k, v in (special_tokens or {}).items() if isinstance(v, str)
        }
        self._template = _compile(source, name)

    # ---- construction ------------------------------------------------------------------

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> ChatTemplate | None:
        """The template of a :class:`~thinkstruct.Tokenizer` (or Hugging Face tokenizer),
        or ``None`` when it has none."""
        source = _select_source(getattr(tokenizer, "chat_template", None))
        if source is None:
            return None
        return cls(
            source,
            name=f"chat template of {_tokenizer_label(tokenizer)}",
            special_tokens=_special_tokens(tokenizer),
        )

    @classmethod
    def from_path(cls, path: str | os.PathLike[str]) -> ChatTemplate | None:
        """The template stored at ``path``: a model directory (``chat_template.jinja`` or
        ``tokenizer_config.json``), either file itself, or a GGUF file's metadata.
        ``None`` when the model has none."""
        p = Path(path)
        if p.is_dir():
            jinja_file = p / "chat_template.jinja"
            if jinja_file.is_file():
                return cls._from_jinja_file(
                    jinja_file, special_tokens=_config_special_tokens(p / "tokenizer_config.json")
                )
            config = p / "tokenizer_config.json"
            return cls._from_config(config) if config.is_file() else None
        if p.suffix == ".gguf" and p.is_file():
            source, special = _gguf_chat_template(p)
            return None if source is None else cls(source, name=str(p), special_tokens=special)
        if p.suffix in (".jinja", ".j2") and p.is_file():
            return cls._from_jinja_file(p)
        if p.suffix == ".json" and p.is_file():
            return cls._from_config(p)
        raise ChatTemplateError(f"no model directory, tokenizer_config.json, .jinja or .gguf file at {p}")

    @classmethod
    def _from_jinja_file(cls, path: Path, *, special_tokens: Mapping[str, str] | None = None) -> ChatTemplate:
        try:
            source = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ChatTemplateError(f"cannot read: {exc.strerror or exc}", template=str(path)) from exc
        return cls(source, name=str(path), special_tokens=special_tokens)

    @classmethod
    def _from_config(cls, path: Path) -> ChatTemplate | None:
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ChatTemplateError(f"cannot read tokenizer config: {exc}", template=str(path)) from exc
        source = _select_source(config.get("chat_template") if isinstance(config, dict) else None)
        if source is None:
            return None
        return cls(source, name=str(path), special_tokens=_config_special_tokens(path))

    # ---- rendering ---------------------------------------------------------------------

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool | None = None,
        continue_final_message: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> str:
        """The prompt for ``messages``.

        Args:
            messages: ``{"role": ..., "content": ...}`` mappings (content a string, a list
                of ``{"type": "text", "text": ...}`` parts, or ``None``).
            add_generation_prompt: end with the opening of an assistant turn; defaults to
                ``not continue_final_message``.
            continue_final_message: end inside the final (assistant) message, so the model
                continues its text instead of starting a new turn.
            tools: tool definitions, passed to the template as ``tools``.
            template_kwargs: more template variables (``enable_thinking``, ...).

        Raises:
            InvalidChatRequest: malformed messages, or conflicting options (names them).
            ChatTemplateError: the template failed (names the line) or called ``raise_exception``.
        """
        _check_messages(messages)
        if add_generation_prompt is None:
            add_generation_prompt = not continue_final_message
        if continue_final_message and add_generation_prompt:
            raise InvalidChatRequest(
                "add_generation_prompt and continue_final_message cannot both be true: the first opens "
                "a new assistant turn, the second continues the last message"
            )
        _check_reserved(template_kwargs)
        variables: dict[str, Any] = {**self.special_tokens, **template_kwargs}
        variables.update(add_generation_prompt=bool(add_generation_prompt), tools=tools)
        messages = _decoded_tool_calls(messages)
        if not continue_final_message:
            return self._render(messages, variables, continue_final_message=False)
        return self._render_continuation(messages, variables)

    def _render(
        self, messages: list[Mapping[str, Any]], variables: dict[str, Any], *, continue_final_message: bool
    ) -> str:
        from jinja2 import TemplateError

        try:
            return self._template.render(
                messages=messages, continue_final_message=continue_final_message, **variables
            )
        except _TemplateRaised as exc:
            raise ChatTemplateError(
                f"the template refused the request: {exc}", template=self.name, line=_template_line(exc)
            ) from None
        except TemplateError as exc:
            raise ChatTemplateError(
                f"{type(exc).__name__}: {exc}", template=self.name, line=_template_line(exc)
            ) from None
        except Exception as exc:  # noqa: BLE001 - a template bug (e.g. str + None) must not crash the caller
            raise ChatTemplateError(
                f"{type(exc).__name__}: {exc}", template=self.name, line=_template_line(exc)
            ) from None

    def _render_continuation(self, messages: list[Mapping[str, Any]], variables: dict[str, Any]) -> str:
        final = content_text(messages[-1].get("content"))
        core = final.strip()
        if not core:
            # Nothing to find in the output: render a stand-in and cut where it appears.
            stand_in = [*messages[:-1], {**messages[-1], "content": _SENTINEL}]
            rendered = self._render(stand_in, variables, continue_final_message=True)
            at = rendered.rfind(_SENTINEL)
            if at < 0:
                raise ChatTemplateError(
                    "continue_final_message: the template does not render the final message's content",
                    template=self.name,
                )
            return rendered[:at] + final
        rendered = self._render(messages, variables, continue_final_message=True)
        at = rendered.rfind(core)
        if at < 0:
            raise ChatTemplateError(
                "continue_final_message: the template does not render the final message's text verbatim, "
                "so the prompt cannot end inside it",
                template=self.name,
            )
        end = at + len(core)
        trailing = final[len(final.rstrip()) :]
        if trailing and rendered.startswith(trailing, end):
            end += len(trailing)  # the template kept the message's trailing whitespace: so do we
        return rendered[:end]

    def __repr__(self) -> str:
        return f"ChatTemplate({self.name!r})"


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    """A rendered prompt and the reasoning decision it was rendered with.

    Attributes:
        text: the prompt.
        family: the reasoning family.
        reasoning_enabled: whether the request reasons; give this same value to the
            grammar's reasoning wrapper (the parser from :meth:`reasoning_parser` has it).
        continue_final_message: the prompt ends inside the final assistant message.
        previous_content: that message's text (``""`` otherwise).
        starts_in_thought: the request reasons and the rendered prompt leaves a thought
            open (it ends with the family's start tag, before any continued text), so the
            output starts inside it. Read from the prompt, not assumed from the family: a
            Qwen3.5-style template opens ``<think>`` for family ``qwen3`` too. The parser
            from :meth:`reasoning_parser` starts there; a grammar's reasoning wrapper,
            which starts inside the thought, needs it true (:meth:`with_thought_open`).
    """

    text: str
    family: ReasoningFamily
    reasoning_enabled: bool
    continue_final_message: bool = False
    previous_content: str = ""
    starts_in_thought: bool = False

    def reasoning_parser(
        self,
        *,
        stream_reasoning: bool = True,
        force_reasoning: bool | None = None,
        calls_end_thought: bool = True,
    ) -> ReasoningParser:
        """The reasoning parser for this request's output, built from the same decision
        (``force_reasoning`` defaults to :attr:`starts_in_thought`). ``calls_end_thought``
        false: only the end tag ends a thought, as under a grammar, whose reasoning wrapper
        keeps a tool-call start written inside the thought in the thought (the family's
        ``tool_call_start`` is text there, several tokens, that no ban keeps out)."""
        family = self.family
        if not calls_end_thought and family.tool_call_start is not None:
            family = dataclasses.replace(family, tool_call_start=None, tool_call_syntax=None)
        return ReasoningParser(
            family,
            enabled=self.reasoning_enabled,
            force_reasoning=self.starts_in_thought if force_reasoning is None else force_reasoning,
            stream_reasoning=stream_reasoning,
            continue_final_message=self.continue_final_message,
            previous_content=self.previous_content,
        )

    def with_thought_open(self) -> ChatPrompt:
        """This prompt, ending inside an open thought when the request reasons.

        A family whose model writes its own start tag (Qwen3, GLM-4.5, Kimi) leaves the
        thought closed in the prompt; a grammar's reasoning wrapper starts inside the
        thought, so a constrained request writes the start tag into the prompt instead
        (``<think>\n``), where the model would have written it. Unchanged when the
        thought is open already, the request does not reason, the prompt continues a
        message, or the family marks thoughts with harmony channels.
        """
        from thinkstruct.parsers.reasoning_families import ReasoningFormat

        if (
            self.starts_in_thought
            or not self.reasoning_enabled
            or self.continue_final_message
            or self.family.format is not ReasoningFormat.TAGS
        ):
            return self
        return dataclasses.replace(
            self, text=self.text + self.family.think_start + "\n", starts_in_thought=True
        )

    def tool_parser(self, tools: Any = None) -> Any:
        """A :class:`~thinkstruct.parsers.tool_calls.ToolCallParser` for this family's
        tool-call syntax (it reads the content the reasoning parser leaves).

        Raises:
            ValueError: the family has no tool-call syntax.
        """
        from thinkstruct.parsers.tool_calls import ToolCallParser

        return ToolCallParser(self.family, tools=tools)


def chat_template_for(
    family: str | ReasoningFamily,
    *,
    tokenizer: Any = None,
    chat_template: ChatTemplate | str | os.PathLike[str] | None = None,
) -> ChatTemplate:
    """The chat template to use for a ``family`` model.

    In order: ``chat_template`` when given (a :class:`ChatTemplate`, template text, or a
    path for :meth:`ChatTemplate.from_path`); the family's built-in template when the
    family prefers it; the tokenizer's own template; the family's built-in template.

    Raises:
        ChatTemplateError: none of these exists.
    """
    spec = get_reasoning_family(family)
    special = _special_tokens(tokenizer) if tokenizer is not None else {}
    if isinstance(chat_template, ChatTemplate):
        return chat_template
    if isinstance(chat_template, os.PathLike) or (
        isinstance(chat_template, str) and "{" not in chat_template and Path(chat_template).exists()
    ):
        found = ChatTemplate.from_path(chat_template)
        if found is None:
            raise ChatTemplateError(f"{chat_template} has no chat template")
        return found
    if isinstance(chat_template, str):
        return ChatTemplate(chat_template, name="chat template from the request", special_tokens=special)
    if spec.prefer_builtin_template and spec.chat_template:
        return ChatTemplate(spec.chat_template, name=f"built-in {spec.name} template", special_tokens=special)
    if tokenizer is not None:
        own = ChatTemplate.from_tokenizer(tokenizer)
        if own is not None:
            return own
    if spec.chat_template:
        return ChatTemplate(spec.chat_template, name=f"built-in {spec.name} template", special_tokens=special)
    raise ChatTemplateError(
        f"reasoning family {spec.name!r} has no built-in chat template and the model provides none; "
        "pass chat_template="
    )


def render_chat(
    messages: Sequence[Mapping[str, Any]],
    *,
    family: str | ReasoningFamily,
    tokenizer: Any = None,
    chat_template: ChatTemplate | str | os.PathLike[str] | None = None,
    add_generation_prompt: bool | None = None,
    continue_final_message: bool = False,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> ChatPrompt:
    """Render a chat request for a ``family`` model and decide whether it reasons.

    The family's thinking switch in ``chat_template_kwargs`` (``enable_thinking``,
    ``thinking``, ``reasoning``, ``reasoning_effort``) is read by
    :func:`~thinkstruct.parsers.reasoning_enabled`; the template then receives the switch
    set to that decision, so the prompt, the grammar and the parser agree even when the
    request leaves it unset and the model's template has another default.

    Args:
        messages: the conversation.
        family: the model's reasoning family.
        tokenizer: the model's tokenizer (its chat template and special tokens).
        chat_template: overrides the template (see :func:`chat_template_for`).
        add_generation_prompt: defaults to ``not continue_final_message``.
        continue_final_message: continue the final assistant message.
        chat_template_kwargs: extra template variables, including the thinking switch.
        tools: tool definitions for the template.

    Raises:
        UnknownName: unknown family.
        InvalidChatRequest: a bad switch value or message (names it).
        ChatTemplateError: no template, or the template failed.
    """
    spec = get_reasoning_family(family)
    kwargs = dict(chat_template_kwargs or {})
    _check_reserved(kwargs)
    enabled = spec.enabled(kwargs)
    if spec.switch is not None:
        value = spec.switch.template_value(enabled)
        if value is not None:
            kwargs[spec.switch.kwarg] = value
    template = chat_template_for(spec, tokenizer=tokenizer, chat_template=chat_template)
    text = template.render(
        messages,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        tools=tools,
        **kwargs,
    )
    previous = content_text(messages[-1].get("content")) if continue_final_message else ""
    return ChatPrompt(
        text=text,
        family=spec,
        reasoning_enabled=enabled,
        continue_final_message=continue_final_message,
        previous_content=previous,
        starts_in_thought=enabled and prompt_opens_thought(text, spec, previous=previous),
    )


def prompt_opens_thought(text: str, family: ReasoningFamily, *, previous: str = "") -> bool:
    """Whether ``text`` (a rendered prompt) ends inside an open thought of ``family``: it
    ends with the start tag, whitespace aside. With ``previous`` (the assistant text a
    continued prompt ends with) the tag is looked for just before that text, whose own
    tags the parser then reads."""
    head = text.rstrip()
    core = previous.strip()
    if core and head.endswith(core):
        head = head[: len(head) - len(core)].rstrip()
    return head.endswith(family.think_start)


def _decoded_tool_calls(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """``messages`` with each assistant tool call's ``function.arguments`` decoded from its
    JSON string into an object, as Hugging Face chat templates expect (the OpenAI API
    sends a string). Arguments that are not a JSON object are left as they are."""
    out: list[Mapping[str, Any]] = []
    for message in messages:
        calls = message.get("tool_calls") if isinstance(message, Mapping) else None
        if not isinstance(calls, (list, tuple)) or not calls:
            out.append(message)
            continue
        decoded = []
        for call in calls:
            function = call.get("function") if isinstance(call, Mapping) else None
            arguments = function.get("arguments") if isinstance(function, Mapping) else None
            if isinstance(function, Mapping) and isinstance(arguments, str):
                try:
                    value = json.loads(arguments)
                except ValueError:
                    value = None
                if isinstance(value, dict):
                    call = {**call, "function": {**function, "arguments": value}}
            decoded.append(call)
        out.append({**message, "tool_calls": decoded})
    return out


def content_text(content: Any) -> str:
    """The text of a message's ``content``: a string, text parts joined, or ``""``."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        return "".join(
            part.get("text", "")
            for part in content
            if isinstance(part, Mapping) and part.get("type") == "text"
        )
    raise InvalidChatRequest(
        f"message content must be a string, a list of parts or null, got {type(content).__name__}"
    )


def _check_reserved(kwargs: Mapping[str, Any]) -> None:
    clash = sorted(_RESERVED & kwargs.keys())
    if clash:
        raise InvalidChatRequest(f"chat_template_kwargs may not set {', '.join(map(repr, clash))}")


def _check_messages(messages: Sequence[Mapping[str, Any]]) -> None:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidChatRequest(f"messages must be a list of messages, got {type(messages).__name__}")
    if not messages:
        raise InvalidChatRequest("messages is empty")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise InvalidChatRequest(f"messages[{i}] must be an object, got {type(message).__name__}")
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise InvalidChatRequest(f"messages[{i}].role must be a non-empty string, got {role!r}")
        content = message.get("content")
        if not (content is None or isinstance(content, (str, list, tuple))):
            raise InvalidChatRequest(
                f"messages[{i}].content must be a string, a list of parts or null, got {type(content).__name__}"
            )


def _select_source(value: Any) -> str | None:
    """A template's text from a tokenizer config value: a string, or HF's list of named
    templates (the ``default`` one)."""
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, Mapping)}
        chosen = named.get("default") or next((t for t in named.values() if isinstance(t, str)), None)
        return chosen if isinstance(chosen, str) and chosen.strip() else None
    return None


def _tokenizer_label(tokenizer: Any) -> str:
    return str(
        getattr(tokenizer, "name", None) or getattr(tokenizer, "name_or_path", None) or "the tokenizer"
    )


def _special_tokens(tokenizer: Any) -> dict[str, str]:
    hf = getattr(tokenizer, "hf", tokenizer)
    found = {}
    for name in _SPECIAL_TOKEN_NAMES:
        value = getattr(hf, name, None)
        if isinstance(value, str):
            found[name] = value
    return found


def _config_special_tokens(path: Path) -> dict[str, str]:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    found = {}
    for name in _SPECIAL_TOKEN_NAMES:
        value = config.get(name) if isinstance(config, dict) else None
        if isinstance(value, Mapping):  # AddedToken serialised as an object
            value = value.get("content")
        if isinstance(value, str):
            found[name] = value
    return found


def _gguf_chat_template(path: Path) -> tuple[str | None, dict[str, str]]:
    """The chat template and BOS/EOS texts from a GGUF file's metadata."""
    from thinkstruct.parsers.gguf_metadata import GGUFFormatError, read_gguf_metadata

    keys = (
        "tokenizer.chat_template",
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
    )
    try:
        meta = read_gguf_metadata(path, keys)
    except (OSError, GGUFFormatError) as exc:
        raise ChatTemplateError(f"cannot read GGUF metadata: {exc}", template=str(path)) from exc
    tokens = meta.get("tokenizer.ggml.tokens") or []
    special: dict[str, str] = {}
    for name, key in (
        ("bos_token", "tokenizer.ggml.bos_token_id"),
        ("eos_token", "tokenizer.ggml.eos_token_id"),
    ):
        idx = meta.get(key)
        if isinstance(idx, int) and 0 <= idx < len(tokens) and isinstance(tokens[idx], str):
            special[name] = tokens[idx]
    source = meta.get("tokenizer.chat_template")
    return (source if isinstance(source, str) else None), special
