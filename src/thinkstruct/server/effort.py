"""Reasoning effort: ``reasoning_effort`` (chat), ``reasoning.effort`` (responses).

An effort level says whether a request thinks and how much of its tokens the thought may
take:

- ``none``, ``minimal``: thinking off, through the family's thinking switch. A family that
  always thinks (no switch) answers ``none`` with a 400 saying so; ``minimal`` there gets
  the smallest thought instead (its end is forced at once: a budget of 0).
- ``low``, ``medium``, ``high``: thinking on, with a thinking budget of
  :data:`EFFORT_SHARES` of ``max_tokens`` (the forced end tag included). Without
  ``max_tokens`` the share is of the room the context leaves after the prompt, and the
  answer keeps the server's ``default_max_tokens`` after it.

An explicit ``max_reasoning_tokens`` wins over the level's budget. The switch's value goes
into ``chat_template_kwargs`` (``enable_thinking``, ``thinking``, or the level itself for
a family whose switch is an effort level), so the template, the grammar and the parser
agree; a request that sets the switch there too must agree with its effort.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from thinkstruct.engine.core.thinking_budget import default_thinking_budget
from thinkstruct.parsers.reasoning_families import ReasoningFamily, SwitchStyle
from thinkstruct.server.errors import bad_request

Effort = Literal["none", "minimal", "low", "medium", "high"]

#: The levels, in order.
EFFORTS: tuple[str, ...] = get_args(Effort)

#: The share of ``max_tokens`` (or of the room the context leaves) the thought may take.
EFFORT_SHARES: Mapping[str, float] = {"low": 0.25, "medium": 0.5, "high": 0.75}

#: Levels that turn thinking off.
OFF: frozenset[str] = frozenset(EFFORTS) - frozenset(EFFORT_SHARES)


@dataclass(frozen=True, slots=True)
class EffortPlan:
    """What an effort level means for one request.

    Attributes:
        chat_template_kwargs: the request's kwargs with the family's switch set.
        share: the thought's share of the token budget (``None``: no effort-given budget).
        closed: the family cannot turn thinking off, so the thought is closed at once.
    """

    chat_template_kwargs: dict[str, Any] | None
    share: float | None
    closed: bool = False


def effort_plan(
    effort: Effort | None,
    family: ReasoningFamily,
    chat_template_kwargs: Mapping[str, Any] | None,
    *,
    param: str,
) -> EffortPlan:
    """The switch and share of ``effort`` for a ``family`` model.

    Raises:
        APIError: 400 naming ``param`` for ``none`` on a family that always thinks, or an
            effort that disagrees with the switch set in ``chat_template_kwargs``.
    """
    kwargs = dict(chat_template_kwargs) if chat_template_kwargs is not None else None
    if effort is None:
        return EffortPlan(chat_template_kwargs=kwargs, share=None)
    on = effort not in OFF
    switch = family.switch
    if switch is None:
        if effort == "none":
            raise bad_request(
                f"{param} 'none' cannot turn thinking off: this model's family ({family.name}) always thinks; "
                "use 'minimal' for the shortest thought",
                param=param,
                code="unsupported_reasoning_effort",
            )
        return EffortPlan(chat_template_kwargs=kwargs, share=EFFORT_SHARES.get(effort), closed=not on)
    value: object = effort if switch.style is SwitchStyle.EFFORT else on
    given = (kwargs or {}).get(switch.kwarg)
    if given is not None and given != value and switch.is_on(given) != on:
        raise bad_request(
            f"{param} {effort!r} turns thinking {'on' if on else 'off'}, but chat_template_kwargs"
            f"[{switch.kwarg!r}] = {given!r} turns it {'off' if on else 'on'}; give one",
            param=param,
            code="conflicting_reasoning_effort",
        )
    kwargs = {**(kwargs or {}), switch.kwarg: given if given is not None else value}
    return EffortPlan(chat_template_kwargs=kwargs, share=EFFORT_SHARES.get(effort))


def effort_budget(plan: EffortPlan, *, base: int, tokenizer: Any, end_tag: str) -> int | None:
    """The thinking budget an effort level gives: its share of ``base`` tokens (the
    request's ``max_tokens``, or the room the context leaves), end tag included
    (``None``: the level gives none)."""
    if plan.closed:
        return 0
    if plan.share is None:
        return None
    return default_thinking_budget(base, share=plan.share, tokenizer=tokenizer, end_tag=end_tag)


def effort_max_tokens(plan: EffortPlan, *, room: int, default: int) -> int | None:
    """``max_tokens`` of an effort request that gives none: the level's share of the
    room left in the context for the thought, plus ``default`` for the answer, within the
    room (``None``: the level does not change the default)."""
    if plan.share is None:
        return None
    return min(room, math.floor(plan.share * room) + default)
