"""Picking each row's next token: :func:`sample`.

Every row has its own temperature, top-k, top-p and random generator, so a request's
tokens depend on its own logits and seed only, never on who else is in the batch.
Nothing sorts the whole vocabulary: top-k and top-p work on ``torch.topk`` candidates
(transformers' processors sort all 49k-129k logits per row, 17-21 ms a step at batch 8
here; ``topk`` takes about 0.4 ms). Top-p takes the first :data:`TOP_P_CANDIDATES`
candidates and widens to the whole vocabulary only for a row whose candidates hold less
than ``top_p`` of the mass, so it stays exact.

``min_p`` rows have their logits below the threshold set to ``-inf`` first (in place,
only those rows), then take the same paths. ``logit_bias``, the penalties and
log-probabilities come before sampling (:mod:`~thinkstruct.engine.sampling.logit_adjustments`,
:mod:`~thinkstruct.engine.sampling.logprobs`); rows that use none of these options cost nothing
more than before.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from thinkstruct.engine.kernels.cpu_kernels import cpu_kernels
from thinkstruct.engine.request import SamplingParams

#: Candidates top-p looks at before widening to the full vocabulary.
TOP_P_CANDIDATES = 512


def new_generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed`` (any int; reduced to 64 bits)."""
    g = torch.Generator()
    g.manual_seed(seed & 0xFFFF_FFFF_FFFF_FFFF)
    return g


def sample(
    logits: torch.Tensor, params: Sequence[SamplingParams], generators: Sequence[torch.Generator]
) -> list[int]:
    """One token id per row of float32 ``logits [rows, vocab]`` (masked entries ``-inf``).

    Greedy rows and rows drawn from the whole softmax take one call of the compiled
    kernels (:meth:`~thinkstruct.engine.kernels.cpu_kernels.CpuKernels.sample`) where they build,
    otherwise batched torch operations; top-k / top-p rows work on ``torch.topk``
    candidates. Only the draw itself is per row (it needs the row's generator).

    Rows with ``min_p`` are pruned in place first (:func:`apply_min_p`; applying it
    again changes nothing).

    Raises:
        ValueError: a row has no allowed token (every logit ``-inf``); its index is in the
            message as ``row N``.
    """
    pruned = [i for i, p in enumerate(params) if p.min_p > 0 and not p.greedy]
    if pruned:
        apply_min_p(logits, pruned, params)
    # Rows drawn from the whole softmax, and rows drawn from top-k / top-p candidates;
    # the rest are greedy.
    plain = [i for i, p in enumerate(params) if not p.greedy and not _filters(p)]
    filtered = [i for i, p in enumerate(params) if not p.greedy and _filters(p)]
    kernels = cpu_kernels() if logits.dtype == torch.float32 and logits.stride(-1) == 1 else None
    if kernels is None:
        return _sample_with_torch(logits, params, generators, plain, filtered)
    inverse = [0.0] * len(params)
    draws = [0.0] * len(params)
    for i in plain:
        inverse[i], draws[i] = 1.0 / params[i].temperature, _uniform(generators[i])
    out = kernels.sample(logits, inverse, draws)
    if -1 in out:
        raise ValueError(f"row {out.index(-1)}: no token is allowed")
    _sample_filtered(logits, params, generators, filtered, out)
    return out


def apply_min_p(logits: torch.Tensor, rows: list[int], params: Sequence[SamplingParams]) -> None:
    """Set to ``-inf``, in place, the logits of ``rows`` whose probability at the row's
    temperature is below ``min_p`` times the most likely token's: ``p_i < min_p * p_max``
    is ``(l_i - l_max) / T < ln(min_p)``, so no softmax is needed."""
    whole = rows == list(range(logits.shape[0]))  # every row in order: in place, no copy
    selected = logits if whole else logits[rows]
    best = selected.max(dim=-1, keepdim=True).values
    scale = torch.tensor(
        [params[i].temperature * math.log(params[i].min_p) for i in rows], dtype=logits.dtype
    )
    selected.masked_fill_(selected < best + scale[:, None], -math.inf)
    if not whole:
        logits[rows] = selected


