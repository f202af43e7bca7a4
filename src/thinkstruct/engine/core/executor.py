"""The executor: runs the scheduler's plans on the model runner (:class:`Executor`).

It owns the runner (the model, its KV cache, the compiled kernels), the grammar bitmask,
the helper thread that fills masks while the forward pass runs, and the prefix cache of
finished requests' keys and values. Per pass it carries out the plan's prefix reuses,
feeds the plan's tokens, applies the grammar masks and each row's logit adjustments,
samples each row with its own generator, advances the grammar (the sampled token, then
the tokens it forces: jump-forward) and verifies speculative drafts.

What each row got comes back as plain data, a
:class:`~thinkstruct.engine.core.step.StepResult`: its positions, its pending tokens, its
draws, its error. The executor changes only what it keeps per request (the grammar
matcher, the random generator, the logit adjustments, the drafter), never a row's
positions, state or output: the scheduler and the engine apply the result. A failure in
one request's own path (its grammar, its sampling) is that row's error; the other rows
go on.
"""

from __future__ import annotations

import concurrent.futures
import functools
import itertools
import logging
import os
import time
from typing import TYPE_CHECKING

import torch

from thinkstruct.engine.core.scheduler import common_prefix
from thinkstruct.engine.core.step import Draw, RowOutput, StepResult
from thinkstruct.engine.kernels.cpu_kernels import cpu_kernels
from thinkstruct.engine.kv.prefix_cache import PrefixCache
from thinkstruct.engine.sampling.call_choice import draws_call, restrict_row
from thinkstruct.engine.sampling.logit_adjustments import adjust_logits
from thinkstruct.engine.sampling.logprobs import LogprobTable
from thinkstruct.engine.sampling.sampler import sample
from thinkstruct.engine.sampling.speculation import PassCosts, draft_lengths
from thinkstruct.grammar.runtime.bitmask import TokenBitmask, allowed_count, apply_bitmask_inplace
from thinkstruct.grammar.runtime.reasoning import ReasoningGrammar

if TYPE_CHECKING:
    from thinkstruct.engine.core.scheduler import DecodePlan, Layout, PrefillPlan, Reuse
    from thinkstruct.engine.core.sequence import Sequence
    from thinkstruct.engine.runners.runner import ModelRunner
    from thinkstruct.engine.sampling.logprobs import SampledLogprob
    from thinkstruct.engine.sampling.speculation import SpeculationConfig
    from thinkstruct.grammar.runtime.value_checks import CheckFailure

log = logging.getLogger("thinkstruct.engine")


#: Constrained rows from which a decoding step fills their masks on the mask thread during
#: the forward pass even where no core is left over (``masks_during_forward=None``): the
#: pass's threads take what the mask thread holds up as chunks of their phases, and the
#: masks no longer wait after it. Measured on two cores, SmolLM2, JSON answers over HTTP
#: (users.py's workload): 32 users +4-6 % tok/s, 8 users +2-3 %, 64 users even; 1 user
#: 4-17 % slower (a one-row pass is too short to hide a mask behind).
MASKS_DURING_FORWARD_ROWS = 8


def spare_core() -> bool:
    """Whether a core is left over beside the forward pass's threads (torch's), for the
    mask thread: on two cores with two torch threads a mask filled during the pass takes
    a core from it, and a parallel region waits for its slowest thread."""
    return (os.cpu_count() or 1) > torch.get_num_threads()


