"""Requests -> prompt token ids, and the one decision whether the request reasons.

Chat requests render through the model's chat template (``render_chat``), whose
:class:`~thinkstruct.parsers.ChatPrompt` carries ``reasoning_enabled``: the same value goes
to the grammar matcher and to the reasoning parser. Text completions encode the prompt as
given, or build a fill-in-the-middle prompt from ``suffix`` with the model's completion
template. Rendering and encoding a large prompt takes milliseconds to seconds, so the
routes call these functions in a worker thread, not on the event loop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from thinkstruct.parsers import (
    ChatPrompt,
    ChatTemplateError,
    InvalidChatRequest,
    render_chat,
)
from thinkstruct.server.errors import bad_request

if TYPE_CHECKING:
    from thinkstruct.engine import LoadedModel
    from thinkstruct.tokenizer import Tokenizer

# Families name their thinking switch differently; a request that uses the other common
# spelling still means the same thing.
_SWITCH_ALIASES = {"enable_thinking": "thinking", "thinking": "enable_thinking"}


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatSource:
    """A conversation to render through the chat template (what every chat-shaped API
    translates its messages to).

    Attributes:
        messages: the messages as chat templates read them (``role``, ``content`` and
            optionally ``name``, ``reasoning_content``, ``tool_call_id``, ``tool_calls``).
        chat_template_kwargs: extra template variables, the thinking switch among them.
        add_generation_prompt: ``None``: the opposite of ``continue_final_message``.
        continue_final_message: continue the last (assistant) message.
    """

    messages: list[dict[str, Any]]
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class TextSource:
    """Text-completion prompts: each a string or token ids, with an optional
    fill-in-the-middle ``suffix``."""

    prompts: list[str | list[int]]
    suffix: str | None = None


@dataclass(frozen=True, slots=True)
class Prompt:
    """A prompt ready for the engine.

    Attributes:
        ids: the prompt's token ids.
        text: the prompt text (``echo`` returns it), when it was given as text.
        chat: the rendered chat prompt (reasoning decision and parser), for chat requests.
    """

    ids: list[int]
    text: str | None = None
    chat: ChatPrompt | None = None

    @property
    def reasoning(self) -> bool:
        return self.chat is not None and self.chat.reasoning_enabled


def chat_prompt(
    model: LoadedModel,
    source: ChatSource,
    *,
    constrained: bool,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> Prompt:
    """Render and encode a conversation.

    A constrained request that reasons starts inside the thought (the grammar's reasoning
    wrapper does): when the template leaves the start tag to the model (Qwen3, GLM-4.5),
    the tag is written into the prompt instead (``ChatPrompt.with_thought_open``), so the
    model, the parser and the grammar agree on where the answer begins.

    Raises:
        APIError: 400 for a bad ``chat_template_kwargs`` value, messages the template
            refuses, or no chat template.
    """
    kwargs = thinking_kwargs(model, source.chat_template_kwargs)
    try:
        rendered = render_chat(
            source.messages,
            family=model.family,
            tokenizer=model.tokenizer,
            chat_template=model.chat_template,
            add_generation_prompt=source.add_generation_prompt,
            continue_final_message=source.continue_final_message,
            chat_template_kwargs=kwargs,
            tools=tools,
        )
    except InvalidChatRequest as e:
        raise bad_request(
            str(e), param="chat_template_kwargs" if "chat_template_kwargs" in str(e) else "messages"
        ) from None
    except ChatTemplateError as e:
        raise bad_request(
            f"the chat template failed: {e}", param="messages", code="chat_template_error"
        ) from None
    if constrained:
        rendered = rendered.with_thought_open()
    # The template writes the special tokens (and BOS) itself.
    return Prompt(
        ids=encode(model.tokenizer, rendered.text, add_special_tokens=False),
        text=rendered.text,
        chat=rendered,
    )


def completion_prompt(model: LoadedModel, prompt: str | list[int], *, suffix: str | None) -> Prompt:
    """Encode one text-completion prompt (token ids pass through, checked).

    Raises:
        APIError: 400 for a ``suffix`` on a model without a fill-in-the-middle template, a
            suffix with a token-id prompt, or a token id outside the vocabulary.
    """
    if isinstance(prompt, list):
        if suffix:
            raise bad_request("suffix needs a text prompt, not token ids", param="suffix")
        vocab = model.tokenizer.vocab_size
        for i, token in enumerate(prompt):
            if not 0 <= token < vocab:
                raise bad_request(
                    f"prompt[{i}] = {token} is not a token id of this model (0..{vocab - 1})", param="prompt"
                )
        return Prompt(ids=list(prompt))
    if suffix:
        template = model.completion_template
        if template is None:
            raise bad_request(
                f"model {model.name!r} has no fill-in-the-middle template, so suffix is not supported",
                param="suffix",
                code="fim_not_supported",
            )
        text = template.format(prompt, suffix)
    else:
        text = prompt
    return Prompt(ids=encode(model.tokenizer, text, add_special_tokens=True), text=prompt)


def encode(tokenizer: Tokenizer, text: str, *, add_special_tokens: bool) -> list[int]:
    """Token ids of a prompt: special-token texts (``<|im_start|>``, FIM markers) become
    their ids, unlike :meth:`Tokenizer.encode`, which keeps answers' text literal."""
    ids: list[int] = tokenizer.hf(text, add_special_tokens=add_special_tokens)["input_ids"]
    return ids


def thinking_kwargs(model: LoadedModel, given: dict[str, Any] | None) -> dict[str, Any] | None:
    """``given`` with the family's thinking switch under its own key when the request
    spelt it the other common way (``thinking`` for ``enable_thinking`` and back)."""
    if not given:
        return given
    switch = model.family.switch
    if switch is None or switch.kwarg in given:
        return given
    alias = _SWITCH_ALIASES.get(switch.kwarg)
    if alias is not None and alias in given:
        return {**given, switch.kwarg: given[alias]}
    return given
