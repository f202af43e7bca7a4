"""The serving loop: :class:`Engine`.

One long-lived engine thread does all torch work (torch on two threads at once made
matmuls 1.5x slower on two cores). Callers submit requests from any thread; the engine
thread runs continuous batching over the slots of one KV cache, in three parts with data
flowing one way (vLLM v1's schedule, execute, update):

- the :class:`~thinkstruct.engine.core.scheduler.Scheduler` plans: which queued requests
  take free slots (one whose grammar is still compiling keeps its place), the next
  prefill pass (several prompts' chunks in one pass of at most
  :attr:`~thinkstruct.engine.core.config.EngineConfig.prefill_chunk` positions between
  two decoding steps, so running requests keep their pace, and the prompt prefixes taken
  from another slot or the prefix cache), the next decoding pass (each row's sampled
  token plus the tokens its grammar forces, within
  :attr:`~thinkstruct.engine.core.config.EngineConfig.decode_positions`), and how the
  rows are laid out after rows leave;
- the :class:`~thinkstruct.engine.core.executor.Executor` runs a plan on the model runner
  (the forward pass while a helper thread fills the grammar bitmask rows, the masks,
  logit adjustments, sampling with each row's own generator, the grammar advance and
  jump-forward, speculative drafts, the prefix cache) and returns what each row got, a
  :class:`~thinkstruct.engine.core.step.StepResult`;
- the scheduler applies the result to the rows' positions, and the engine hands each
  row's draws to its :class:`~thinkstruct.engine.output.processor.OutputProcessor`
  (through a :class:`~thinkstruct.engine.output.checked_answer.CheckedAnswer` where its
  grammar has checks), which turns them into deltas: detokenizing, the reasoning split,
  stop strings, tool calls. There the row may end (a stop, a stop string,
  ``max_tokens``, the context) or take a value that failed its check back.

A failure in one request's own path (its grammar, its sampling, its parser) ends that
request with ``finish_reason="error"``; the batch and the engine go on.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from thinkstruct.engine.core.config import (
    KV_DEMAND_BUDGETS,
    EngineClosed,
    EngineConfig,
    EngineOverloaded,
    EngineStats,
    KvBudgetExceeded,
    KvCacheFull,
    check_request,
    prompt_token_limit,
)
from thinkstruct.engine.core.executor import Executor
from thinkstruct.engine.core.handle import RequestHandle
from thinkstruct.engine.core.matchers import RequestMatchers
from thinkstruct.engine.core.scheduler import Scheduler
from thinkstruct.engine.core.sequence import Sequence
from thinkstruct.engine.output.detokenizer import TokenTexts
from thinkstruct.engine.output.processor import OutputProcessor
from thinkstruct.engine.request import Delta, FinishReason, GenerationRequest
from thinkstruct.engine.runners.decoder_runner import default_runner
from thinkstruct.engine.sampling.speculation import DraftRecord, NgramDrafter

if TYPE_CHECKING:
    from thinkstruct.engine.core.scheduler import DecodePlan
    from thinkstruct.engine.core.step import Draw, RowOutput, StepResult
    from thinkstruct.engine.kv.budget import KvBudget
    from thinkstruct.engine.model.loading import LoadedModel
    from thinkstruct.engine.output.checked_answer import SettledToken, Undo
    from thinkstruct.engine.runners.runner import ModelRunner
    from thinkstruct.grammar.runtime.value_checks import CheckFailure
    from thinkstruct.grammar.service.compiler import GrammarCompiler

log = logging.getLogger("thinkstruct.engine")


class Engine:
    """Continuous batching over one model, one thread.

    Args:
        model: the loaded model (:func:`~thinkstruct.engine.model.loading.load_model`).
        config: scheduling limits.
        compiler: the grammar compiler requests' constraints were compiled with (the
            engine does not compile; :attr:`compiler` is offered to callers). Default: one
            over the model's tokenizer with default settings.
        runner: a custom :class:`~thinkstruct.engine.runners.runner.ModelRunner` (default:
            :func:`~thinkstruct.engine.runners.decoder_runner.default_runner` over
            ``model.model``).
    """

    def __init__(
        self,
        model: LoadedModel,
        *,
        config: EngineConfig | None = None,
        compiler: GrammarCompiler | None = None,
        runner: ModelRunner | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = model.tokenizer
        self.config = config or EngineConfig()
        self._compiler = compiler
        self._given_runner = runner
        self.context_length = model.context_length
        self.max_prompt_tokens = prompt_token_limit(self.config.max_prompt_tokens, self.context_length)
        self.stats = EngineStats()
        #: How draft tokens fared over the recent requests (each request's drafter starts
        #: from it; read and written on the engine thread).
        self._drafts = DraftRecord(self.config.speculation) if self.config.speculation is not None else None
        self._texts = TokenTexts(self.tokenizer)
        self._stop_ids = frozenset(self.tokenizer.eos_token_ids)
        self._matchers = RequestMatchers(
            self.tokenizer, model.family, texts=self._texts, stop_ids=self._stop_ids
        )
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._submitted: collections.deque[Sequence] = collections.deque()
        self._closing = False
        self._thread: threading.Thread | None = None
        self._scheduler: Scheduler | None = None
        self._executor: Executor | None = None
        #: What keys and values requests may take (the runner's, within the config's).
        self._kv_budget: KvBudget | None = None
        #: Bytes of keys and values the requests submitted and not finished need (guarded
        #: by ``_lock``): what :class:`KvCacheFull` is decided on.
        self._kv_demand = 0
        self._on_step: Callable[[], None] | None = None

    # ---- lifecycle -------------------------------------------------------------------

    @property
    def token_texts(self) -> TokenTexts:
        """The bytes each token id stands for in generated text (special tokens' text kept)."""
        return self._texts

    @property
    def compiler(self) -> GrammarCompiler:
        """The grammar compiler for this model's tokenizer (created on first use)."""
        if self._compiler is None:
            from thinkstruct.grammar.service.compiler import GrammarCompiler

            self._compiler = GrammarCompiler(self.tokenizer)
        return self._compiler

    @property
    def runner(self) -> ModelRunner | None:
        """The model runner (built on the engine thread at :meth:`start`)."""
        return self._executor.runner if self._executor is not None else self._given_runner

    def start(self) -> Engine:
        """Start the engine thread (building the runner on it)."""
        with self._lock:
            if self._thread is not None:
                return self
            ready = threading.Event()
            failure: list[BaseException] = []
            self._thread = threading.Thread(
                target=self._main, args=(ready, failure), name="thinkstruct-engine", daemon=True
            )
            self._thread.start()
        ready.wait()
        if failure:
            raise failure[0]
        return self

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._closing

    def close(self, *, grace_s: float = 0.0) -> None:
        """Stop taking requests; let running ones finish for up to ``grace_s`` seconds, then
        end the rest with ``abort``; stop the thread."""
        with self._lock:
            self._closing = True
            self._grace_deadline = time.monotonic() + max(grace_s, 0.0)
            self._wake.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        if self._executor is not None:
            self._executor.close()

    def __enter__(self) -> Engine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- submitting ------------------------------------------------------------------

    def submit(
        self, request: GenerationRequest, *, loop: asyncio.AbstractEventLoop | None = None
    ) -> RequestHandle:
        """Queue a request; its deltas arrive on the returned handle.

        Its grammar may still be compiling (a future): it keeps its place in the queue and
        is admitted once the grammar is ready.

        Raises:
            ValueError: the request cannot run (empty or too long prompt, ids outside the
                vocabulary, a grammar for another tokenizer, more keys and values than the
                KV budget holds: :class:`KvBudgetExceeded`); the message names the problem.
            EngineOverloaded: the queue is full, or the requests running and waiting need
                the KV budget twice over (:class:`KvCacheFull`).
            EngineClosed: the engine is not running.
        """
        check_request(request, vocab_size=self.tokenizer.vocab_size, max_prompt_tokens=self.max_prompt_tokens)
        need = self._kv_need(request)
        grammar = request.grammar
        if grammar is not None and not isinstance(grammar, concurrent.futures.Future):
            self._matchers.check_grammar(grammar)
        handle = RequestHandle(request.request_id, loop)
        output = OutputProcessor(
            request, texts=self._texts, end_tag=self._matchers.end_tag, stop_ids=self._stop_ids
        )
        seq = Sequence(request, handle, output=output, submitted_at=time.monotonic())
        if self.config.speculation is not None:
            seq.drafter = NgramDrafter(request.prompt_ids, self.config.speculation, shared=self._drafts)
        with self._lock:
            if self._closing or self._thread is None or not self._thread.is_alive():
                raise EngineClosed("the engine is not running")
            queued = len(self._submitted) + self.stats.waiting
            if queued >= self.config.max_queue:
                raise EngineOverloaded(queued, retry_after_s=self._retry_after_s())
            allowed = self.stats.kv_cache_allowed_bytes
            if self._kv_demand + need > KV_DEMAND_BUDGETS * allowed:
                self.stats.kv_refused += 1
                raise KvCacheFull(
                    demand=self._kv_demand + need, allowed=allowed, retry_after_s=self._retry_after_s()
                )
            seq.kv_need = need
            self._kv_demand += need
            self._submitted.append(seq)
            self._wake.notify()
        return handle

    def _kv_need(self, request: GenerationRequest) -> int:
        """Bytes of keys and values ``request`` reserves: what its prompt and
        ``max_tokens`` can come to hold, within the context.

        Raises:
            KvBudgetExceeded: more than the KV budget holds for one request.
            EngineClosed: the engine has not started.
        """
        budget = self._kv_budget
        if budget is None:
            raise EngineClosed("the engine is not running")
        prompt = len(request.prompt_ids)
        positions = min(prompt + request.sampling.max_tokens, self.context_length)
        need = budget.need(positions)
        if need is None:
            raise KvBudgetExceeded(
                prompt_tokens=prompt,
                max_tokens=request.sampling.max_tokens,
                max_positions=budget.max_positions,
            )
        return need

    def _prepare(self, seq: Sequence) -> None:
        """A request about to take a slot: build its matcher and checks (its grammar is
        ready now); a grammar that cannot be used ends it."""
        try:
            seq.matcher = self._matchers.matcher(seq.request)
            seq.call_opening = self._matchers.call_opening(seq.request)
            seq.checked = self._matchers.checked(seq.request, seq.grammar)
        except Exception as e:  # noqa: BLE001 - a failed compile or a foreign grammar ends this request only
            self._finish(seq, FinishReason.ERROR, f"the grammar is not usable: {e}")
            return
        if seq.checked is not None:
            seq.drafter = None  # a draft would run past a value before it is checked

    def _retry_after_s(self) -> float:
        steps = max(self.stats.steps, 1)
        per_step = self.stats.step_seconds / steps if self.stats.step_seconds else 0.05
        return max(1.0, min(60.0, per_step * 64))

    # ---- the engine thread -----------------------------------------------------------

    def _main(self, ready: threading.Event, failure: list[BaseException]) -> None:
        try:
            config = self.config
            runner = self._given_runner or default_runner(
                self.model.model,
                slots=config.max_batch,
                context_length=self.context_length,
                vocab_size=self.tokenizer.vocab_size,
                kv_cache_bytes=config.kv_cache_bytes,
                prefix_cache_bytes=config.prefix_cache_bytes,
                kv_cache_dtype=None
                if config.kv_cache_dtype is None
                else getattr(torch, config.kv_cache_dtype),
            )
            budget = runner.kv_budget.within(
                kv_bytes=config.kv_cache_bytes, prefix_bytes=config.prefix_cache_bytes
            )
            self._kv_budget = budget
            self.stats.kv_cache_allowed_bytes = budget.kv_bytes
            self.stats.prefix_cache_allowed_bytes = budget.prefix_bytes
            # A runner holds at most its slots (the default choice may give fewer).
            max_batch = min(config.max_batch, runner.slots)
            self._scheduler = Scheduler(
                max_batch=max_batch,
                prefill_chunk=config.prefill_chunk,
                decode_positions=config.decode_positions,
                packs_tokens=runner.packs_tokens,
                kv_bytes=budget.kv_bytes,
                step_target_s=config.step_latency_target_s,
                # Cut anywhere only where a prompt's bits do not depend on the cuts.
                chunk_target_s=config.step_latency_target_s if runner.batch_invariant else None,
            )
            self._executor = Executor(
                runner,
                max_batch=max_batch,
                vocab_size=self.tokenizer.vocab_size,
                context_length=self.context_length,
                stop_ids=self._stop_ids,
                prefix_cache_bytes=budget.prefix_bytes,
                speculation=config.speculation,
                masks_during_forward=config.masks_during_forward,
            )
        except BaseException as e:  # noqa: BLE001 - reported to start()
            failure.append(e)
            ready.set()
            return
        ready.set()
        try:
            with torch.inference_mode():
                while self._iterate():
                    pass
        except BaseException as e:  # a bug outside every request's own path: nobody may hang
            log.exception("the engine thread failed")
            self._abort_all(f"the engine failed: {e}", reason=FinishReason.ERROR)
            raise
        self._abort_all("the engine stopped")

    def _iterate(self) -> bool:
        """One round of the loop; False once the engine should stop."""
        scheduler, executor = self._scheduler, self._executor
        if scheduler is None or executor is None:
            raise RuntimeError("the engine thread runs without its scheduler and executor")
        with self._lock:
            while self._submitted:
                scheduler.enqueue(self._submitted.popleft())
            if self._closing and (not scheduler.has_work() or time.monotonic() >= self._grace_deadline):
                return False
            if not scheduler.has_work():
                self._wake.wait(self.config.idle_poll_s)
                return True
            self.stats.waiting = len(scheduler.queued)
        try:
            self._drop_cancelled()
            self._prefill_step(scheduler, executor)
            plan = scheduler.decode_plan()
            if plan is not None:
                self._decode_step(plan, scheduler, executor)
        except Exception as e:  # a failure of the whole forward pass: end its rows, go on
            log.exception("engine step failed")
            for seq in scheduler.held:
                self._finish(seq, FinishReason.ERROR, f"internal error in the model step: {e}")
            self._layout()
        held = scheduler.held
        self.stats.running = len(scheduler.decoding)
        self.stats.slots_used = len(held)
        self.stats.kv_tokens = sum(s.cached for s in held)
        self.stats.kv_cache_reserved_bytes = scheduler.kv_reserved
        self.stats.batch_limit = scheduler.batch.value
        self.stats.prefill_chunk = scheduler.chunk.value
        self.stats.kv_pool_bytes = executor.runner.cache_bytes
        if self._on_step is not None:
            self._on_step()
        return True

    def _prefill_step(self, scheduler: Scheduler, executor: Executor) -> None:
        """Admit waiting requests into free slots and feed the next prompt chunks; the
        requests whose prompt is complete sample their first token and decode."""
        if not self._closing:
            self._admit(scheduler)
        plan = scheduler.prefill_plan(executor.cached_prefixes(scheduler.unstarted))
        if plan is None:
            return
        started = time.perf_counter()
        result = executor.prefill(plan)
        scheduler.prefill_took(positions=plan.positions, seconds=time.perf_counter() - started)
        stats = self.stats
        stats.prefill_tokens += result.prefill_tokens
        stats.prefix_reused_tokens += result.reused_tokens
        stats.prefix_cache_hit_tokens += result.cache_hit_tokens
        if self._apply(result, scheduler):
            self._layout()

    def _admit(self, scheduler: Scheduler) -> None:
        """Queued requests whose grammar is ready take the free slots, in order; one whose
        grammar cannot be used ends and leaves its slot to the next."""
        while candidates := scheduler.admissions():
            for seq in candidates:
                self._prepare(seq)
            scheduler.admit([s for s in candidates if s.finish_reason is None])

    def _decode_step(self, plan: DecodePlan, scheduler: Scheduler, executor: Executor) -> None:
        started = time.perf_counter()
        result = executor.decode(plan)
        self._apply(result, scheduler)
        self._layout()
        elapsed = time.perf_counter() - started
        scheduler.decode_took(rows=len(plan.rows), seconds=elapsed)
        stats = self.stats
        stats.forward_seconds += result.forward_s
        stats.mask_seconds += result.mask_s
        stats.draft_tokens += result.draft_tokens
        stats.accepted_draft_tokens += result.accepted_draft_tokens
        stats.steps += 1
        stats.last_step_s = elapsed
        stats.step_seconds += elapsed
        stats.last_batch = len(plan.rows)
        stats.largest_batch = max(stats.largest_batch, len(plan.rows))

    def _apply(self, result: StepResult, scheduler: Scheduler) -> bool:
        """A pass's result: the scheduler takes each row's positions, then each row's draws
        go to its output side. Whether a prompt completed (its row started decoding)."""
        started = scheduler.update(result)
        for row in result.rows:
            self._settle(row)
        return bool(started)

    def _layout(self) -> None:
        """Finished rows leave (their KV to the prefix cache); the others are laid out."""
        scheduler, executor = self._scheduler, self._executor
        if scheduler is None or executor is None:
            return
        executor.apply_layout(scheduler.layout())
        cache = executor.prefix_cache
        stats = self.stats
        stats.running = len(scheduler.decoding)
        stats.prefix_cache_bytes = cache.bytes
        stats.prefix_cache_blocks = cache.blocks
        stats.prefix_cache_evicted_blocks = cache.evicted

    # ---- the output side ---------------------------------------------------------------

    def _settle(self, row: RowOutput) -> None:
        """One row's draws, in order, until the row ends or takes a value back (a draft
        may have drawn past a stop string: those draws are dropped); then its error."""
        seq = row.seq
        rollbacks = seq.rollbacks
        try:
            for draw in row.draws:
                if not self._record(seq, draw):
                    break
        except Exception as e:  # this request's own output path failed
            log.exception("request %s failed", seq.request.request_id)
            self._finish(seq, FinishReason.ERROR, f"internal error in this request: {e}")
        if row.error is None:
            return
        if row.unmet is not None and seq.checked is not None and seq.finish_reason is None:
            # Every token allowed where a failed part was taken back to was tried: back
            # off further (unless a draw of this pass took that place back already).
            if seq.rollbacks == rollbacks:
                self._undo(seq, seq.checked.back_off(row.unmet, tries=self._tries(seq)))
            return
        self._finish(seq, FinishReason.ERROR, row.error, unmet=row.unmet)

    def _record(self, seq: Sequence, draw: Draw) -> bool:
        """Tokens a row settled (sampled, then forced): its output processor turns them
        into a delta (or, while a checked value is open, later: a value that fails is
        taken back and drawn again); the row ends at a stop, a stop string,
        ``max_tokens`` or the context. Whether the row takes more draws."""
        tokens = draw.tokens
        start = seq.position
        seq.generated_ids.extend(t for t in tokens if t not in self._stop_ids)
        self.stats.generated_tokens += len(tokens)
        self.stats.jump_forward_tokens += draw.forced
        if seq.checked is None:
            delta = seq.output.add(tokens, forced=draw.forced, logprob=draw.logprob, allowed=draw.allowed)
            if delta is not None:
                seq.handle.emit(delta)
        else:
            settled = seq.checked.settle(
                tokens,
                forced=draw.forced,
                logprob=draw.logprob,
                allowed=draw.allowed,
                tries=self._tries(seq),
            )
            if settled.undo is not None:
                self._undo(seq, settled.undo)
                return False
            self._release(seq, settled.release)
        if draw.stop or seq.stopped_by_string:
            self._finish(seq, FinishReason.STOP)
        elif seq.generated >= seq.params.max_tokens or start + len(tokens) >= self.context_length:
            self._finish(seq, FinishReason.LENGTH)
        return seq.finish_reason is None

    def _release(self, seq: Sequence, settled: list[SettledToken]) -> None:
        """Hand tokens a check no longer holds back to the output processor."""
        for item in settled:
            delta = seq.output.add(
                [item.token], forced=0 if item.sampled else 1, logprob=item.logprob, allowed=item.allowed
            )
            if delta is not None:
                seq.handle.emit(delta)

    @staticmethod
    def _tries(seq: Sequence) -> Callable[[int], int]:
        """How many times the position ``back`` generated tokens before ``seq``'s end was
        drawn again."""
        return lambda back: seq.tries.get(seq.position - back, 0)

    def _undo(self, seq: Sequence, undo: Undo) -> None:
        """Take back a part of the answer that failed its check: the grammar, the
        generated tokens and the KV return to the drawn token ``undo`` names, which is
        banned there with every token that would fail the same way; bans further on
        belong to text taken back, and go. The row draws again at the next step. A
        position out of tries (``check_tries_per_value``) backs off to an earlier drawn
        token; out of tries in all (``check_tries_per_request``, or nothing left to
        change), the request ends with an error naming the keyword and the JSON pointer."""
        seq.check_failure = undo.failure
        position = seq.position - undo.tokens
        config = self.config
        checked, matcher = seq.checked, seq.matcher
        if (
            not undo.possible
            or matcher is None
            or checked is None
            or seq.rollbacks >= config.check_tries_per_request
        ):
            self._finish(
                seq,
                FinishReason.ERROR,
                f"the answer could not meet {undo.failure.describe()}",
                unmet=undo.failure,
            )
            return
        matcher.rollback(undo.grammar_tokens)
        self._take_back(seq, undo.tokens)
        if seq.tries.get(position, 0) >= config.check_tries_per_value:
            self._undo(seq, checked.back_off(undo.failure, tries=self._tries(seq)))
            return
        seq.bans.setdefault(position, set()).update(undo.banned)
        seq.tries[position] = seq.tries.get(position, 0) + 1
        seq.rollbacks += 1
        self.stats.check_rollbacks += 1

    def _take_back(self, seq: Sequence, tokens: int) -> None:
        """The last ``tokens`` generated tokens go, with the KV after them and the bans at
        later positions (the grammar is rolled back by the caller)."""
        seq.resampled_tokens += tokens
        self.stats.resampled_tokens += tokens
        taken = seq.generated_ids[len(seq.generated_ids) - tokens :]
        del seq.generated_ids[len(seq.generated_ids) - tokens :]
        if seq.adjustments is not None:
            seq.adjustments.remove(taken)
        position = seq.position
        # Feed the last kept token again: its logits are where the next draw comes from.
        seq.cached = position - 1
        seq.pending = [seq.context[position - 1]]
        for later in [p for p in seq.bans if p > position]:
            del seq.bans[later]
            seq.tries.pop(later, None)

    def _finish(
        self,
        seq: Sequence,
        reason: FinishReason,
        error: str | None = None,
        *,
        unmet: CheckFailure | None = None,
    ) -> None:
        seq.end(reason, error, unmet=unmet)
        if not seq.handle.finished:
            with self._lock:
                self._kv_demand -= seq.kv_need
            self._emit_finish(seq)

    def _emit_finish(self, seq: Sequence) -> None:
        reason = seq.finish_reason or FinishReason.ERROR
        if seq.checked is not None and reason is not FinishReason.ERROR:
            # The answer ends (or is cut short): what a check held back goes out; after an
            # error it may hold the value that failed, and is dropped.
            self._release(seq, seq.checked.release_all())
        try:
            delta = seq.output.finish(
                reason,
                seq.error,
                submitted_at=seq.submitted_at,
                prompt_tokens=seq.prompt_tokens,
                cached_tokens=seq.cached_prompt_tokens,
                backend=seq.backend,
                check_rollbacks=seq.rollbacks,
                resampled_tokens=seq.resampled_tokens,
                unmet=seq.unmet,
            )
        except Exception as e:  # noqa: BLE001 - the parser or detokenizer failed at the very end
            delta = Delta(finish_reason=FinishReason.ERROR, error=f"internal error finishing: {e}")
        self.stats.finished[delta.finish_reason.value if delta.finish_reason else "error"] += 1
        if delta.unmet is not None:
            unmet = self.stats.checks_unmet
            unmet[delta.unmet.keyword] = unmet.get(delta.unmet.keyword, 0) + 1
        seq.handle.emit(delta)

    def _drop_cancelled(self) -> None:
        scheduler = self._scheduler
        if scheduler is None:
            return
        for seq in scheduler.everyone():
            if seq.handle.cancelled and seq.finish_reason is None:
                self._finish(seq, FinishReason.ABORT, "cancelled")
        scheduler.drop_finished_queued()
        self._layout()

    def _abort_all(self, why: str, *, reason: FinishReason = FinishReason.ABORT) -> None:
        with self._lock:
            pending = list(self._submitted)
            self._submitted.clear()
        scheduler = self._scheduler
        everyone = [*(scheduler.everyone() if scheduler is not None else []), *pending]
        for seq in everyone:
            if seq.finish_reason is None:
                self._finish(seq, reason, why)
        if scheduler is not None:
            scheduler.clear()
        self.stats.running = self.stats.slots_used = self.stats.kv_tokens = 0
        self.stats.kv_cache_reserved_bytes = 0