class _Row:
    """One row's progress through a pass: the executor's own account of it, returned as a
    :class:`~thinkstruct.engine.core.step.RowOutput`."""

    __slots__ = ("allowed", "cached", "draws", "error", "generated", "pending", "seq", "start", "unmet")

    def __init__(self, seq: Sequence, fed: int) -> None:
        self.seq = seq
        self.start = seq.cached
        #: Positions its slot holds after the pass so far (its fed tokens, kept drafts).
        self.cached = seq.cached + fed
        self.pending = seq.pending[fed:]
        #: Tokens generated so far (a stop token not counted), draws of this pass included.
        self.generated = seq.generated
        self.draws: list[Draw] = []
        self.error: str | None = None
        self.unmet: CheckFailure | None = None
        #: How many tokens the mask of its next draw allows (filled with the mask, when
        #: the request counts them).
        self.allowed = 0

    @property
    def position(self) -> int:
        """The position of its next token to sample."""
        return self.seq.prompt_tokens + self.generated

    def fail(self, error: str) -> None:
        """Its own path failed (the first error stands); it draws no more."""
        if self.error is None:
            self.error = error

    def output(self) -> RowOutput:
        return RowOutput(
            self.seq,
            computed=self.cached - self.start,
            pending=self.pending,
            draws=self.draws,
            error=self.error,
            unmet=self.unmet,
        )


