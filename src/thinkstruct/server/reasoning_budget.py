"""How a chat request's ``max_tokens`` splits between its thought and its answer.

A request that thinks and sets no ``max_reasoning_tokens`` gets the server's
``reasoning_share`` of its ``max_tokens`` for the whole thought
(:func:`~thinkstruct.engine.core.thinking_budget.default_thinking_budget`), so the answer always has
room; an explicit budget wins. When ``max_tokens`` ends a request anyway,
:func:`length_part` says which part it cut.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from thinkstruct.engine.core.thinking_budget import default_thinking_budget
from thinkstruct.server.protocol import LengthPart

if TYPE_CHECKING:
    from thinkstruct.engine import Engine
    from thinkstruct.engine import Usage as EngineUsage


def thinking_budget(
    engine: Engine, *, requested: int | None, reasoning: bool, max_tokens: int, share: float
) -> int | None:
    """The request's ``max_reasoning_tokens``: ``None`` when it does not reason, else the
    one it asked for, else the default share of ``max_tokens`` (the value the request ends
    up with, the server's default included)."""
    if not reasoning:
        return None
    if requested is not None:
        return requested
    return default_thinking_budget(
        max_tokens, share=share, tokenizer=engine.tokenizer, end_tag=engine.model.family.think_end
    )


def length_part(
    finish_reason: str | None, usage: EngineUsage | None, *, reasoning: bool, split: bool
) -> LengthPart | None:
    """Which part ``max_tokens`` (or the context) cut, for a choice that ended ``length``.

    ``"reasoning"`` when every generated token was part of the thought (the answer never
    started), ``"answer"`` otherwise; ``None`` for other finish reasons, and when the
    thought is not told apart from the answer (``split`` false: ``separate_reasoning:
    false`` passes the raw output through uncounted).
    """
    if finish_reason != "length" or usage is None:
        return None
    if not reasoning:
        return "answer"
    if not split:
        return None
    return "reasoning" if usage.reasoning_tokens >= usage.completion_tokens else "answer"
