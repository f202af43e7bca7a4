"""Text-level protocol of model families.

- Reasoning: :class:`ReasoningParser` splits output into reasoning and content, whole
  (``parse``) or streamed (``feed``/``finish``), for each family in the registry
  (:func:`reasoning_families`); :func:`reasoning_enabled` decides whether a request reasons.
- Code completion: :func:`fim_prompt` builds fill-in-the-middle prompts from
  :class:`CompletionTemplate` entries.
- Chat: :func:`render_chat` renders messages with the model's (or the family's built-in)
  jinja2 chat template and returns a :class:`ChatPrompt` carrying the reasoning decision.

This layer may use the tokenizer; it never imports the grammar layer or anything above.
"""

# The formats' parsers, which ReasoningParser(family) picks from, load with the package:
# whichever of its modules a user imports first, every format is there.
from thinkstruct.parsers import harmony_parser, tag_parser  # noqa: F401
from thinkstruct.parsers.chat_template import ChatPrompt, ChatTemplate, chat_template_for, render_chat
from thinkstruct.parsers.errors import (
    ChatTemplateError,
    DuplicateName,
    InvalidChatRequest,
    InvalidTemplateSpec,
    UnknownName,
)
from thinkstruct.parsers.fim import (
    CompletionTemplate,
    FimPosition,
    completion_templates,
    fim_prompt,
    get_completion_template,
    load_completion_templates,
    register_completion_template,
    unregister_completion_template,
)
from thinkstruct.parsers.reasoning_families import (
    ReasoningFamily,
    ReasoningFormat,
    SwitchStyle,
    ThinkingSwitch,
    get_reasoning_family,
    reasoning_enabled,
    reasoning_families,
    register_reasoning_family,
    unregister_reasoning_family,
)
from thinkstruct.parsers.reasoning_parser import ParseResult, ReasoningParser

__all__ = [
    "ChatPrompt",
    "ChatTemplate",
    "ChatTemplateError",
    "CompletionTemplate",
    "DuplicateName",
    "FimPosition",
    "InvalidChatRequest",
    "InvalidTemplateSpec",
    "ParseResult",
    "ReasoningFamily",
    "ReasoningFormat",
    "ReasoningParser",
    "SwitchStyle",
    "ThinkingSwitch",
    "UnknownName",
    "chat_template_for",
    "completion_templates",
    "fim_prompt",
    "get_completion_template",
    "get_reasoning_family",
    "load_completion_templates",
    "reasoning_enabled",
    "reasoning_families",
    "register_completion_template",
    "register_reasoning_family",
    "render_chat",
    "unregister_completion_template",
    "unregister_reasoning_family",
]
