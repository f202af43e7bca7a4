"""A call or another answer, chosen the way the model would choose in free text.

Under ``tool_choice: "auto"`` beside a JSON answer format the answer's grammar holds
either the calls (opened by the syntax's trigger, ``<tool_call>``) or the JSON answer. A
masked draw at the answer's first token would weigh only the tokens that open one or the
other (``<`` against ``{``), so a model that would rather answer in words, and never
thought of a ``{``, calls a tool: the grammar's spelling of the answer, not the model,
would decide. Here the model's own probability of opening a call, over its whole
vocabulary before the mask (after the request's bias and penalties), decides: the call with that probability, else the answer
(whatever else the model would have written, a stop among it, counts for the answer, as
it does in free text). The row's mask then keeps only the call's opening tokens, or
drops them, and the token is drawn from the row as usual.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from thinkstruct.engine.sampling.logit_adjustments import adjust_logits

if TYPE_CHECKING:
    from thinkstruct.engine.request import SamplingParams
    from thinkstruct.engine.sampling.logit_adjustments import LogitAdjustments
    from thinkstruct.grammar.runtime.opening_tokens import OpeningTokens


def draws_call(
    logits: torch.Tensor,
    opening: OpeningTokens,
    *,
    params: SamplingParams,
    generator: torch.Generator,
    adjustments: LogitAdjustments | None = None,
) -> bool:
    """Whether a row opens a call: for a greedy row, whether its most likely token is an
    opening token; otherwise with the probability the model gives the opening tokens at
    the row's temperature (over the whole vocabulary: before the grammar's mask, top-k
    and top-p; after the row's bias and penalties), one uniform draw of the row's
    generator.

    Args:
        logits: the row's logits (``[vocab]``, any float dtype), left unchanged.
        opening: the tokens that open a call.
        params: the row's sampling parameters.
        generator: the row's random generator.
        adjustments: the row's bias and penalty state, where ``params`` adjust logits.
    """
    if params.adjusts_logits:
        shaped = logits.float()[None].clone()
        adjust_logits(shaped, [params], [adjustments])
        logits = shaped[0]
    if params.greedy:
        return bool(torch.isin(logits.argmax(), opening.ids))
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    chance = float(probs[opening.ids].sum())
    return float(torch.rand(1, generator=generator, dtype=torch.float32)) < chance


def restrict_row(masks: torch.Tensor, row: int, opening: OpeningTokens, *, call: bool) -> None:
    """Keep in ``masks[row]`` only the opening tokens (``call``) or all but them, unless
    that would leave the row without a token (the grammar then decides alone)."""
    current = masks[row]
    kept = current & opening.row if call else current & ~opening.row
    if bool(kept.any()):
        current.copy_(kept)