class Executor:
    """Forward passes, masks, sampling and grammar advances for the engine thread.

    Args:
        runner: the model runner (its slots are the scheduler's).
        max_batch: the runner's slots (rows of the mask buffer).
        vocab_size: the tokenizer's vocabulary size (mask width).
        context_length: most positions a row may hold.
        stop_ids: tokens that end an output.
        prefix_cache_bytes: budget of the prefix cache (0 keeps nothing).
        speculation: n-gram drafts (``None``: off; only on a batch-invariant runner).
        masks_during_forward: fill the grammar masks on a helper thread while the
            forward pass runs (``False``: after it, on this thread); ``None``: where a core
            is left over (:func:`spare_core`) or the step has at least
            :data:`MASKS_DURING_FORWARD_ROWS` constrained rows.
    """

    def __init__(
        self,
        runner: ModelRunner,
        *,
        max_batch: int,
        vocab_size: int,
        context_length: int,
        stop_ids: frozenset[int],
        prefix_cache_bytes: int,
        speculation: SpeculationConfig | None,
        masks_during_forward: bool | None,
    ) -> None:
        self.runner = runner
        self.vocab_size = vocab_size
        self.context_length = context_length
        self.speculation = speculation
        #: Decoding steps' seconds by the positions they fed (speculation drafts by them;
        #: kept only where it drafts: on a batch-invariant runner).
        self.pass_costs = (
            PassCosts(speculation)
            if speculation is not None and speculation.measured_costs and runner.batch_invariant
            else None
        )
        #: The fewest constrained rows whose masks a decoding step fills on the mask thread
        #: during the pass (``None``: never).
        self.masks_during_from: int | None = (
            None
            if masks_during_forward is False
            else 1
            if masks_during_forward or spare_core()
            else MASKS_DURING_FORWARD_ROWS
        )
        self._stop_ids = stop_ids
        self._masks = TokenBitmask(max_batch, vocab_size)
        self._mask_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="thinkstruct-masks")
        self.prefix_cache = PrefixCache(max_bytes=prefix_cache_bytes)

    def close(self) -> None:
        self._mask_pool.shutdown(wait=False)

    # ---- KV --------------------------------------------------------------------------

    def cached_prefixes(self, rows: list[Sequence]) -> dict[Sequence, int]:
        """For each of ``rows`` (prompts about to start), how many of its prompt's first
        tokens the prefix cache holds (whole blocks, short of the prompt's last token:
        its logits give the first token; 0 for none): what the scheduler plans reuse with."""
        return {
            seq: self.prefix_cache.peek(seq.request.prompt_ids, limit=seq.prompt_tokens - 1) for seq in rows
        }

    def apply_layout(self, layout: Layout) -> None:
        """Carry out the scheduler's layout: the prefix cache keeps what the leaving rows'
        slots hold (before another row moves in), the moves are made, and slots
        ``layout.held...`` hold nothing (a paged runner gives their blocks back: a moved
        row's blocks are shared, not copied)."""
        runner = self.runner
        for leaving in layout.leaving:
            self.prefix_cache.insert(leaving.tokens, functools.partial(runner.read_kv, leaving.slot))
        for m in layout.moves:
            runner.copy_slot(m.src, m.dst, m.length)
        runner.release_slots(layout.held)

    def _reuse(self, reuses: list[Reuse]) -> tuple[int, int]:
        """Give each slot the prefix its reuse names (from another slot or the prefix
        cache); the positions given, and of those from the prefix cache."""
        given = from_cache = 0
        for reuse in reuses:
            if reuse.donor is None:
                stored = self.prefix_cache.match(reuse.prompt, limit=reuse.tokens)
                if stored.kv is None or stored.tokens != reuse.tokens:
                    raise RuntimeError(
                        f"the prefix cache holds {stored.tokens} of {reuse.tokens} planned positions"
                    )
                self.runner.write_kv(reuse.slot, 0, stored.kv)
                from_cache += reuse.tokens
            else:
                self.runner.copy_slot(reuse.donor, reuse.slot, reuse.tokens)
            given += reuse.tokens
        return given, from_cache

    # ---- passes ----------------------------------------------------------------------

    def prefill(self, plan: PrefillPlan) -> StepResult:
        """Carry out the plan's prefix reuses and feed its prompt chunks; the rows whose
        prompt is then complete sample their first token."""
        reused, from_cache = self._reuse(plan.reuses)
        seqs, chunks = plan.rows, plan.chunks
        logits = self.runner.forward(seqs[0].slot, chunks, [s.cached for s in seqs])
        rows = [_Row(seq, len(chunk)) for seq, chunk in zip(seqs, chunks, strict=True)]
        done = [i for i, row in enumerate(rows) if not row.pending]
        if done:
            joining = [rows[i] for i in done]
            logits = logits[done]
            constrained = [j for j, row in enumerate(joining) if row.seq.matcher is not None]
            if constrained:
                masks = self._masks.rows(len(joining))
                for j in constrained:
                    self._fill_one(joining[j], masks, j)
                live = [j for j in constrained if joining[j].error is None]
                if live:
                    self._choose_calls(joining, logits, masks, live)
                    _apply_rows(logits, masks, live)
            self._sample(joining, logits)
        return StepResult(
            rows=[row.output() for row in rows],
            prefill_tokens=sum(map(len, chunks)),
            reused_tokens=reused,
            cache_hit_tokens=from_cache,
        )

    def decode(self, plan: DecodePlan) -> StepResult:
        """One decoding pass over every decoding row, with the seconds spent in the
        forward pass and in waiting for / applying the masks after it."""
        seqs, feeds, ready = plan.rows, plan.feeds, plan.ready
        started = time.perf_counter()
        drafts = self._drafts(seqs, ready, feeds, plan.width)
        rows = [_Row(seq, len(fed)) for seq, fed in zip(seqs, feeds, strict=True)]
        masks = self._masks.rows(len(rows))
        constrained = [i for i in ready if seqs[i].matcher is not None]
        during_from = self.masks_during_from
        fill = (
            self._mask_pool.submit(self._fill_rows, rows, constrained, masks)
            if constrained and during_from is not None and len(constrained) >= during_from
            else None
        )
        tail = [1 + len(d) for d in drafts] if any(drafts) else None
        logits = self.runner.forward(
            0, [f + d for f, d in zip(feeds, drafts, strict=True)], [s.cached for s in seqs], tail=tail
        )
        forwarded = time.perf_counter()
        firsts: list[int] = []
        drafted = logits
        if tail is not None:
            # Each row's first logits (after its own tokens) come first; the rest verify its draft.
            firsts = [0, *itertools.accumulate(tail)][:-1]
            logits = logits[firsts]
        if constrained:
            if fill is not None:
                fill.result()
            else:
                self._fill_rows(rows, constrained, masks)
            live = [i for i in constrained if rows[i].error is None]
            if live:
                self._choose_calls(rows, logits, masks, live)
                _apply_rows(logits, masks, live)
        masked = time.perf_counter()
        if len(ready) == len(rows):
            self._sample(rows, logits)
        else:
            self._sample([rows[i] for i in ready], logits[ready])
        fed_drafts = kept = 0
        if tail is not None:
            fed_drafts, kept = self._verify_drafts(rows, drafts, drafted, firsts)
        if self.pass_costs is not None:
            positions = sum(map(len, feeds)) + sum(map(len, drafts))
            self.pass_costs.observe(positions, time.perf_counter() - started, rows=len(rows))
        return StepResult(
            rows=[row.output() for row in rows],
            draft_tokens=fed_drafts,
            accepted_draft_tokens=kept,
            forward_s=forwarded - started,
            mask_s=masked - forwarded,
        )

    # ---- speculation -----------------------------------------------------------------

    def _drafts(
        self, rows: list[Sequence], ready: list[int], feeds: list[list[int]], width: int
    ) -> list[list[int]]:
        """Each row's n-gram draft for this step (none where speculation does not pay or
        is off): within the step's positions, ``max_tokens`` and the context, through the
        grammar (cut where it refuses, its forced tokens in), cut where it pays most
        (:func:`~thinkstruct.engine.sampling.speculation.draft_lengths`)."""
        drafts: list[list[int]] = [[] for _ in rows]
        config = self.speculation
        if config is None or not self.runner.batch_invariant or len(rows) > config.max_batch:
            return drafts
        odds: list[list[float]] = []
        drafting: list[int] = []
        for i in ready:
            seq = rows[i]
            if seq.drafter is None:
                continue
            room = min(
                width - len(feeds[i]),
                seq.params.max_tokens - seq.generated - 1,
                self.context_length - seq.cached - len(feeds[i]) - 1,
            )
            try:
                draft = seq.drafter.propose(room, seq.matcher, self._stop_ids)
            except Exception:  # noqa: BLE001 - no draft then; the row decodes as usual
                draft = []
            if draft:
                drafts[i] = draft
                drafting.append(i)
                odds.append(seq.drafter.odds())
        if drafting:
            lengths = draft_lengths(
                odds, positions=sum(map(len, feeds)), rows=len(ready), config=config, costs=self.pass_costs
            )
            for i, length in zip(drafting, lengths, strict=True):
                del drafts[i][length:]
        return drafts

    def _verify_drafts(
        self, rows: list[_Row], drafts: list[list[int]], logits: torch.Tensor, firsts: list[int]
    ) -> tuple[int, int]:
        """Keep each row's draft tokens while they are what the row takes there; the draft
        tokens fed, and of those kept.

        Position ``p`` of a row's draft was fed after ``p`` draft tokens. The row samples
        there from the logits before it (one draw of its own generator, as without a
        draft) and its grammar adds the tokens it forces: while those tokens are the
        draft's next ones, their keys and values are already in the slot (keep them and
        sample after the last); from the first that differs on, the row feeds its tokens
        next step (the slot's positions past the kept ones are simply overwritten). A row
        that stops (a stop token, its grammar's end, an error) keeps nothing after it;
        one whose output side ends it (a stop string) is told apart only when the engine
        applies its draws, which drops those after the end."""
        at = {i: 0 for i, d in enumerate(drafts) if d}  # the draft position sampled next
        kept = dict.fromkeys(at, 0)
        active = list(at)
        while active:
            still = []
            for i in active:
                row, draft, p = rows[i], drafts[i], at[i]
                if row.error is not None:
                    continue
                n = common_prefix(row.pending, draft[p:], len(row.pending))
                if n == 0:
                    continue
                row.cached += n  # fed as draft tokens p .. p + n - 1
                row.pending = row.pending[n:]
                kept[i] += n
                at[i] = p + n
                if not row.pending:
                    still.append(i)
            if not still:
                break
            view = logits[[firsts[i] + at[i] for i in still]]
            constrained = [k for k, i in enumerate(still) if rows[i].seq.matcher is not None]
            if constrained:
                masks = self._masks.rows(len(still))
                for k in constrained:
                    self._fill_one(rows[still[k]], masks, k)
                live = [k for k in constrained if rows[still[k]].error is None]
                if live:
                    self._choose_calls([rows[i] for i in still], view, masks, live)
                    _apply_rows(view, masks, live)
            self._sample([rows[i] for i in still], view)
            active = [i for i in still if at[i] < len(drafts[i])]
        for i, n in kept.items():
            drafter = rows[i].seq.drafter
            if drafter is not None:
                drafter.record(len(drafts[i]), n)
        return sum(len(drafts[i]) for i in kept), sum(kept.values())

    # ---- masks -----------------------------------------------------------------------

    def _fill_rows(self, rows: list[_Row], indices: list[int], masks: torch.Tensor) -> None:
        for i in indices:
            self._fill_one(rows[i], masks, i)

    def _fill_one(self, row: _Row, masks: torch.Tensor, index: int) -> None:
        seq = row.seq
        try:
            seq.matcher.fill_bitmask(masks, index)  # type: ignore[union-attr]
            if seq.counts_allowed:
                row.allowed = allowed_count(masks[index], self.vocab_size)
        except Exception as e:  # noqa: BLE001 - this request fails with the message, the batch goes on
            row.fail(f"the grammar failed to compute its mask: {e}")

    def _choose_calls(
        self, rows: list[_Row], logits: torch.Tensor, masks: torch.Tensor, live: list[int]
    ) -> None:
        """Where a row's answer starts and may be a call or another answer, let the model's
        own odds of opening a call choose, and narrow its mask row to the choice
        (:mod:`~thinkstruct.engine.sampling.call_choice`); ``rows[k]``, ``logits[k]`` and
        ``masks[k]`` are one row's, before the masks are applied."""
        for k in live:
            row = rows[k]
            seq = row.seq
            opening = seq.call_opening
            if opening is None or seq.matcher is None or not seq.matcher.at_answer_start():
                continue
            call = draws_call(
                logits[k], opening, params=seq.params, generator=seq.generator, adjustments=seq.adjustments
            )
            restrict_row(masks, k, opening, call=call)
            if seq.counts_allowed:
                row.allowed = allowed_count(masks[k], self.vocab_size)

    # ---- sampling and the grammar ----------------------------------------------------

    def _sample(self, rows: list[_Row], logits: torch.Tensor) -> None:
        """Sample one token per live row and feed it (and the tokens it forces) to its
        grammar: a draw of the row."""
        live = [i for i, row in enumerate(rows) if row.error is None]
        if not live:
            return
        seqs = [rows[i].seq for i in live]
        params = [s.params for s in seqs]
        gens = [s.generator for s in seqs]
        view = logits if len(live) == logits.shape[0] else logits[live]
        for j, i in enumerate(live):
            row = rows[i]
            banned = row.seq.bans.get(row.position) if row.seq.bans else None
            if banned:  # a value that started here failed its check: draw another token
                view[j, list(banned)] = float("-inf")
        # Only rows that ask pay for bias, penalties and log-probabilities.
        if any(p.adjusts_logits for p in params):
            adjust_logits(view, params, [s.adjustments for s in seqs])
        table = LogprobTable(view, params) if any(p.logprobs is not None for p in params) else None
        # A failed batch may have drawn for some rows already; each row draws again from
        # where it was, so its tokens do not depend on another row's fault (~1 us a row).
        states = [g.get_state() for g in gens]
        tokens: list[int | None]
        try:
            tokens = list(sample(view, params, gens))
        except Exception:  # noqa: BLE001 - find the row(s) at fault, sample the rest one by one
            tokens = []
            for j, (seq, generator, state) in enumerate(zip(seqs, gens, states, strict=True)):
                generator.set_state(state)
                try:
                    tokens.append(sample(view[j : j + 1], [seq.params], [generator])[0])
                except ValueError:  # every token masked
                    tokens.append(-1)
                except Exception as e:  # this request's sampling failed; the batch goes on
                    log.exception("sampling request %s failed", seq.request.request_id)
                    rows[live[j]].fail(f"internal error sampling this request: {e}")
                    tokens.append(None)
        for j, (i, token) in enumerate(zip(live, tokens, strict=True)):
            row = rows[i]
            if token is None:
                continue
            if token in self._stop_ids:
                token = _in_place_of_stop(row.seq, token)
            try:
                self._advance(row, token, None if table is None or token < 0 else table.entry(j, token))
            except Exception as e:  # this request's own path failed
                log.exception("request %s failed", row.seq.request.request_id)
                row.fail(f"internal error in this request: {e}")

    def _advance(self, row: _Row, token: int, logprob: SampledLogprob | None) -> None:
        seq = row.seq
        if token < 0:
            failure = seq.check_failure if seq.bans.get(row.position) else None
            why = "the grammar allows no next token"
            if failure is not None:
                why = f"the answer could not meet {failure.describe()}: every token allowed here was tried"
                row.unmet = failure
            row.fail(why)
            return
        matcher = seq.matcher
        forced: list[int] = []
        stop = False
        if matcher is not None:
            if not matcher.accept_token(token):
                row.fail(f"the grammar rejected the sampled token {token}")
                return
            # A stop token ends the output (one inside a thought whose grammar turns it
            # into the thought's end never gets here: see _in_place_of_stop).
            if matcher.is_terminated() or token in self._stop_ids:
                stop = True
            else:
                # Forced tokens count against max_tokens and must fit in the context.
                budget = min(seq.params.max_tokens - row.generated - 1, self.context_length - row.cached - 1)
                forced = matcher.jump_forward()[:budget] if budget > 0 else []
                if forced:
                    accepted = matcher.accept_tokens(forced)
                    forced = forced[:accepted]
            allowed = row.allowed
        else:
            stop = token in self._stop_ids
            allowed = self.vocab_size
        new = [token, *forced]
        if seq.drafter is not None:
            seq.drafter.extend(new, forced=len(forced))
        if seq.adjustments is not None:
            seq.adjustments.add(new)
        row.pending = [] if stop else new
        row.generated += sum(1 for t in new if t not in self._stop_ids)
        row.draws.append(Draw(tokens=new, forced=len(forced), logprob=logprob, allowed=allowed, stop=stop))


def _in_place_of_stop(seq: Sequence, token: int) -> int:
    """The token ``seq`` takes for the stop token ``token`` it sampled: the first token of
    its end tag where its grammar turns a stop inside the thought into the thought's end
    (the rest of the tag is forced after it), else ``token``."""
    matcher = seq.matcher
    if isinstance(matcher, ReasoningGrammar) and matcher.ends_thought(token):
        return matcher.close_thought()[0]
    return token


def _apply_rows(logits: torch.Tensor, masks: torch.Tensor, rows: list[int]) -> None:
    """Apply bitmask rows ``rows`` to the same rows of ``logits`` in place (one call of
    the compiled kernels where they build and the logits are float32 rows)."""
    kernels = cpu_kernels()
    if (
        kernels is not None
        and logits.dtype == torch.float32
        and logits.stride(-1) == 1
        and masks.stride(-1) == 1
    ):
        kernels.apply_bitmask(logits, masks, rows)
        return
    if len(rows) == logits.shape[0]:
        apply_bitmask_inplace(logits, masks[: len(rows)])
    else:
        apply_bitmask_inplace(logits, masks[rows], indices=rows)