def _filters(p: SamplingParams) -> bool:
    return bool(p.top_k) or p.top_p < 1.0


def _uniform(generator: torch.Generator) -> float:
    return float(torch.rand(1, generator=generator, dtype=torch.float32))


def _sample_with_torch(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator],
    plain: list[int],
    filtered: list[int],
) -> list[int]:
    """:func:`sample` in torch operations (where the compiled kernels do not run)."""
    best = logits.max(dim=-1)
    if bool(torch.isneginf(best.values).any()):
        dead = int(torch.nonzero(torch.isneginf(best.values))[0, 0])
        raise ValueError(f"row {dead}: no token is allowed")
    out: list[int] = best.indices.tolist()
    if plain:
        temperatures = torch.tensor([params[i].temperature for i in plain], dtype=logits.dtype)
        probs = torch.softmax(logits[plain] / temperatures[:, None], dim=-1)
        for i, token in zip(plain, _inverse_cdf(probs, [generators[i] for i in plain]), strict=True):
            out[i] = token
    _sample_filtered(logits, params, generators, filtered, out)
    return out


def _sample_filtered(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator],
    filtered: list[int],
    out: list[int],
) -> None:
    """Draw the top-k / top-p rows ``filtered`` into ``out``."""
    if not filtered:
        return
    temperatures = torch.tensor([params[i].temperature for i in filtered], dtype=logits.dtype)
    rows = logits[filtered] / temperatures[:, None]
    k = min(max(params[i].top_k or TOP_P_CANDIDATES for i in filtered), rows.shape[1])
    values, indices = torch.topk(rows, k, dim=-1)
    totals = torch.logsumexp(rows, dim=-1)
    for row, i in enumerate(filtered):
        out[i] = _draw_filtered(rows[row], values[row], indices[row], totals[row], params[i], generators[i])


def _draw_filtered(
    scaled: torch.Tensor,
    values: torch.Tensor,
    indices: torch.Tensor,
    total: torch.Tensor,
    p: SamplingParams,
    generator: torch.Generator,
) -> int:
    """Draw from a row's top-k / top-p candidates (``values`` sorted descending;
    ``total`` is the log-sum-exp of the whole row)."""
    vocab = scaled.shape[0]
    k = min(p.top_k or TOP_P_CANDIDATES, vocab)
    values, indices = values[:k], indices[:k]
    if p.top_p < 1.0:
        # Mass is measured in the distribution top-k leaves (all of it without top-k).
        if p.top_k:
            total = torch.logsumexp(values, 0)
        mass = torch.exp(values - total)
        if not p.top_k and k < vocab and float(mass.sum()) < p.top_p:
            values, indices = torch.sort(scaled, descending=True)
            mass = torch.exp(values - total)
        # Keep the smallest prefix whose mass reaches top_p (at least one token).
        cumulative = torch.cumsum(mass, 0)
        keep = int(torch.searchsorted(cumulative, torch.tensor(p.top_p, dtype=cumulative.dtype))) + 1
        keep = min(keep, values.shape[0])
        values, indices = values[:keep], indices[:keep]
    probs = torch.softmax(values, dim=-1)
    return int(indices[_inverse_cdf(probs[None], [generator])[0]])


def _inverse_cdf(probs: torch.Tensor, generators: Sequence[torch.Generator]) -> list[int]:
    """One draw per row of ``probs [rows, n]`` by inverting its cumulative sum with one
    uniform number from the row's generator (``torch.multinomial`` costs about 0.4 ms a
    row over 49k tokens; this is one batched cumsum and search).

    The search takes the first index whose cumulative mass exceeds the draw, so a token of
    probability zero (masked) is never picked.
    """
    cdf = torch.cumsum(probs, dim=-1)
    u = torch.cat([torch.rand(1, generator=g, dtype=cdf.dtype) for g in generators])
    target = (u * cdf[:, -1]).unsqueeze(1)
    picks = torch.searchsorted(cdf, target, right=True).squeeze(1)
    out = picks.tolist()
    n = probs.shape[1]
    for row, pick in enumerate(out):
        if pick >= n:  # the draw rounded up to the total: the last token with any mass
            out[row] = int(torch.nonzero(probs[row])[-1, 0])
    return out
