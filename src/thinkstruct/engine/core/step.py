"""What a pass did, as plain data: :class:`StepResult`, the executor's answer to a plan.

The scheduler plans a pass (:class:`~thinkstruct.engine.core.scheduler.PrefillPlan`,
:class:`~thinkstruct.engine.core.scheduler.DecodePlan`); the executor runs it and returns
a :class:`StepResult` without touching what the scheduler or the output side own; the
scheduler applies each row's positions and pending tokens
(:meth:`~thinkstruct.engine.core.scheduler.Scheduler.update`), then the engine hands each
row's draws to its output processor, which may end the row (a stop string,
``max_tokens``, a checked value out of tries) or take a failed value back.

A row ended by its output side (a stop string) may still have draws after the one that
ended it, when a speculative draft went past it: they are dropped, as the tokens after a
stop string are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from thinkstruct.engine.core.sequence import Sequence
    from thinkstruct.engine.sampling.logprobs import SampledLogprob
    from thinkstruct.grammar.runtime.value_checks import CheckFailure


@dataclass(frozen=True, slots=True)
class Draw:
    """The tokens one draw of a row settled: the sampled token, then those its grammar
    forced after it (jump-forward).

    Attributes:
        tokens: the sampled token first, then the forced ones; a stop token only last.
        forced: how many of ``tokens`` (the last ones) were forced.
        logprob: the sampled token's log-probability and alternatives (a request that
            asks for them).
        allowed: how many tokens the sampled one's mask allowed (the vocabulary where
            nothing constrained it).
        stop: the output ends with it (a stop token, or a grammar that terminated).
    """

    tokens: list[int]
    forced: int
    logprob: SampledLogprob | None
    allowed: int
    stop: bool


@dataclass(frozen=True, slots=True)
class RowOutput:
    """What one pass did for one row.

    Attributes:
        seq: the row.
        computed: positions the pass added to its slot (its fed tokens, and the draft
            tokens it kept).
        pending: what it feeds at its next pass: the rest of its prompt, forced tokens
            left over, or its last draw's tokens its slot does not hold yet (none after a
            stop).
        draws: its draws, in order (none for a prompt not complete yet, or a row whose
            forced tokens did not all fit the pass).
        error: its own path failed (its grammar's mask or advance, its sampling): it
            ends with this error, after ``draws``.
        unmet: with ``error``, the checked keyword it could not meet (every token its
            grammar allows at its position was tried for a failed value).
    """

    seq: Sequence
    computed: int
    pending: list[int]
    draws: list[Draw]
    error: str | None = None
    unmet: CheckFailure | None = None


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one pass did.

    Attributes:
        rows: every row of the plan, in its order.
        prefill_tokens: prompt tokens computed.
        reused_tokens: prompt tokens given to slots from another slot or the prefix cache
            instead of computed (the plan's reuses).
        cache_hit_tokens: of those, from the prefix cache.
        draft_tokens: speculative draft tokens fed, and of those kept
            (``accepted_draft_tokens``).
        accepted_draft_tokens: see ``draft_tokens``.
        forward_s: seconds in the forward pass.
        mask_s: seconds waiting for and applying grammar masks after it.
    """

    rows: list[RowOutput]
    prefill_tokens: int = 0
    reused_tokens: int = 0
    cache_hit_tokens: int = 0
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    forward_s: float = 0.0
    mask_s: float = 0.0
