"""What an answer reports about itself: OpenAI's ``usage`` (the engine's per-choice counts
summed the OpenAI way) and thinkstruct's ``thinkstruct`` extension (backend, ignored
keywords, compile wait, jump-forward tokens, time to first token, thinking budget)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from thinkstruct.server.prompts import Prompt
from thinkstruct.server.protocol import CompletionTokensDetails, GenerationInfo, PromptTokensDetails, Usage

if TYPE_CHECKING:
    from thinkstruct.engine import Usage as EngineUsage
    from thinkstruct.grammar.base import CompiledGrammar


def total_usage(prompts: Sequence[Prompt], usages: Sequence[EngineUsage | None]) -> Usage:
    """Each distinct prompt counted once (``n`` choices share it), every choice's
    completion and reasoning tokens summed; cached prompt tokens: the most any choice
    copied from another request holding the same prefix (never more than the prompt)."""
    prompt_tokens = sum(len(p.ids) for p in prompts)
    completion = sum(u.completion_tokens for u in usages if u is not None)
    reasoning = sum(u.reasoning_tokens for u in usages if u is not None)
    cached = max((u.cached_tokens for u in usages if u is not None), default=0)
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion,
        total_tokens=prompt_tokens + completion,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=min(cached, prompt_tokens)),
        completion_tokens_details=CompletionTokensDetails(reasoning_tokens=reasoning),
    )


def generation_info(
    grammar: CompiledGrammar | None,
    compile_seconds: float | None,
    usages: Sequence[EngineUsage | None],
    *,
    max_reasoning_tokens: int | None = None,
) -> GenerationInfo:
    """The ``thinkstruct`` extension object of an answer (``max_reasoning_tokens``: the
    thinking budget its choices had, ``None`` when they did not think)."""
    first = next((u.time_to_first_token_s for u in usages if u is not None), None)
    return GenerationInfo(
        backend=None if grammar is None else grammar.backend,
        ignored_keywords=[] if grammar is None else list(grammar.ignored_keywords),
        compile_seconds=compile_seconds,
        jump_forward_tokens=sum(u.jump_forward_tokens for u in usages if u is not None),
        check_rollbacks=sum(u.check_rollbacks for u in usages if u is not None),
        resampled_tokens=sum(u.resampled_tokens for u in usages if u is not None),
        time_to_first_token_s=first,
        allowed_tokens=_allowed_tokens(usages),
        max_reasoning_tokens=max_reasoning_tokens,
    )


def _allowed_tokens(usages: Sequence[EngineUsage | None]) -> list[list[int]] | None:
    """Per choice, the allowed-token counts, when the engine recorded them."""
    if not any(u is not None and u.allowed_tokens is not None for u in usages):
        return None
    return [list(u.allowed_tokens or ()) if u is not None else [] for u in usages]
