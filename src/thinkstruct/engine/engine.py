"""The serving loop: :class:`Engine`.

One long-lived engine thread does all torch work (torch on two threads at once made
matmuls 1.5x slower on two cores). Callers submit requests from any thread; the engine
thread runs continuous batching over the slots of one KV cache:

1. admit: queued requests take free slots; joining requests' prompts are prefilled into
   their own slots, shortest first (one passed over too long goes first), several in
   one pass of at most :attr:`EngineConfig.prefill_chunk` positions between two
   decoding steps, so running requests keep their pace;
2. decode: one forward pass over every running row (a row may feed several tokens: its
   sampled token plus those its grammar forces, up to
   :attr:`EngineConfig.decode_positions` positions for the pass); while it runs, a helper
   thread fills the grammar bitmask rows (the grammar libraries release the GIL);
3. apply the masks, sample each row with its own parameters and generator, feed the
   grammars, append forced tokens (jump-forward), detokenize, split reasoning from
   content, emit deltas;
4. finished rows leave; the running row in the highest slot moves into each hole (its KV
   row copied), so the running batch is always slots ``0..n-1``.

A failure in one request's own path (its grammar, its sampling, its parser) ends that
request with ``finish_reason="error"``; the batch and the engine go on.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from thinkstruct.engine.cpu_kernels import cpu_kernels
from thinkstruct.engine.decoder_runner import DecoderRunner, supports
from thinkstruct.engine.detokenizer import TokenTexts
from thinkstruct.engine.free_text import thinking_budget_matcher
from thinkstruct.engine.handle import RequestHandle
from thinkstruct.engine.logit_adjustments import adjust_logits
from thinkstruct.engine.logprobs import LogprobTable
from thinkstruct.engine.prefix_cache import PrefixCache
from thinkstruct.engine.request import Delta, FinishReason, GenerationRequest, InvalidSamplingParam
from thinkstruct.engine.runner import ModelRunner, TransformersRunner
from thinkstruct.engine.sampler import sample
from thinkstruct.engine.sequence import Sequence
from thinkstruct.engine.speculation import NgramDrafter, SpeculationConfig
from thinkstruct.grammar.runtime.bitmask import TokenBitmask, allowed_count, apply_bitmask_inplace

if TYPE_CHECKING:
    from thinkstruct.engine.models import LoadedModel
    from thinkstruct.grammar.base import GrammarMatcher
    from thinkstruct.grammar.service.compiler import GrammarCompiler
    from thinkstruct.tokenizer import Tokenizer

log = logging.getLogger("thinkstruct.engine")


#: Seconds a prompt may be passed over by shorter ones; after that it goes ahead of every
#: prompt that has waited less, oldest first. Below it the order is shortest first: a
#: burst of prompts takes seconds to prefill on two cores (measured, 64 streaming clients
#: joining over 10 s: 28 prompts waiting, about 7 s of prefill), and when a wait counted
#: linearly against a prompt's length (256, then 32 tokens a second) every prompt of the
#: backlog had aged past a fresh 35-token question, which then waited behind up to nine
#: passes of older, twice-as-long schema prompts.
PREFILL_PATIENCE_S = 5.0

#: Shortest shared prompt prefix worth a slot copy (a copy of a few positions costs about
#: what computing them does).
MIN_REUSED_PREFIX = 4


def default_runner(model: object, *, slots: int, context_length: int, vocab_size: int) -> ModelRunner:
    """:class:`~thinkstruct.engine.decoder_runner.DecoderRunner` for the models its
    architecture registry computes exactly (fewer operations per step), the transformers
    runner for any other."""
    reason = supports(model, context_length=context_length)
    if reason is None:
        return DecoderRunner(model, slots=slots, context_length=context_length, vocab_size=vocab_size)
    log.info("transformers runner (not the decoder runner: %s)", reason)
    return TransformersRunner(model, slots=slots, context_length=context_length, vocab_size=vocab_size)


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
            requests that start the same way (:mod:`~thinkstruct.engine.prefix_cache`: a
            chat's next turn, a repeated system prompt); 0 keeps none.
        speculation: n-gram drafts verified in the decoding pass
            (:mod:`~thinkstruct.engine.speculation`), on a batch-invariant runner only
            (there a seed gives the same tokens with and without); ``None`` turns it off.
    """

    max_batch: int = 8
    max_queue: int = 256
    max_prompt_tokens: int | None = None
    prefill_chunk: int = 256
    decode_positions: int = 64
    idle_poll_s: float = 0.05
    prefix_cache_bytes: int = 1 << 30
    speculation: SpeculationConfig | None = field(default_factory=SpeculationConfig)

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_queue < 0 or self.prefill_chunk < 1 or self.decode_positions < 1:
            raise ValueError("max_batch, prefill_chunk and decode_positions must be >= 1 and max_queue >= 0")
        if self.prefix_cache_bytes < 0:
            raise ValueError("prefix_cache_bytes must be >= 0")


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
        model: the loaded model (:func:`~thinkstruct.engine.models.load_model`).
        config: scheduling limits.
        compiler: the grammar compiler requests' constraints were compiled with (the
            engine does not compile; :attr:`compiler` is offered to callers). Default: one
            over the model's tokenizer with default settings.
        runner: a custom :class:`~thinkstruct.engine.runner.ModelRunner` (default:
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
        self._runner = runner
        self.context_length = model.context_length
        self.max_prompt_tokens = prompt_token_limit(self.config.max_prompt_tokens, self.context_length)
        self.stats = EngineStats()
        self._texts = TokenTexts(self.tokenizer)
        self._stop_ids = frozenset(self.tokenizer.eos_token_ids)
        family = model.family
        self._end_tag = family.think_end
        self._banned_while_thinking = tuple(
            sorted({i for text in family.banned_while_thinking for i in _single_id(self.tokenizer, text)})
        )
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._submitted: collections.deque[Sequence] = collections.deque()
        self._closing = False
        self._thread: threading.Thread | None = None
        self._running: list[Sequence] = []
        self._waiting: collections.deque[Sequence] = collections.deque()
        self._prefilling: list[Sequence] = []
        self._masks: TokenBitmask | None = None
        self._mask_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="thinkstruct-masks")
        self._prefix_cache = PrefixCache(max_bytes=self.config.prefix_cache_bytes)
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
        self._mask_pool.shutdown(wait=False)

    def __enter__(self) -> Engine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- submitting ------------------------------------------------------------------

    def submit(
        self, request: GenerationRequest, *, loop: asyncio.AbstractEventLoop | None = None
    ) -> RequestHandle:
        """Queue a request; its deltas arrive on the returned handle.

        Raises:
            ValueError: the request cannot run (empty or too long prompt, ids outside the
                vocabulary); the message names the problem.
            EngineOverloaded: the queue is full.
            EngineClosed: the engine is not running.
        """
        check_request(request, vocab_size=self.tokenizer.vocab_size, max_prompt_tokens=self.max_prompt_tokens)
        handle = RequestHandle(request.request_id, loop)
        matcher = self._matcher(request)
        seq = Sequence(
            request,
            handle,
            texts=self._texts,
            matcher=matcher,
            stop_ids=self._stop_ids,
            submitted_at=time.monotonic(),
        )
        if self.config.speculation is not None:
            seq.drafter = NgramDrafter(request.prompt_ids, self.config.speculation)
        with self._lock:
            if self._closing or self._thread is None or not self._thread.is_alive():
                raise EngineClosed("the engine is not running")
            queued = len(self._submitted) + self.stats.waiting
            if queued >= self.config.max_queue:
                raise EngineOverloaded(queued, retry_after_s=self._retry_after_s())
            self._submitted.append(seq)
            self._wake.notify()
        return handle

    def _matcher(self, request: GenerationRequest) -> GrammarMatcher | None:
        if request.grammar is None:
            if request.reasoning and request.max_reasoning_tokens is not None:
                return thinking_budget_matcher(
                    self.tokenizer,
                    max_reasoning_tokens=request.max_reasoning_tokens,
                    end_tag=self._end_tag,
                    banned_ids_while_thinking=self._banned_while_thinking,
                )
            return None
        if request.grammar.tokenizer is not self.tokenizer:
            raise ValueError("the grammar was compiled for another tokenizer")
        return request.grammar.matcher(
            reasoning=request.reasoning,
            max_reasoning_tokens=request.max_reasoning_tokens,
            banned_ids_while_thinking=self._banned_while_thinking,
            end_tag=self._end_tag,
        )

    def _retry_after_s(self) -> float:
        steps = max(self.stats.steps, 1)
        per_step = self.stats.step_seconds / steps if self.stats.step_seconds else 0.05
        return max(1.0, min(60.0, per_step * 64))

    # ---- the engine thread -----------------------------------------------------------

    def _main(self, ready: threading.Event, failure: list[BaseException]) -> None:
        try:
            if self._runner is None:
                self._runner = default_runner(
                    self.model.model,
                    slots=self.config.max_batch,
                    context_length=self.context_length,
                    vocab_size=self.tokenizer.vocab_size,
                )
            self._masks = TokenBitmask(self.config.max_batch, self.tokenizer.vocab_size)
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
        with self._lock:
            while self._submitted:
                self._waiting.append(self._submitted.popleft())
            if self._closing and (not self._has_work() or time.monotonic() >= self._grace_deadline):
                return False
            if not self._has_work():
                self._wake.wait(self.config.idle_poll_s)
                return True
            self.stats.waiting = len(self._waiting)
        try:
            self._drop_cancelled()
            self._prefill_step()
            if self._running:
                self._decode_step()
        except Exception as e:  # a failure of the whole forward pass: end its rows, go on
            log.exception("engine step failed")
            for seq in [*self._running, *self._prefilling]:
                self._finish(seq, FinishReason.ERROR, f"internal error in the model step: {e}")
            self._compact()
        self.stats.running = len(self._running)
        held = [*self._running, *self._prefilling]
        self.stats.slots_used = len(held)
        self.stats.kv_tokens = sum(s.cached for s in held)
        if self._on_step is not None:
            self._on_step()
        return True

    def _has_work(self) -> bool:
        return bool(self._running or self._waiting or self._prefilling)

    # ---- admission and prefill ---------------------------------------------------------

    def _prefill_step(self) -> None:
        """Admit waiting requests into free slots and feed the next prompt chunks of every
        request still prefilling, together in one pass of at most ``prefill_chunk``
        tokens; requests whose prompt is complete sample their first token and run."""
        runner = self._runner
        assert runner is not None
        while (
            self._waiting
            and not self._closing
            and len(self._running) + len(self._prefilling) < self.config.max_batch
        ):
            seq = self._waiting.popleft()
            seq.slot = len(self._running) + len(self._prefilling)
            seq.cached = 0
            self._prefilling.append(seq)
        if not self._prefilling:
            return
        self._order_prefills()
        # Each prompt is cut at multiples of prefill_chunk whatever else is prefilling, so
        # a request's own computation never depends on the others (with batch-invariant
        # kernels, a seed then gives the same tokens in any batch); rows join a pass in
        # the order above while their next chunk fits the pass's token budget.
        size = self.config.prefill_chunk
        rows: list[Sequence] = []
        chunks: list[list[int]] = []
        width = fed = 0
        for seq in self._prefilling:
            if seq.cached == 0:
                # Now, not at admission: the order above renumbers only prompts holding
                # no KV, and a prompt that reuses a prefix here is in this pass or the
                # next to start.
                self._reuse_prefix(seq)
            chunk = seq.pending[:size]
            # What the pass computes: its tokens, or (a runner that pads) rows x its longest.
            cost = fed + len(chunk) if runner.packs_tokens else (len(rows) + 1) * max(width, len(chunk))
            if rows and cost > size:
                break
            width = max(width, len(chunk))
            fed += len(chunk)
            rows.append(seq)
            chunks.append(chunk)
        first = rows[0].slot
        logits = runner.forward(first, chunks, [s.cached for s in rows])
        done: list[int] = []
        for i, (seq, chunk) in enumerate(zip(rows, chunks, strict=True)):
            seq.cached += len(chunk)
            del seq.pending[: len(chunk)]
            self.stats.prefill_tokens += len(chunk)
            if not seq.pending:
                done.append(i)
        if not done:
            return
        joining = [rows[i] for i in done]
        logits = logits[done]
        constrained = [j for j, seq in enumerate(joining) if seq.matcher is not None]
        if constrained:
            masks = self._masks_for(len(joining))
            for j in constrained:
                self._fill_one(joining[j], masks, j)
            live = [j for j in constrained if joining[j].finish_reason is None]
            if live:
                _apply_rows(logits, masks, live)
        self._prefilling = [s for s in self._prefilling if s not in joining]
        self._running.extend(joining)
        self._sample_and_advance(joining, logits)
        self._compact()

    def _reuse_prefix(self, seq: Sequence) -> None:
        """Copy the longest prefix of ``seq``'s prompt that another slot holds (a shared
        system prompt, chat template, tool list, or the same prompt for ``n`` > 1) or the
        prefix cache holds (a finished request's: a chat's previous turn) into its slot,
        where it is at least :data:`MIN_REUSED_PREFIX` tokens; at least the prompt's last
        token is still computed (its logits give the first token).

        On a batch-invariant runner what is copied is the same bits as computing it; on
        others, what an earlier pass computed (equal within rounding)."""
        assert self._runner is not None
        prompt = seq.request.prompt_ids
        best: Sequence | None = None
        length = MIN_REUSED_PREFIX - 1
        for donor in (*self._running, *self._prefilling):
            if donor is seq or donor.cached <= length:
                continue
            limit = min(donor.cached, donor.prompt_tokens, len(prompt) - 1)
            shared = _common_prefix(prompt, donor.request.prompt_ids, limit)
            if shared > length:
                best, length = donor, shared
        stored = self._prefix_cache.match(prompt, limit=len(prompt) - 1)
        if stored.kv is not None and stored.tokens > length:
            self._runner.write_kv(seq.slot, 0, stored.kv)
            length = stored.tokens
            self.stats.prefix_cache_hit_tokens += length
        elif best is not None:
            self._runner.copy_slot(best.slot, seq.slot, length)
        else:
            return
        seq.cached = length
        del seq.pending[:length]
        seq.cached_prompt_tokens = length
        self.stats.prefix_reused_tokens += length

    def _order_prefills(self) -> None:
        """Shortest remaining prompt first among the prompts not started, except that a
        prompt waiting :data:`PREFILL_PATIENCE_S` or more goes ahead of the others, oldest
        first (so a long prompt is not passed over forever). A short chat question then
        does not wait behind long schema prompts' seconds of prefill, and prompts of like
        length share passes (less padding). A started prompt (its KV in its slot) stays
        first; the others hold no KV yet, so their slots are simply renumbered."""
        fresh = [s for s in self._prefilling if s.cached == 0]
        if len(fresh) < 2:
            return
        overdue = time.monotonic() - PREFILL_PATIENCE_S

        def order(s: Sequence) -> tuple[bool, int, float]:
            waited_long = s.submitted_at <= overdue
            return (not waited_long, 0 if waited_long else len(s.pending), s.submitted_at)

        fresh.sort(key=order)
        started = [s for s in self._prefilling if s.cached]
        self._prefilling = started + fresh
        for slot, seq in enumerate(fresh, start=len(self._running) + len(started)):
            seq.slot = slot

    # ---- decoding ----------------------------------------------------------------------

    def _decode_step(self) -> None:
        runner = self._runner
        assert runner is not None
        rows = self._running
        started = time.perf_counter()
        width = max(self.config.decode_positions, len(rows)) // len(rows)  # at least 1
        feeds = [s.pending[:width] for s in rows]
        # Rows with forced tokens left over feed them next step and sample then.
        ready = [i for i, s in enumerate(rows) if len(s.pending) <= width]
        drafts = self._drafts(rows, ready, feeds, width)
        masks = self._masks_for(len(rows))
        constrained = [i for i in ready if rows[i].matcher is not None]
        fill = self._mask_pool.submit(self._fill_rows, rows, constrained, masks) if constrained else None
        tail = [1 + len(d) for d in drafts] if any(drafts) else None
        logits = runner.forward(
            0, [f + d for f, d in zip(feeds, drafts, strict=True)], [s.cached for s in rows], tail=tail
        )
        forwarded = time.perf_counter()
        for s, fed in zip(rows, feeds, strict=True):
            s.cached += len(fed)
            del s.pending[: len(fed)]
        if tail is not None:
            # Each row's first logits (after its own tokens) come first; the rest verify its draft.
            firsts = [0, *itertools.accumulate(tail)][:-1]
            drafted, logits = logits, logits[firsts]
        if fill is not None:
            fill.result()
            live = [i for i in constrained if rows[i].finish_reason is None]
            if live:
                _apply_rows(logits, masks, live)
        masked = time.perf_counter()
        if len(ready) == len(rows):
            self._sample_and_advance(rows, logits)
        else:
            self._sample_and_advance([rows[i] for i in ready], logits[ready])
        if tail is not None:
            self._verify_drafts(rows, drafts, drafted, firsts)
        self._compact()
        elapsed = time.perf_counter() - started
        self.stats.forward_seconds += forwarded - started
        self.stats.mask_seconds += masked - forwarded
        self.stats.steps += 1
        self.stats.last_step_s = elapsed
        self.stats.step_seconds += elapsed
        self.stats.last_batch = len(rows)

    def _drafts(
        self, rows: list[Sequence], ready: list[int], feeds: list[list[int]], width: int
    ) -> list[list[int]]:
        """Each row's n-gram draft for this step (none where speculation does not pay or
        is off): within the step's positions, ``max_tokens`` and the context, cut at a
        stop token and at the first token the grammar refuses."""
        drafts: list[list[int]] = [[] for _ in rows]
        config = self.config.speculation
        runner = self._runner
        if config is None or runner is None or not runner.batch_invariant or len(rows) > config.max_batch:
            return drafts
        for i in ready:
            seq = rows[i]
            if seq.drafter is None or seq.finish_reason is not None:
                continue
            room = min(
                width - len(feeds[i]),
                seq.params.max_tokens - seq.generated - 1,
                self.context_length - seq.cached - len(feeds[i]) - 1,
            )
            draft = seq.drafter.propose(room)
            for k, token in enumerate(draft):
                if token in self._stop_ids:
                    draft = draft[:k]
                    break
            if draft and seq.matcher is not None:
                try:
                    draft = draft[: seq.matcher.validate_tokens(draft)]
                except Exception:  # noqa: BLE001 - no draft then; the row decodes as usual
                    draft = []
            drafts[i] = draft
        return drafts

    def _verify_drafts(
        self, rows: list[Sequence], drafts: list[list[int]], logits: torch.Tensor, firsts: list[int]
    ) -> None:
        """Keep each row's draft tokens while they are what the row samples there.

        Position ``j`` of a row's draft was fed after ``j`` draft tokens; the token the row
        sampled at ``j`` (from the logits before it, one draw of its own generator, as
        without a draft) either equals draft token ``j`` (its keys and values are already
        in the slot: keep it and sample at ``j + 1``) or replaces it (fed next step; the
        slot's positions past it are simply overwritten)."""
        active = [i for i, d in enumerate(drafts) if d]
        kept = dict.fromkeys(active, 0)
        j = 0
        while active:
            still = []
            for i in active:
                seq, draft = rows[i], drafts[i]
                if seq.finish_reason is None and seq.pending == [draft[j]]:
                    seq.cached += 1  # fed as draft token j
                    seq.pending = []
                    kept[i] += 1
                    still.append(i)
            j += 1
            if not still:
                break
            view = logits[[firsts[i] + j for i in still]]
            constrained = [k for k, i in enumerate(still) if rows[i].matcher is not None]
            if constrained:
                masks = self._masks_for(len(still))
                for k in constrained:
                    self._fill_one(rows[still[k]], masks, k)
                live = [k for k in constrained if rows[still[k]].finish_reason is None]
                if live:
                    _apply_rows(view, masks, live)
            self._sample_and_advance([rows[i] for i in still], view)
            active = [i for i in still if j < len(drafts[i])]
        for i, n in kept.items():
            seq = rows[i]
            if seq.drafter is not None:
                seq.drafter.record(len(drafts[i]), n)
            self.stats.draft_tokens += len(drafts[i])
            self.stats.accepted_draft_tokens += n

    def _masks_for(self, rows: int) -> torch.Tensor:
        assert self._masks is not None
        return self._masks.rows(rows)

    def _fill_rows(self, rows: list[Sequence], indices: list[int], masks: torch.Tensor) -> None:
        for i in indices:
            self._fill_one(rows[i], masks, i)

    def _fill_one(self, seq: Sequence, masks: torch.Tensor, row: int) -> None:
        try:
            seq.matcher.fill_bitmask(masks, row)  # type: ignore[union-attr]
            if seq.allowed_counts is not None:
                seq.allowed_now = allowed_count(masks[row], self.tokenizer.vocab_size)
        except Exception as e:  # noqa: BLE001 - this request fails with the message, the batch goes on
            seq.finish_reason = FinishReason.ERROR
            seq.error = f"the grammar failed to compute its mask: {e}"

    def _sample_and_advance(self, rows: list[Sequence], logits: torch.Tensor) -> None:
        """Sample one token per live row, feed it (and forced tokens) on, emit deltas."""
        live = [i for i, s in enumerate(rows) if s.finish_reason is None]
        for s in rows:
            if s.finish_reason is not None and not s.handle.finished:
                self._emit_finish(s)
        if not live:
            return
        params = [rows[i].params for i in live]
        gens = [rows[i].generator for i in live]
        view = logits if len(live) == logits.shape[0] else logits[live]
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
            try:
                self._advance(seq, token, None if table is None or token < 0 else table.entry(j, token))
            except Exception as e:  # this request's own path failed
                log.exception("request %s failed", seq.request.request_id)
                self._finish(seq, FinishReason.ERROR, f"internal error in this request: {e}")

    def _advance(
        self, seq: Sequence, token: int, logprob: tuple[float, tuple[tuple[int, float], ...]] | None = None
    ) -> None:
        if token < 0:
            self._finish(seq, FinishReason.ERROR, "the grammar allows no next token")
            return
        matcher = seq.matcher
        forced: list[int] = []
        stop = False
        if matcher is not None:
            if not matcher.accept_token(token):
                self._finish(seq, FinishReason.ERROR, f"the grammar rejected the sampled token {token}")
                return
            # A stop token ends the output even where the matcher lets the model stop
            # inside its thought (free text under a thinking budget).
            if matcher.is_terminated() or token in self._stop_ids:
                stop = True
            else:
                # Forced tokens count against max_tokens and must fit in the context.
                budget = min(seq.params.max_tokens - seq.generated - 1, self.context_length - seq.cached - 1)
                forced = matcher.jump_forward()[:budget] if budget > 0 else []
                if forced:
                    accepted = matcher.accept_tokens(forced)
                    forced = forced[:accepted]
        elif token in self._stop_ids:
            stop = True
        if matcher is None:
            seq.allowed_now = self.tokenizer.vocab_size
        new = [token, *forced]
        if seq.drafter is not None:
            seq.drafter.extend(new)
        delta = seq.add_tokens(new, forced=len(forced), logprob=logprob)
        self.stats.generated_tokens += len(new)
        self.stats.jump_forward_tokens += len(forced)
        if delta is not None:
            seq.handle.emit(delta)
        seq.pending = [] if stop else new
        if stop or seq.stopped_by_string:
            self._finish(seq, FinishReason.STOP)
        elif seq.generated >= seq.params.max_tokens or seq.cached + len(new) >= self.context_length:
            self._finish(seq, FinishReason.LENGTH)

    # ---- leaving -----------------------------------------------------------------------

    def _finish(self, seq: Sequence, reason: FinishReason, error: str | None = None) -> None:
        if seq.finish_reason is None:
            seq.finish_reason = reason
            seq.error = error
        if not seq.handle.finished:
            self._emit_finish(seq)

    def _emit_finish(self, seq: Sequence) -> None:
        reason = seq.finish_reason or FinishReason.ERROR
        try:
            delta = seq.finish(reason, seq.error)
        except Exception as e:  # noqa: BLE001 - the parser or detokenizer failed at the very end
            delta = Delta(finish_reason=FinishReason.ERROR, error=f"internal error finishing: {e}")
        self.stats.finished[delta.finish_reason.value if delta.finish_reason else "error"] += 1
        seq.handle.emit(delta)

    def _drop_cancelled(self) -> None:
        for seq in [*self._running, *self._waiting, *self._prefilling]:
            if seq.handle.cancelled and seq.finish_reason is None:
                self._finish(seq, FinishReason.ABORT, "cancelled")
        self._waiting = collections.deque(s for s in self._waiting if s.finish_reason is None)
        self._compact()

    def _compact(self) -> None:
        """Drop finished rows; lay the others out as running rows in slots ``0..n-1``, then
        the prefilling ones.

        A running row that leaves is replaced by the running row in the highest slot (one
        KV copy per row that leaves, not one per row after it: moving every later row down
        cost ~3 ms a row, 0.2 s when the first of 64 left). Prefilling rows keep their
        order and only move down: a row that starts running is always the lowest of them
        (a prompt that is not complete fills its pass alone), so the running rows are
        below all of them.
        """
        runner = self._runner
        assert runner is not None
        for seq in (*self._running, *self._prefilling):
            if seq.finish_reason is not None:
                self._keep_prefix(seq)
        running = [s for s in self._running if s.finish_reason is None]
        self._prefilling = [s for s in self._prefilling if s.finish_reason is None]
        n = len(running)
        holes = sorted({*range(n)} - {s.slot for s in running})
        movers = sorted((s for s in running if s.slot >= n), key=lambda s: s.slot)
        for seq, hole in zip(movers, holes, strict=True):
            runner.copy_slot(seq.slot, hole, seq.cached)
            seq.slot = hole
        self._running = sorted(running, key=lambda s: s.slot)
        self.stats.running = n
        for target, seq in enumerate(self._prefilling, start=n):
            if seq.slot != target:
                if seq.slot < target:
                    raise RuntimeError(f"row order broken: slot {seq.slot} would move up to {target}")
                runner.copy_slot(seq.slot, target, seq.cached)
                seq.slot = target

    def _keep_prefix(self, seq: Sequence) -> None:
        """Hand the positions a leaving row's slot holds to the prefix cache (before
        another row moves into the slot)."""
        runner = self._runner
        assert runner is not None
        if seq.slot < 0 or seq.cached <= 0:
            return
        tokens = [*seq.request.prompt_ids, *seq.output_ids][: seq.cached]
        slot = seq.slot
        self._prefix_cache.insert(tokens, lambda start, stop: runner.read_kv(slot, start, stop))
        cache = self._prefix_cache
        self.stats.prefix_cache_bytes = cache.bytes
        self.stats.prefix_cache_blocks = cache.blocks
        self.stats.prefix_cache_evicted_blocks = cache.evicted

    def _abort_all(self, why: str, *, reason: FinishReason = FinishReason.ABORT) -> None:
        with self._lock:
            pending = list(self._submitted)
            self._submitted.clear()
        for seq in [*self._running, *self._waiting, *pending, *self._prefilling]:
            if seq.finish_reason is None:
                self._finish(seq, reason, why)
        self._running = []
        self._waiting.clear()
        self._prefilling = []
        self.stats.running = self.stats.slots_used = self.stats.kv_tokens = 0


def _common_prefix(a: collections.abc.Sequence[int], b: collections.abc.Sequence[int], limit: int) -> int:
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


def _single_id(tokenizer: Tokenizer, text: str) -> tuple[int, ...]:
    """The id of ``text`` if it is one token of the vocabulary, else nothing."""
    hf = tokenizer.hf
    token_id = hf.convert_tokens_to_ids(text)
    unk = getattr(hf, "unk_token_id", None)
    if isinstance(token_id, int) and token_id != unk and hf.convert_ids_to_tokens(token_id) == text:
        return (token_id,)
    return ()
