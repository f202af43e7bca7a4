"""The ``usage`` of an answer: the engine's per-choice counts summed the OpenAI way."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from thinkstruct.server.prompts import Prompt
from thinkstruct.server.protocol import CompletionTokensDetails, Usage

if TYPE_CHECKING:
    from thinkstruct.engine import Usage as EngineUsage


def total_usage(prompts: Sequence[Prompt], usages: Sequence[EngineUsage | None]) -> Usage:
    """Each distinct prompt counted once (``n`` choices share it), every choice's
    completion and reasoning tokens summed."""
    prompt_tokens = sum(len(p.ids) for p in prompts)
    completion = sum(u.completion_tokens for u in usages if u is not None)
    reasoning = sum(u.reasoning_tokens for u in usages if u is not None)
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion,
        total_tokens=prompt_tokens + completion,
        completion_tokens_details=CompletionTokensDetails(reasoning_tokens=reasoning),
    )
