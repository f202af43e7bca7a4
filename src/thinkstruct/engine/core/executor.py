"""The executor: runs the scheduler's plans on the model runner (:class:`Executor`).

It owns the runner (the model, its KV cache, the compiled kernels), the grammar bitmask,
the helper thread that fills masks while the forward pass runs, and the prefix cache of
finished requests' keys and values. Per pass it feeds the plan's tokens, applies the
grammar masks, applies each row's logit adjustments, samples each row with its own
generator, advances the grammar (the sampled token, then the tokens it forces:
jump-forward) and verifies speculative drafts; the tokens each row settled go to
``record`` (the engine's output side), which turns them into text and decides whether the
row ends.

A failure in one request's own path (its grammar, its sampling) ends that request with
``error``; the other rows go on.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import os
import time
from collections.abc import Callable
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING, Protocol

import torch

from thinkstruct.engine.kernels.cpu_kernels import cpu_kernels
from thinkstruct.engine.kv.prefix_cache import PrefixCache
from thinkstruct.engine.request import FinishReason
from thinkstruct.engine.runners.decoder_runner import DecoderRunner, supports
from thinkstruct.engine.runners.runner import ModelRunner, TransformersRunner
from thinkstruct.engine.sampling.logit_adjustments import adjust_logits
from thinkstruct.engine.sampling.logprobs import LogprobTable
from thinkstruct.engine.sampling.sampler import sample
from thinkstruct.engine.sampling.speculation import PassCosts, draft_lengths
from thinkstruct.grammar.runtime.bitmask import TokenBitmask, allowed_count, apply_bitmask_inplace
from thinkstruct.grammar.runtime.reasoning import ReasoningGrammar

if TYPE_CHECKING:
    from thinkstruct.engine.core.scheduler import DecodePlan, Move, PrefillPlan
    from thinkstruct.engine.core.sequence import Sequence
    from thinkstruct.engine.sampling.speculation import SpeculationConfig

log = logging.getLogger("thinkstruct.engine")

#: Shortest shared prompt prefix worth a slot copy (a copy of a few positions costs about
#: what computing them does).
MIN_REUSED_PREFIX = 4

#: A sampled token's log-probability and its most likely alternatives.
SampledLogprob = tuple[float, tuple[tuple[int, float], ...]]


class Record(Protocol):
    """Where settled tokens go: ``record(seq, tokens, forced=, logprob=, stop=)``."""

    def __call__(
        self, seq: Sequence, tokens: list[int], *, forced: int, logprob: SampledLogprob | None, stop: bool
    ) -> None: ...


class Counters(Protocol):
    """The engine statistics the executor adds to."""

    prefill_tokens: int
    prefix_reused_tokens: int
    prefix_cache_hit_tokens: int
    prefix_cache_bytes: int
    prefix_cache_blocks: int
    prefix_cache_evicted_blocks: int
    draft_tokens: int
    accepted_draft_tokens: int


def spare_core() -> bool:
    """Whether a core is left over beside the forward pass's threads (torch's), for the
    mask thread: on two cores with two torch threads a mask filled during the pass takes
    a core from it, and a parallel region waits for its slowest thread."""
    return (os.cpu_count() or 1) > torch.get_num_threads()


def default_runner(model: object, *, slots: int, context_length: int, vocab_size: int) -> ModelRunner:
    """:class:`~thinkstruct.engine.runners.decoder_runner.DecoderRunner` for the models its
    architecture registry computes exactly (fewer operations per step), the transformers
    runner for any other."""
    reason = supports(model, context_length=context_length)
    if reason is None:
        return DecoderRunner(model, slots=slots, context_length=context_length, vocab_size=vocab_size)
    log.info("transformers runner (not the decoder runner: %s)", reason)
    return TransformersRunner(model, slots=slots, context_length=context_length, vocab_size=vocab_size)


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
            forward pass runs (else after it, on this thread).
        stats: the counters to add to.
        record: where each row's settled tokens go.
        finish: ends a row (``finish(seq, reason, error)``).
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
        masks_during_forward: bool,
        stats: Counters,
        record: Record,
        finish: Callable[[Sequence, FinishReason, str | None], None],
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
        self.masks_during_forward = masks_during_forward
        self._stop_ids = stop_ids
        self._masks = TokenBitmask(max_batch, vocab_size)
        self._mask_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="thinkstruct-masks")
        self.prefix_cache = PrefixCache(max_bytes=prefix_cache_bytes)
        self._stats = stats
        self._record = record
        self._finish = finish

    def close(self) -> None:
        self._mask_pool.shutdown(wait=False)

    # ---- KV --------------------------------------------------------------------------

    def move(self, moves: list[Move], *, held: int) -> None:
        """Carry out the scheduler's moves; slots ``held...`` then hold nothing (a paged
        runner gives their blocks back: a moved row's blocks are shared, not copied)."""
        for m in moves:
            self.runner.copy_slot(m.src, m.dst, m.length)
        self.runner.release_slots(held)

    def reuse_prefix(self, seq: Sequence, donors: Seq[Sequence]) -> None:
        """Give ``seq``'s slot the longest prefix of its prompt that a donor's slot holds
        (a shared system prompt, chat template, tool list, or the same prompt for ``n`` >
        1) or the prefix cache holds (a finished request's: a chat's previous turn), where
        it is at least :data:`MIN_REUSED_PREFIX` tokens; at least the prompt's last token
        is still computed (its logits give the first token).

        On a batch-invariant runner what is reused is the same bits as computing it; on
        others, what an earlier pass computed (equal within rounding)."""
        prompt = seq.request.prompt_ids
        best: Sequence | None = None
        length = MIN_REUSED_PREFIX - 1
        for donor in donors:
            if donor is seq or donor.cached <= length:
                continue
            limit = min(donor.cached, donor.prompt_tokens, len(prompt) - 1)
            shared = _common_prefix(prompt, donor.request.prompt_ids, limit)
            if shared > length:
                best, length = donor, shared
        stored = self.prefix_cache.match(prompt, limit=len(prompt) - 1)
        if stored.kv is not None and stored.tokens > length:
            self.runner.write_kv(seq.slot, 0, stored.kv)
            length = stored.tokens
            self._stats.prefix_cache_hit_tokens += length
        elif best is not None:
            self.runner.copy_slot(best.slot, seq.slot, length)
        else:
            return
        seq.cached = length
        del seq.pending[:length]
        seq.cached_prompt_tokens = length
        self._stats.prefix_reused_tokens += length

    def keep_prefix(self, seq: Sequence) -> None:
        """Hand the positions a leaving row's slot holds to the prefix cache (before
        another row moves into the slot)."""
        if seq.slot < 0 or seq.cached <= 0:
            return
        tokens = seq.context[: seq.cached]
        slot, runner = seq.slot, self.runner
        cache = self.prefix_cache
        cache.insert(tokens, lambda start, stop: runner.read_kv(slot, start, stop))
        self._stats.prefix_cache_bytes = cache.bytes
        self._stats.prefix_cache_blocks = cache.blocks
        self._stats.prefix_cache_evicted_blocks = cache.evicted

    # ---- passes ----------------------------------------------------------------------

    def prefill(self, plan: PrefillPlan) -> list[Sequence]:
        """Feed the plan's prompt chunks; the rows whose prompt is now complete sample
        their first token. Returns those rows."""
        rows, chunks = plan.rows, plan.chunks
        logits = self.runner.forward(rows[0].slot, chunks, [s.cached for s in rows])
        done: list[int] = []
        for i, (seq, chunk) in enumerate(zip(rows, chunks, strict=True)):
            seq.cached += len(chunk)
            del seq.pending[: len(chunk)]
            self._stats.prefill_tokens += len(chunk)
            if not seq.pending:
                done.append(i)
        if not done:
            return []
        joining = [rows[i] for i in done]
        logits = logits[done]
        constrained = [j for j, seq in enumerate(joining) if seq.matcher is not None]
        if constrained:
            masks = self._masks.rows(len(joining))
            for j in constrained:
                self._fill_one(joining[j], masks, j)
            live = [j for j in constrained if joining[j].finish_reason is None]
            if live:
                _apply_rows(logits, masks, live)
        self.sample_and_advance(joining, logits)
        return joining

    def decode(self, plan: DecodePlan) -> tuple[float, float]:
        """One decoding pass over every decoding row; returns the seconds spent in the
        forward pass and in waiting for / applying the masks after it."""
        rows, feeds, ready = plan.rows, plan.feeds, plan.ready
        started = time.perf_counter()
        drafts = self._drafts(rows, ready, feeds, plan.width)
        masks = self._masks.rows(len(rows))
        constrained = [i for i in ready if rows[i].matcher is not None]
        fill = (
            self._mask_pool.submit(self._fill_rows, rows, constrained, masks)
            if constrained and self.masks_during_forward
            else None
        )
        tail = [1 + len(d) for d in drafts] if any(drafts) else None
        logits = self.runner.forward(
            0, [f + d for f, d in zip(feeds, drafts, strict=True)], [s.cached for s in rows], tail=tail
        )
        forwarded = time.perf_counter()
        for s, fed in zip(rows, feeds, strict=True):
            s.cached += len(fed)
            del s.pending[: len(fed)]
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
            live = [i for i in constrained if rows[i].finish_reason is None]
            if live:
                _apply_rows(logits, masks, live)
        masked = time.perf_counter()
        if len(ready) == len(rows):
            self.sample_and_advance(rows, logits)
        else:
            self.sample_and_advance([rows[i] for i in ready], logits[ready])
        if tail is not None:
            self._verify_drafts(rows, drafts, drafted, firsts)
        if self.pass_costs is not None:
            positions = sum(map(len, feeds)) + sum(map(len, drafts))
            self.pass_costs.observe(positions, time.perf_counter() - started, rows=len(rows))
        return forwarded - started, masked - forwarded

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
            if seq.drafter is None or seq.finish_reason is not None:
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
        self, rows: list[Sequence], drafts: list[list[int]], logits: torch.Tensor, firsts: list[int]
    ) -> None:
        """Keep each row's draft tokens while they are what the row takes there.

        Position ``p`` of a row's draft was fed after ``p`` draft tokens. The row samples
        there from the logits before it (one draw of its own generator, as without a
        draft) and its grammar adds the tokens it forces: while those tokens are the
        draft's next ones, their keys and values are already in the slot (keep them and
        sample after the last); from the first that differs on, the row feeds its tokens
        next step (the slot's positions past the kept ones are simply overwritten)."""
        at = {i: 0 for i, d in enumerate(drafts) if d}  # the draft position sampled next
        kept = dict.fromkeys(at, 0)
        active = list(at)
        while active:
            still = []
            for i in active:
                seq, draft, p = rows[i], drafts[i], at[i]
                if seq.finish_reason is not None:
                    continue
                n = _common_prefix(seq.pending, draft[p:], len(seq.pending))
                if n == 0:
                    continue
                seq.cached += n  # fed as draft tokens p .. p + n - 1
                seq.pending = seq.pending[n:]
                kept[i] += n
                at[i] = p + n
                if not seq.pending:
                    still.append(i)
            if not still:
                break
            view = logits[[firsts[i] + at[i] for i in still]]
            constrained = [k for k, i in enumerate(still) if rows[i].matcher is not None]
            if constrained:
                masks = self._masks.rows(len(still))
                for k in constrained:
                    self._fill_one(rows[still[k]], masks, k)
                live = [k for k in constrained if rows[still[k]].finish_reason is None]
                if live:
                    _apply_rows(view, masks, live)
            self.sample_and_advance([rows[i] for i in still], view)
            active = [i for i in still if at[i] < len(drafts[i])]
        for i, n in kept.items():
            seq = rows[i]
            if seq.drafter is not None:
                seq.drafter.record(len(drafts[i]), n)
            self._stats.draft_tokens += len(drafts[i])
            self._stats.accepted_draft_tokens += n

    # ---- masks -----------------------------------------------------------------------

    def _fill_rows(self, rows: list[Sequence], indices: list[int], masks: torch.Tensor) -> None:
        for i in indices:
            self._fill_one(rows[i], masks, i)

    def _fill_one(self, seq: Sequence, masks: torch.Tensor, row: int) -> None:
        try:
            seq.matcher.fill_bitmask(masks, row)  # type: ignore[union-attr]
            if seq.counts_allowed:
                seq.allowed_now = allowed_count(masks[row], self.vocab_size)
        except Exception as e:  # noqa: BLE001 - this request fails with the message, the batch goes on
            seq.end(FinishReason.ERROR, f"the grammar failed to compute its mask: {e}")

    # ---- sampling and the grammar ----------------------------------------------------

    def sample_and_advance(self, rows: list[Sequence], logits: torch.Tensor) -> None:
        """Sample one token per live row, feed it (and forced tokens) to its grammar, and
        hand the settled tokens to ``record``."""
        live = [i for i, s in enumerate(rows) if s.finish_reason is None]
        for s in rows:
            if s.finish_reason is not None and not s.handle.finished:
                self._finish(s, s.finish_reason, s.error)
        if not live:
            return
        params = [rows[i].params for i in live]
        gens = [rows[i].generator for i in live]
        view = logits if len(live) == logits.shape[0] else logits[live]
        for j, i in enumerate(live):
            banned = rows[i].bans.get(rows[i].position) if rows[i].bans else None
            if banned:  # a value that started here failed its check: draw another token
                view[j, list(banned)] = float("-inf")
        # Only rows that ask pay for bias, penalties and log-probabilities.
        if any(p.adjusts_logits for p in params):
            adjust_logits(view, params, [rows[i].adjustments for i in live])
        table = LogprobTable(view, params) if any(p.logprobs is not None for p in params) else None
        # A failed batch may have drawn for some rows already; each row draws again from
        # where it was, so its tokens do not depend on another row's fault (~1 us a row).
        states = [g.get_state() for g in gens]
        tokens: list[int | None]
        try:
            tokens = list(sample(view, params, gens))
        except Exception:  # noqa: BLE001 - find the row(s) at fault, sample the rest one by one
            tokens = []
            for j, (i, generator, state) in enumerate(zip(live, gens, states, strict=True)):
                generator.set_state(state)
                try:
                    tokens.append(sample(view[j : j + 1], [rows[i].params], [generator])[0])
                except ValueError:  # every token masked
                    tokens.append(-1)
                except Exception as e:  # this request's sampling failed; the batch goes on
                    log.exception("sampling request %s failed", rows[i].request.request_id)
                    self._finish(rows[i], FinishReason.ERROR, f"internal error sampling this request: {e}")
                    tokens.append(None)
        for j, (i, token) in enumerate(zip(live, tokens, strict=True)):
            seq = rows[i]
            if token is None:
                continue
            if token in self._stop_ids:
                token = _in_place_of_stop(seq, token)
            try:
                self._advance(seq, token, None if table is None or token < 0 else table.entry(j, token))
            except Exception as e:  # this request's own path failed
                log.exception("request %s failed", seq.request.request_id)
                self._finish(seq, FinishReason.ERROR, f"internal error in this request: {e}")

    def _advance(self, seq: Sequence, token: int, logprob: SampledLogprob | None) -> None:
        if token < 0:
            failure = seq.check_failure if seq.bans.get(seq.position) else None
            why = "the grammar allows no next token"
            if failure is not None:
                why = f"no answer meets the schema here (every allowed token was tried): {failure.describe()}"
            self._finish(seq, FinishReason.ERROR, why)
            return
        matcher = seq.matcher
        forced: list[int] = []
        stop = False
        if matcher is not None:
            if not matcher.accept_token(token):
                self._finish(seq, FinishReason.ERROR, f"the grammar rejected the sampled token {token}")
                return
            # A stop token ends the output (one inside a thought whose grammar turns it
            # into the thought's end never gets here: see _in_place_of_stop).
            if matcher.is_terminated() or token in self._stop_ids:
                stop = True
            else:
                # Forced tokens count against max_tokens and must fit in the context.
                budget = min(seq.params.max_tokens - seq.generated - 1, self.context_length - seq.cached - 1)
                forced = matcher.jump_forward()[:budget] if budget > 0 else []
                if forced:
                    accepted = matcher.accept_tokens(forced)
                    forced = forced[:accepted]
        else:
            stop = token in self._stop_ids
            seq.allowed_now = self.vocab_size
        new = [token, *forced]
        if seq.drafter is not None:
            seq.drafter.extend(new, forced=len(forced))
        if seq.adjustments is not None:
            seq.adjustments.add(new)
        seq.pending = [] if stop else new
        self._record(seq, new, forced=len(forced), logprob=logprob, stop=stop)


def _in_place_of_stop(seq: Sequence, token: int) -> int:
    """The token ``seq`` takes for the stop token ``token`` it sampled: the first token of
    its end tag where its grammar turns a stop inside the thought into the thought's end
    (the rest of the tag is forced after it), else ``token``."""
    matcher = seq.matcher
    if isinstance(matcher, ReasoningGrammar) and matcher.ends_thought(token):
        return matcher.close_thought()[0]
    return token


def _common_prefix(a: Seq[int], b: Seq[int], limit: int) -> int:
    """How many leading tokens ``a`` and ``b`` share, up to ``limit``."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if n >= limit or x != y:
            break
        n += 1
    return n


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
