"""The serving loop: :class:`Engine`.

One long-lived engine thread does all torch work (torch on two threads at once made
matmuls 1.5x slower on two cores). Callers submit requests from any thread; the engine
thread runs continuous batching over the slots of one KV cache, in three parts with data
flowing one way:

- the :class:`~thinkstruct.engine.core.scheduler.Scheduler` decides: which queued requests
  take free slots (one whose grammar is still compiling keeps its place), the next
  prefill pass (several prompts' chunks in one pass of at most
  :attr:`EngineConfig.prefill_chunk` positions between two decoding steps, so running
  requests keep their pace), the next decoding pass (each row's sampled token plus the
  tokens its grammar forces, within :attr:`EngineConfig.decode_positions`), and how the
  rows are laid out after rows leave;
- the :class:`~thinkstruct.engine.core.executor.Executor` runs the plan on the model runner:
  the forward pass while a helper thread fills the grammar bitmask rows (the grammar
  libraries release the GIL), the masks, logit adjustments, sampling with each row's own
  generator, the grammar advance (jump-forward), speculative drafts, the prefix cache;
- each request's :class:`~thinkstruct.engine.output.processor.OutputProcessor` turns its tokens
  into deltas: detokenizing, the reasoning split, stop strings, tool calls.

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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from thinkstruct.engine.core.executor import Executor, SampledLogprob, default_runner, spare_core
from thinkstruct.engine.core.handle import RequestHandle
from thinkstruct.engine.core.scheduler import Scheduler
from thinkstruct.engine.core.sequence import Sequence
from thinkstruct.engine.core.thinking_budget import thinking_budget_matcher
from thinkstruct.engine.output.checked_answer import CheckedAnswer, SettledToken, Undo
from thinkstruct.engine.output.detokenizer import TokenTexts
from thinkstruct.engine.output.processor import OutputProcessor
from thinkstruct.engine.request import Delta, FinishReason, GenerationRequest, InvalidSamplingParam
from thinkstruct.engine.sampling.speculation import DraftRecord, NgramDrafter, SpeculationConfig
from thinkstruct.grammar.runtime.end_tag import end_tag_matcher

if TYPE_CHECKING:
    from thinkstruct.engine.core.scheduler import DecodePlan
    from thinkstruct.engine.model.loading import LoadedModel
    from thinkstruct.engine.runners.runner import ModelRunner
    from thinkstruct.grammar.base import CompiledGrammar, GrammarMatcher
    from thinkstruct.grammar.service.compiler import GrammarCompiler
    from thinkstruct.tokenizer import Tokenizer

log = logging.getLogger("thinkstruct.engine")


__all__ = [
    "Engine",
    "EngineClosed",
    "EngineConfig",
    "EngineOverloaded",
    "EngineStats",
    "check_request",
    "default_runner",
    "prompt_token_limit",
]


class EngineOverloaded(RuntimeError):
    """The queue is full; try again later (HTTP 429)."""

    def __init__(self, queued: int, retry_after_s: float) -> None:
        super().__init__(f"the engine has {queued} requests waiting; try again in {retry_after_s:.0f} s")
        self.retry_after_s = retry_after_s


class EngineClosed(RuntimeError):
    """The engine is shutting down or stopped (HTTP 503)."""


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """How the engine schedules.

    Attributes:
        max_batch: most requests decoded together (slots of the KV cache).
        max_queue: most requests waiting for a slot; more are refused with
            :class:`EngineOverloaded`.
        max_prompt_tokens: longest prompt accepted (default: the model's context minus one).
        prefill_chunk: positions computed per prefill pass while others decode (the
            tokens fed, or, on a runner without ``packs_tokens``, rows x the longest
            chunk). A joining prompt's first token waits for its whole pass, and a prompt
            arriving during a pass for the rest of it: 256 positions are about 0.5 s at
            int8 on two cores under load (512 gave a plain question's p99 time to first
            token above 2 s at 64 clients; prefill was a quarter of the engine's time
            either way).
        decode_positions: positions a decoding step may compute, at least one per row. A
            row feeds its sampled token and the tokens its grammar forces; the pass is
            padded to the longest row (for attention only on a runner that
            ``packs_tokens``), so forced tokens past ``decode_positions // rows``
            wait for the next step (that row does not sample then) instead of making
            every row of a large batch pay for them.
        idle_poll_s: how long the idle engine thread sleeps between checks.
        prefix_cache_bytes: most bytes of keys and values of finished requests kept for
            requests that start the same way (:mod:`~thinkstruct.engine.kv.prefix_cache`: a
            chat's next turn, a repeated system prompt); 0 keeps none.
        check_tries_per_value: most times a value that fails a checked keyword (one no
            grammar enforces: :mod:`~thinkstruct.engine.output.checked_answer`) is generated
            again at one position before the request ends with an error naming it.
        check_tries_per_request: most such retries in one request.
        masks_during_forward: fill grammar masks on a helper thread while the forward pass
            runs (the libraries release the GIL); ``None``: where a core is left over
            beside torch's threads (:func:`~thinkstruct.engine.core.executor.spare_core`), else
            after the pass.
        speculation: n-gram drafts verified in the decoding pass
            (:mod:`~thinkstruct.engine.sampling.speculation`), on a batch-invariant runner only
            (there a seed gives the same tokens with and without); ``None`` turns it off.
    """

    max_batch: int = 8
    max_queue: int = 256
    max_prompt_tokens: int | None = None
    prefill_chunk: int = 256
    decode_positions: int = 64
    idle_poll_s: float = 0.05
    prefix_cache_bytes: int = 1 << 30
    check_tries_per_value: int = 8
    check_tries_per_request: int = 32
    masks_during_forward: bool | None = None
    speculation: SpeculationConfig | None = field(default_factory=SpeculationConfig)

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_queue < 0 or self.prefill_chunk < 1 or self.decode_positions < 1:
            raise ValueError("max_batch, prefill_chunk and decode_positions must be >= 1 and max_queue >= 0")
        if self.prefix_cache_bytes < 0:
            raise ValueError("prefix_cache_bytes must be >= 0")
        if self.check_tries_per_value < 0 or self.check_tries_per_request < 0:
            raise ValueError("check_tries_per_value and check_tries_per_request must be >= 0")


@dataclass
class EngineStats:
    """Counters for monitoring (read from any thread; written by the engine thread)."""

    running: int = 0
    waiting: int = 0
    steps: int = 0
    prefill_tokens: int = 0
    #: Prompt tokens copied from another slot or the prefix cache instead of computed.
    prefix_reused_tokens: int = 0
    #: Of those, from the prefix cache (finished requests' keys and values).
    prefix_cache_hit_tokens: int = 0
    #: Bytes and blocks the prefix cache holds, and blocks it evicted to stay within budget.
    prefix_cache_bytes: int = 0
    prefix_cache_blocks: int = 0
    prefix_cache_evicted_blocks: int = 0
    #: Draft tokens fed for verification, and of those the ones kept (speculation).
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    generated_tokens: int = 0
    jump_forward_tokens: int = 0
    #: Values generated again after failing a checked keyword, and the tokens taken back.
    check_rollbacks: int = 0
    resampled_tokens: int = 0
    finished: dict[str, int] = field(default_factory=lambda: {r.value: 0 for r in FinishReason})
    #: Seconds of the last decoding step, and of all of them; of those, in the forward pass
    #: and waiting for / applying grammar masks after it (the rest: sampling, grammars,
    #: detokenizing, parsing, streaming).
    last_step_s: float = 0.0
    step_seconds: float = 0.0
    forward_seconds: float = 0.0
    mask_seconds: float = 0.0
    last_batch: int = 0
    #: KV cache slots holding a request (running or prefilling) and the tokens cached in
    #: them, as the last round of the engine loop left them; a finished or cancelled
    #: request's slot is free by the end of the round that drops it.
    slots_used: int = 0
    kv_tokens: int = 0


def prompt_token_limit(configured: int | None, context_length: int) -> int:
    """The longest prompt an engine takes: ``configured`` (``None``: no own limit), capped so
    that at least one token can be generated within ``context_length``."""
    return min(configured or context_length - 1, context_length - 1)


def check_request(request: GenerationRequest, *, vocab_size: int, max_prompt_tokens: int) -> None:
    """What :meth:`Engine.submit` refuses, checked without an engine (a cluster's ingress
    checks here before sending a request to a replica).

    Raises:
        ValueError: empty or too long prompt, ids outside the vocabulary, a negative
            thinking budget; the message names the problem.
        InvalidSamplingParam: a ``logit_bias`` id outside the vocabulary.
    """
    prompt = request.prompt_ids
    if not prompt:
        raise ValueError("the prompt is empty")
    if len(prompt) > max_prompt_tokens:
        raise ValueError(f"the prompt has {len(prompt)} tokens; this model takes at most {max_prompt_tokens}")
    if any(not 0 <= t < vocab_size for t in prompt):
        raise ValueError(f"prompt token ids must be in [0, {vocab_size})")
    for token, _ in request.sampling.logit_bias:
        if token >= vocab_size:
            raise InvalidSamplingParam(
                f"logit_bias.{token}", f"logit_bias.{token}: token ids must be in [0, {vocab_size})"
            )
    if request.max_reasoning_tokens is not None and request.max_reasoning_tokens < 0:
        raise ValueError("max_reasoning_tokens must be >= 0")


class Engine:
    """Continuous batching over one model, one thread.

    Args:
        model: the loaded model (:func:`~thinkstruct.engine.model.loading.load_model`).
        config: scheduling limits.
        compiler: the grammar compiler requests' constraints were compiled with (the
            engine does not compile; :attr:`compiler` is offered to callers). Default: one
            over the model's tokenizer with default settings.
        runner: a custom :class:`~thinkstruct.engine.runners.runner.ModelRunner` (default:
            :func:`default_runner` over ``model.model``).
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
        family = model.family
        self._end_tag = family.think_end
        self._end_tag_matcher = end_tag_matcher(self.tokenizer, family.think_end)
        self._banned_while_thinking = tuple(
            sorted({i for text in family.banned_while_thinking for i in _single_id(self.tokenizer, text)})
        )
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._submitted: collections.deque[Sequence] = collections.deque()
        self._closing = False
        self._thread: threading.Thread | None = None
        self._scheduler: Scheduler | None = None
        self._executor: Executor | None = None
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
                vocabulary, a grammar for another tokenizer); the message names the problem.
            EngineOverloaded: the queue is full.
            EngineClosed: the engine is not running.
        """
        check_request(request, vocab_size=self.tokenizer.vocab_size, max_prompt_tokens=self.max_prompt_tokens)
        grammar = request.grammar
        if grammar is not None and not isinstance(grammar, concurrent.futures.Future):
            self._check_grammar(grammar)
        handle = RequestHandle(request.request_id, loop)
        output = OutputProcessor(
            request, texts=self._texts, end_tag=self._end_tag_matcher, stop_ids=self._stop_ids
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
            self._submitted.append(seq)
            self._wake.notify()
        return handle

    def _check_grammar(self, grammar: CompiledGrammar) -> None:
        if grammar.tokenizer is not self.tokenizer:
            raise ValueError("the grammar was compiled for another tokenizer")

    def _matcher(self, request: GenerationRequest) -> GrammarMatcher | None:
        """The request's token matcher: its grammar's (thought included), the thinking
        budget's for free text that reasons under a budget, else none; a stop token in
        the thought ends the thought, not the response. Its grammar must be ready
        (compiled, not still a future)."""
        grammar = request.grammar
        if isinstance(grammar, concurrent.futures.Future):
            grammar = grammar.result()
        if grammar is None:
            if request.reasoning and request.max_reasoning_tokens is not None:
                return thinking_budget_matcher(
                    self.tokenizer,
                    max_reasoning_tokens=request.max_reasoning_tokens,
                    end_tag=self._end_tag,
                    banned_ids_while_thinking=self._banned_while_thinking,
                )
            return None
        self._check_grammar(grammar)
        return grammar.matcher(
            reasoning=request.reasoning,
            max_reasoning_tokens=request.max_reasoning_tokens,
            stops_end_thought=True,
            banned_ids_while_thinking=self._banned_while_thinking,
            end_tag=self._end_tag,
        )

    def _admitted(self, seq: Sequence) -> None:
        """A request takes a slot: build its matcher (its grammar is ready now)."""
        try:
            seq.matcher = self._matcher(seq.request)
            grammar = seq.grammar
        except Exception as e:  # noqa: BLE001 - a failed compile or a foreign grammar ends this request only
            self._finish(seq, FinishReason.ERROR, f"the grammar is not usable: {e}")
            return
        if grammar is not None and grammar.checks is not None:
            calls = seq.request.tool_calls
            seq.checked = CheckedAnswer(
                grammar.checks,
                texts=self._texts,
                end_tag=self._end_tag_matcher,
                thinking=seq.request.reasoning,
                stop_ids=self._stop_ids,
                names=None if calls is None else calls.names,
            )
            seq.drafter = None  # a draft would run past a value before it is checked

    def _retry_after_s(self) -> float:
        steps = max(self.stats.steps, 1)
        per_step = self.stats.step_seconds / steps if self.stats.step_seconds else 0.05
        return max(1.0, min(60.0, per_step * 64))

    # ---- the engine thread -----------------------------------------------------------

    def _main(self, ready: threading.Event, failure: list[BaseException]) -> None:
        try:
            runner = self._given_runner or default_runner(
                self.model.model,
                slots=self.config.max_batch,
                context_length=self.context_length,
                vocab_size=self.tokenizer.vocab_size,
            )
            self._scheduler = Scheduler(
                max_batch=self.config.max_batch,
                prefill_chunk=self.config.prefill_chunk,
                decode_positions=self.config.decode_positions,
                packs_tokens=runner.packs_tokens,
            )
            self._executor = Executor(
                runner,
                max_batch=self.config.max_batch,
                vocab_size=self.tokenizer.vocab_size,
                context_length=self.context_length,
                stop_ids=self._stop_ids,
                prefix_cache_bytes=self.config.prefix_cache_bytes,
                speculation=self.config.speculation,
                masks_during_forward=spare_core()
                if self.config.masks_during_forward is None
                else self.config.masks_during_forward,
                stats=self.stats,
                record=self._record,
                finish=self._finish,
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
        if self._on_step is not None:
            self._on_step()
        return True

    def _prefill_step(self, scheduler: Scheduler, executor: Executor) -> None:
        """Admit waiting requests into free slots and feed the next prompt chunks; the
        requests whose prompt is complete sample their first token and decode."""
        if not self._closing:
            scheduler.admit(self._admitted)
        plan = scheduler.prefill_plan(lambda seq: executor.reuse_prefix(seq, scheduler.held))
        if plan is None:
            return
        joining = executor.prefill(plan)
        if joining:
            scheduler.started(joining)
            self._layout()

    def _decode_step(self, plan: DecodePlan, scheduler: Scheduler, executor: Executor) -> None:
        started = time.perf_counter()
        forward_s, mask_s = executor.decode(plan)
        self._layout()
        elapsed = time.perf_counter() - started
        self.stats.forward_seconds += forward_s
        self.stats.mask_seconds += mask_s
        self.stats.steps += 1
        self.stats.last_step_s = elapsed
        self.stats.step_seconds += elapsed
        self.stats.last_batch = len(plan.rows)

    def _layout(self) -> None:
        """Finished rows leave (their KV to the prefix cache); the others are laid out."""
        scheduler, executor = self._scheduler, self._executor
        if scheduler is None or executor is None:
            return
        moves = scheduler.layout(executor.keep_prefix)
        executor.move(moves, held=len(scheduler.held))
        self.stats.running = len(scheduler.decoding)

    # ---- the output side ---------------------------------------------------------------

    def _record(
        self, seq: Sequence, tokens: list[int], *, forced: int, logprob: SampledLogprob | None, stop: bool
    ) -> None:
        """Tokens a row settled (sampled, then forced): its output processor turns them
        into a delta (or, while a checked value is open, later: a value that fails is
        taken back and drawn again); the row ends at a stop, a stop string,
        ``max_tokens`` or the context."""
        seq.generated_ids.extend(t for t in tokens if t not in self._stop_ids)
        self.stats.generated_tokens += len(tokens)
        self.stats.jump_forward_tokens += forced
        if seq.checked is None:
            delta = seq.output.add(tokens, forced=forced, logprob=logprob, allowed=seq.allowed_now)
            if delta is not None:
                seq.handle.emit(delta)
        else:
            settled = seq.checked.settle(tokens, forced=forced, logprob=logprob, allowed=seq.allowed_now)
            if settled.undo is not None:
                self._undo(seq, settled.undo)
                return
            self._release(seq, settled.release)
        if stop or seq.stopped_by_string:
            self._finish(seq, FinishReason.STOP)
        elif seq.generated >= seq.params.max_tokens or seq.cached + len(tokens) >= self.context_length:
            self._finish(seq, FinishReason.LENGTH)

    def _release(self, seq: Sequence, settled: list[SettledToken]) -> None:
        """Hand tokens a check no longer holds back to the output processor."""
        for item in settled:
            delta = seq.output.add(
                [item.token], forced=0 if item.sampled else 1, logprob=item.logprob, allowed=item.allowed
            )
            if delta is not None:
                seq.handle.emit(delta)

    def _undo(self, seq: Sequence, undo: Undo) -> None:
        """Take back a value that failed its check: the grammar, the generated tokens
        and the KV return to its first drawn token, which is banned there; the row draws
        again at the next step. Out of tries (or nothing left to change), the request
        ends with an error naming the keyword and the JSON pointer."""
        seq.check_failure = undo.failure
        position = seq.position - undo.tokens
        tries = len(seq.bans.get(position, ()))
        config = self.config
        if (
            not undo.possible
            or seq.matcher is None
            or tries >= config.check_tries_per_value
            or seq.rollbacks >= config.check_tries_per_request
        ):
            self._finish(seq, FinishReason.ERROR, f"the answer could not meet {undo.failure.describe()}")
            return
        seq.matcher.rollback(undo.grammar_tokens)
        taken = seq.generated_ids[len(seq.generated_ids) - undo.tokens :]
        del seq.generated_ids[len(seq.generated_ids) - undo.tokens :]
        if seq.adjustments is not None:
            seq.adjustments.remove(taken)
        # Feed the last kept token again: its logits are where the next draw comes from.
        seq.cached = position - 1
        seq.pending = [seq.context[position - 1]]
        seq.bans.setdefault(position, set()).add(undo.banned)
        seq.rollbacks += 1
        seq.resampled_tokens += undo.tokens
        self.stats.check_rollbacks += 1
        self.stats.resampled_tokens += undo.tokens

    def _finish(self, seq: Sequence, reason: FinishReason, error: str | None = None) -> None:
        seq.end(reason, error)
        if not seq.handle.finished:
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
            )
        except Exception as e:  # noqa: BLE001 - the parser or detokenizer failed at the very end
            delta = Delta(finish_reason=FinishReason.ERROR, error=f"internal error finishing: {e}")
        self.stats.finished[delta.finish_reason.value if delta.finish_reason else "error"] += 1
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


def _single_id(tokenizer: Tokenizer, text: str) -> tuple[int, ...]:
    """The id of ``text`` if it is one token of the vocabulary, else nothing."""
    hf = tokenizer.hf
    token_id = hf.convert_tokens_to_ids(text)
    unk = getattr(hf, "unk_token_id", None)
    if isinstance(token_id, int) and token_id != unk and hf.convert_ids_to_tokens(token_id) == text:
        return (token_id,)
    return ()
