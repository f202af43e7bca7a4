"""thinkstruct's reasoning families as vLLM reasoning parsers.

Each family of :func:`thinkstruct.parsers.reasoning_families` is registered with vLLM's
``ReasoningParserManager`` as ``thinkstruct-<family>`` (vLLM's own parser names are left
alone: several are the same words for other rules). A parser instance is per request, as
vLLM builds it: the request's ``chat_template_kwargs`` decide whether it reasons (the
family's switch, :meth:`~thinkstruct.parsers.ReasoningFamily.enabled`), thinkstruct's
:class:`~thinkstruct.parsers.ReasoningParser` splits the text (the same rules as
``thinkstruct serve``), and :class:`~.thought_bounds.ThoughtBounds` answers vLLM's
questions about token ids, for tags of one token or several.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from vllm.entrypoints.generate.base.protocol import DeltaMessage
from vllm.reasoning import ReasoningParser, ReasoningParserManager

from thinkstruct.integrations.vllm.thought_bounds import ThoughtBounds
from thinkstruct.parsers import InvalidChatRequest, ReasoningFamily, reasoning_families
from thinkstruct.parsers import ReasoningParser as TextParser

#: The prefix of every parser name thinkstruct registers.
PREFIX = "thinkstruct-"


def parser_name(family: str) -> str:
    """The vLLM reasoning-parser name of a family (``thinkstruct-smollm2-think``)."""
    return PREFIX + family


class FamilyReasoningParser(ReasoningParser):
    """A vLLM reasoning parser for one thinkstruct family (:attr:`family`, set on each
    registered subclass)."""

    family: ReasoningFamily

    def __init__(self, tokenizer: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(tokenizer, *args, **kwargs)
        template_kwargs = kwargs.get("chat_template_kwargs") or {}
        try:
            enabled = self.family.enabled(template_kwargs)
        except InvalidChatRequest:
            # The renderer has already refused such a request; a parser never does.
            enabled = self.family.switch.default if self.family.switch else True
        self.enabled = enabled
        self._text = TextParser(self.family, enabled=enabled)
        self.bounds = ThoughtBounds(self.family, self._decode, enabled=enabled)

    def _decode(self, ids: Sequence[int]) -> str:
        return str(self.model_tokenizer.decode(list(ids), skip_special_tokens=False))

    @property
    def reasoning_start_str(self) -> str:
        return self.family.think_start

    @property
    def reasoning_end_str(self) -> str:
        return self.family.think_end

    def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
        return self.bounds.has_ended(input_ids)

    def is_reasoning_end_streaming(self, input_ids: Sequence[int], delta_ids: Iterable[int]) -> bool:
        return self.bounds.ends_within(input_ids, len(list(delta_ids)))

    def extract_content_ids(self, input_ids: list[int]) -> list[int]:
        end = self.bounds.end_index(input_ids)
        return [] if end is None else input_ids[end:]

    def count_reasoning_tokens(self, token_ids: Sequence[int]) -> int:
        if not self.enabled:
            return 0
        end = self.bounds.end_index(token_ids)
        return len(token_ids) if end is None else end

    def extract_reasoning(self, model_output: str, request: Any) -> tuple[str | None, str | None]:
        reasoning, content = self._text.parse(model_output)
        return reasoning or None, content or None

    def extract_reasoning_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
    ) -> DeltaMessage | None:
        reasoning, content = self._text.feed(delta_text)
        if not reasoning and not content:
            return None
        return DeltaMessage(reasoning=reasoning or None, content=content or None)


def parser_class(family: ReasoningFamily) -> type[FamilyReasoningParser]:
    """A :class:`FamilyReasoningParser` subclass bound to ``family``."""
    words = re.sub(r"[^0-9a-zA-Z]+", " ", family.name).title().replace(" ", "")
    return type(f"Thinkstruct{words}ReasoningParser", (FamilyReasoningParser,), {"family": family})


def register_families() -> list[str]:
    """Register every family as a vLLM reasoning parser (again, if called again: vLLM's
    registry replaces a name); returns the names."""
    names = []
    for family in reasoning_families().values():
        name = parser_name(family.name)
        ReasoningParserManager.register_module(name=name, force=True, module=parser_class(family))
        names.append(name)
    return names


__all__ = ["PREFIX", "FamilyReasoningParser", "parser_class", "parser_name", "register_families"]
