"""The scheduler: which requests hold a KV slot and what each feeds next (:class:`Scheduler`).

It owns the requests' states (:class:`~thinkstruct.engine.core.sequence.RequestState`),
their slots and what each has in its slot, and answers these questions each round of the
engine loop, without touching the model; what it decides is plain data the executor
carries out:

1. **admission**: queued requests whose grammar is ready take free slots, as many as the
   batch takes now (:attr:`Scheduler.batch`: held to the step latency target by the
   decoding steps' measured times, within ``max_batch``; a request whose
   grammar is still compiling keeps its place and lets others pass) while their keys and
   values fit the KV budget (:meth:`Scheduler.kv_fits`: each reserves what its prompt and
   ``max_tokens`` can come to; one that does not fit waits, and nobody passes it);
2. **prefill plan**: the next prompt chunks, several prompts in one pass of at most
   ``prefill_chunk`` positions (fewer while rows decode, :attr:`Scheduler.chunk`, held
   to the same target by the passes' measured times), shortest first (one passed over too long goes first), and
   the prompt prefixes a starting prompt takes from another slot or the prefix cache
   instead of computing them (:class:`Reuse`; what the prefix cache holds is asked of the
   executor before planning);
3. **decode plan**: every decoding row's feed (its sampled token and the tokens its
   grammar forced, within ``decode_positions`` for the pass);
4. **update**: a pass's :class:`~thinkstruct.engine.core.step.StepResult` applied to each
   row's positions and pending tokens; a prompt complete starts decoding;
5. **layout**: finished rows leave (their positions go to the prefix cache) and the
   decoding row in the highest slot moves into each hole, so decoding rows always hold
   slots ``0..n-1`` and prefilling rows the slots above them (:class:`Layout`).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Mapping
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import TYPE_CHECKING

from thinkstruct.engine.core.batch_size import TargetedSize
from thinkstruct.engine.core.sequence import RequestState

if TYPE_CHECKING:
    from thinkstruct.engine.core.sequence import Sequence
    from thinkstruct.engine.core.step import StepResult


#: Seconds a prompt may be passed over by shorter ones; after that it goes ahead of every
#: prompt that has waited less, oldest first. Below it the order is shortest first: a
#: burst of prompts takes seconds to prefill on two cores (measured, 64 streaming clients
#: joining over 10 s: 28 prompts waiting, about 7 s of prefill), and when a wait counted
#: linearly against a prompt's length (256, then 32 tokens a second) every prompt of the
#: backlog had aged past a fresh 35-token question, which then waited behind up to nine
#: passes of older, twice-as-long schema prompts.
PREFILL_PATIENCE_S = 5.0


#: Shortest prompt prefix worth taking from another slot (a copy of a few positions costs
#: about what computing them does).
MIN_REUSED_PREFIX = 4


#: Rows the batch takes before a decoding step has been measured (it then follows the step
#: latency target): the fixed batch it replaced, which kept 1 to 8 clients' steps short.
START_ROWS = 8


#: Fewest prompt positions a prefill pass computes while rows decode: a smaller pass costs
#: mostly its fixed part (the weights read, the threads woken).
MIN_PREFILL_CHUNK = 16


@dataclass(frozen=True, slots=True)
class Reuse:
    """Slot ``slot`` takes the first ``tokens`` positions of its prompt ``prompt`` from slot
    ``donor``, or from the prefix cache (``donor`` ``None``), instead of computing them."""

    slot: int
    tokens: int
    donor: int | None
    prompt: Seq[int]


@dataclass(frozen=True, slots=True)
class PrefillPlan:
    """One prefill pass: ``rows`` (in consecutive slots from ``rows[0].slot``) feed ``chunks``,
    after ``reuses`` are carried out in order (a reuse may be for a prompt the pass has no
    room for: it starts next pass)."""

    rows: list[Sequence]
    chunks: list[list[int]]
    reuses: list[Reuse]
    #: What the pass computes, counted as against its size: the tokens fed, or (a runner
    #: that pads) rows x the longest chunk.
    positions: int = 0


@dataclass(frozen=True, slots=True)
class DecodePlan:
    """One decoding pass over every decoding row (slots ``0..len(rows)-1``).

    Attributes:
        rows: the decoding rows, in slot order.
        feeds: each row's tokens for this pass.
        ready: indices of the rows that sample after it (a row with forced tokens left
            over feeds them next pass and samples then).
        width: positions a row may feed in this pass.
    """

    rows: list[Sequence]
    feeds: list[list[int]]
    ready: list[int]
    width: int


@dataclass(frozen=True, slots=True)
class Move:
    """Carry the first ``length`` cached positions of slot ``src`` over to slot ``dst``."""

    src: int
    dst: int
    length: int


@dataclass(frozen=True, slots=True)
class Leaving:
    """A finished row's slot ``slot`` holds the keys and values of ``tokens`` (positions
    ``0..len(tokens)-1``): the prefix cache may keep them before another row moves in."""

    slot: int
    tokens: list[int]


@dataclass(frozen=True, slots=True)
class Layout:
    """The slots after rows leave: ``leaving`` rows' positions go to the prefix cache
    first, then ``moves`` are carried out in order; slots ``held...`` then hold nothing."""

    leaving: list[Leaving]
    moves: list[Move]
    held: int


class Scheduler:
    """Request states, slots and the plan of each pass.

    Args:
        max_batch: KV slots (most requests prefilling or decoding at once).
        prefill_chunk: most positions a prefill pass computes (see
            :attr:`~thinkstruct.engine.core.config.EngineConfig.prefill_chunk`).
        decode_positions: positions a decoding pass may compute, at least one per row.
        packs_tokens: the runner computes only the tokens fed (else rows x the longest).
        kv_bytes: most bytes of keys and values the rows holding a slot reserve together
            (each its ``kv_need``).
        step_target_s: seconds a decoding step should take (see
            :attr:`~thinkstruct.engine.core.config.EngineConfig.step_latency_target_s`):
            the batch is held to it, fed the steps' measured times (:meth:`decode_took`);
            ``None``: ``max_batch`` rows.
        chunk_target_s: seconds a prefill pass while rows decode should take, fed the
            passes' measured times (:meth:`prefill_took`); ``None``: ``prefill_chunk``
            positions (a prompt is then cut at the same places whatever the load: where
            kernels are not batch-invariant, its bits depend on the cuts).
        clock: seconds, monotonic (injectable for tests).
    """

    def __init__(
        self,
        *,
        max_batch: int,
        prefill_chunk: int,
        decode_positions: int,
        packs_tokens: bool,
        kv_bytes: int,
        step_target_s: float | None = None,
        chunk_target_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk
        #: Rows the batch takes now (slots admitted into).
        self.batch = TargetedSize(target_s=step_target_s, low=1, high=max_batch, value=START_ROWS)
        #: Positions a prefill pass computes while rows decode.
        self.chunk = TargetedSize(
            target_s=chunk_target_s,
            low=min(MIN_PREFILL_CHUNK, prefill_chunk),
            high=prefill_chunk,
            value=prefill_chunk,
        )
        self.decode_positions = decode_positions
        self.packs_tokens = packs_tokens
        self.kv_bytes = kv_bytes
        #: Bytes of keys and values the rows holding a slot reserved (their ``kv_need``).
        self.kv_reserved = 0
        self._clock = clock
        self._queue: collections.deque[Sequence] = collections.deque()
        #: Rows holding a slot, in slot order: decoding rows, then prefilling ones.
        self._held: list[Sequence] = []

    # ---- states ----------------------------------------------------------------------

    @property
    def queued(self) -> list[Sequence]:
        return list(self._queue)

    @property
    def decoding(self) -> list[Sequence]:
        return [s for s in self._held if s.state is RequestState.DECODING]

    @property
    def prefilling(self) -> list[Sequence]:
        return [s for s in self._held if s.state is RequestState.PREFILLING]

    @property
    def held(self) -> list[Sequence]:
        """Rows holding a slot (decoding, prefilling, or finished and not yet laid out)."""
        return list(self._held)

    @property
    def unstarted(self) -> list[Sequence]:
        """Prefilling rows whose slot holds nothing yet (a prefix may still be reused for them)."""
        return [s for s in self._held if s.state is RequestState.PREFILLING and s.cached == 0]

    def has_work(self) -> bool:
        return bool(self._queue or self._held)

    def enqueue(self, seq: Sequence) -> None:
        seq.state = RequestState.WAITING if seq.grammar_ready else RequestState.WAITING_FOR_GRAMMAR
        self._queue.append(seq)

    def everyone(self) -> list[Sequence]:
        return [*self._held, *self._queue]

    # ---- admission -------------------------------------------------------------------

    def kv_fits(self, seq: Sequence, *, reserved: int | None = None) -> bool:
        """Whether ``seq``'s keys and values (its ``kv_need``) fit the KV budget beside
        ``reserved`` bytes (default: what the rows holding a slot reserved). The KV
        admission check, apart from how many rows a batch takes."""
        already = self.kv_reserved if reserved is None else reserved
        return already + seq.kv_need <= self.kv_bytes

    def admissions(self) -> list[Sequence]:
        """The queued requests that take a slot now, in queue order: as many as the batch
        takes beside the rows holding a slot (:attr:`batch`), passing over those whose grammar is still compiling (and finished ones),
        while their keys and values fit (:meth:`kv_fits`); the first that does not fit
        waits for memory and the ones behind it wait too (first come, first served: a
        long request is never passed over forever). The engine prepares them (builds
        their matchers) and admits those still alive (:meth:`admit`)."""
        free = self.batch.value - len(self._held)
        chosen: list[Sequence] = []
        reserved = self.kv_reserved
        for seq in self._queue:
            if len(chosen) >= free:
                break
            if seq.state is RequestState.FINISHED or not seq.grammar_ready:
                continue
            if not self.kv_fits(seq, reserved=reserved):
                break
            reserved += seq.kv_need
            chosen.append(seq)
        return chosen

    def admit(self, rows: list[Sequence]) -> None:
        """``rows`` (from :meth:`admissions`) take the next free slots, in order, reserve
        their keys and values, and start prefilling; finished requests leave the queue,
        and the others wait (for a slot, for memory, or for their grammar).

        Raises:
            RuntimeError: more rows than free slots, or than the KV budget holds.
        """
        if len(self._held) + len(rows) > self.max_batch:
            raise RuntimeError(
                f"{len(rows)} rows admitted with {self.max_batch - len(self._held)} slots free"
            )
        need = sum(seq.kv_need for seq in rows)
        if self.kv_reserved + need > self.kv_bytes:
            raise RuntimeError(
                f"rows needing {need} bytes of keys and values admitted with "
                f"{self.kv_bytes - self.kv_reserved} left"
            )
        self.kv_reserved += need
        admitted = set(map(id, rows))
        kept: collections.deque[Sequence] = collections.deque()
        for seq in self._queue:
            if id(seq) in admitted or seq.state is RequestState.FINISHED:
                continue
            seq.state = RequestState.WAITING if seq.grammar_ready else RequestState.WAITING_FOR_GRAMMAR
            kept.append(seq)
        self._queue = kept
        for seq in rows:
            seq.state = RequestState.PREFILLING
            seq.slot = len(self._held)
            seq.cached = 0
            self._held.append(seq)

    # ---- plans -----------------------------------------------------------------------

    def prefill_plan(self, cached: Mapping[Sequence, int]) -> PrefillPlan | None:
        """The next prefill pass, or ``None`` when nothing is prefilling. ``cached``: for
        :attr:`unstarted` rows, how many of their prompt's first tokens the prefix cache
        holds (whole blocks, short of the prompt's last token).

        A prompt about to join a pass takes the longest prefix another slot or the prefix
        cache holds (:meth:`_reuse`): now, not at admission, as the order below renumbers
        only prompts holding nothing, and a prompt that reuses a prefix here is in this
        pass or the next. A pass computes at most ``prefill_chunk`` positions, or
        :attr:`chunk` while rows decode (without a ``chunk_target_s`` the two are the
        same, so each prompt is cut at multiples of ``prefill_chunk`` from where it
        starts, whatever else is prefilling, and a request's own computation never
        depends on the others); rows join the pass in order while their next chunk fits
        the pass's token budget."""
        if not self.prefilling:
            return None
        self._order_prefills()
        size = self.chunk.value if self.decoding else self.prefill_chunk
        rows: list[Sequence] = []
        chunks: list[list[int]] = []
        reuses: list[Reuse] = []
        width = fed = 0
        for seq in self.prefilling:
            if seq.cached == 0:
                reuse = self._reuse(seq, cached.get(seq, 0))
                if reuse is not None:
                    reuses.append(reuse)
            chunk = seq.pending[:size]
            # What the pass computes: its tokens, or (a runner that pads) rows x its longest.
            cost = fed + len(chunk) if self.packs_tokens else (len(rows) + 1) * max(width, len(chunk))
            if rows and cost > size:
                break
            width = max(width, len(chunk))
            fed += len(chunk)
            rows.append(seq)
            chunks.append(chunk)
        positions = fed if self.packs_tokens else len(rows) * width
        return PrefillPlan(rows=rows, chunks=chunks, reuses=reuses, positions=positions)

    def _reuse(self, seq: Sequence, stored: int) -> Reuse | None:
        """Give ``seq``'s slot the longest prefix of its prompt that another slot holds (a
        shared system prompt, chat template, tool list, or the same prompt for ``n`` > 1)
        or that the prefix cache holds (``stored`` tokens: a finished request's, as a
        chat's previous turn), where it is at least :data:`MIN_REUSED_PREFIX` tokens; at
        least the prompt's last token is still computed (its logits give the first token).

        On a batch-invariant runner what is reused is the same bits as computing it; on
        others, what an earlier pass computed (equal within rounding)."""
        prompt = seq.request.prompt_ids
        best: Sequence | None = None
        length = MIN_REUSED_PREFIX - 1
        for donor in self._held:
            if donor is seq or donor.cached <= length:
                continue
            limit = min(donor.cached, donor.prompt_tokens, len(prompt) - 1)
            shared = common_prefix(prompt, donor.request.prompt_ids, limit)
            if shared > length:
                best, length = donor, shared
        if stored > length:
            reuse = Reuse(slot=seq.slot, tokens=stored, donor=None, prompt=prompt)
        elif best is not None:
            reuse = Reuse(slot=seq.slot, tokens=length, donor=best.slot, prompt=prompt)
        else:
            return None
        seq.cached = seq.cached_prompt_tokens = reuse.tokens
        del seq.pending[: reuse.tokens]
        return reuse

    def decode_plan(self) -> DecodePlan | None:
        rows = self.decoding
        if not rows:
            return None
        width = max(self.decode_positions, len(rows)) // len(rows)  # at least 1
        feeds = [s.pending[:width] for s in rows]
        ready = [i for i, s in enumerate(rows) if len(s.pending) <= width]
        return DecodePlan(rows=rows, feeds=feeds, ready=ready, width=width)

    # ---- after a pass ----------------------------------------------------------------

    def decode_took(self, *, rows: int, seconds: float) -> None:
        """A decoding step of ``rows`` rows took ``seconds`` (sampling and the output side
        included: the rows' time per token); the batch follows the target."""
        self.batch.observe(size=rows, seconds=seconds)

    def prefill_took(self, *, positions: int, seconds: float) -> None:
        """A prefill pass computing ``positions`` (:attr:`PrefillPlan.positions`) took
        ``seconds``; the passes while rows decode follow the target."""
        self.chunk.observe(size=positions, seconds=seconds)

    def update(self, result: StepResult) -> list[Sequence]:
        """Apply a pass's result: each row's slot holds its ``computed`` positions more and
        it feeds its ``pending`` tokens next. A prefilling row whose whole prompt is in its
        slot now (it sampled its first token) decodes; those rows are returned. They are
        always the lowest prefilling rows (a prompt that is not complete fills its pass
        alone), so decoding rows stay below every prefilling one."""
        started: list[Sequence] = []
        for out in result.rows:
            seq = out.seq
            seq.cached += out.computed
            seq.pending = out.pending
            if seq.state is RequestState.PREFILLING and seq.cached >= seq.prompt_tokens:
                seq.state = RequestState.DECODING
                started.append(seq)
        if started:
            order = {RequestState.DECODING: 0, RequestState.FINISHED: 0, RequestState.PREFILLING: 1}
            self._held.sort(key=lambda s: (order.get(s.state, 1), s.slot))
        return started

    def _order_prefills(self) -> None:
        """Shortest remaining prompt first among the prompts not started, except that a
        prompt waiting :data:`PREFILL_PATIENCE_S` or more goes ahead of the others, oldest
        first (so a long prompt is not passed over forever). A short chat question then
        does not wait behind long schema prompts' seconds of prefill, and prompts of like
        length share passes (less padding). A started prompt (its KV in its slot) stays
        first; the others hold no KV yet, so their slots are simply renumbered."""
        prefilling = self.prefilling
        fresh = [s for s in prefilling if s.cached == 0]
        if len(fresh) < 2:
            return
        overdue = self._clock() - PREFILL_PATIENCE_S

        def order(s: Sequence) -> tuple[bool, int, float]:
            waited_long = s.submitted_at <= overdue
            return (not waited_long, 0 if waited_long else len(s.pending), s.submitted_at)

        fresh.sort(key=order)
        started = [s for s in prefilling if s.cached]
        others = [s for s in self._held if s.state is not RequestState.PREFILLING]
        self._held = [*others, *started, *fresh]
        for slot, seq in enumerate(fresh, start=len(others) + len(started)):
            seq.slot = slot

    # ---- layout ----------------------------------------------------------------------

    def layout(self) -> Layout:
        """Drop finished rows (their slots' positions listed first, for the prefix cache,
        while their slot still holds them); lay the others out as decoding rows in slots
        ``0..n-1``, then the prefilling ones (the rows' ``slot`` is already updated).

        A finished row's reserved keys and values go back to the KV budget (the executor
        releases its blocks as it carries the layout out, before any pass).

        A decoding row that leaves is replaced by the decoding row in the highest slot
        (one move per row that leaves, not one per row after it: moving every later row
        down cost ~3 ms a row, 0.2 s when the first of 64 left). Prefilling rows keep
        their order and only move down.

        Raises:
            RuntimeError: the slot order is broken (a prefilling row would move up).
        """
        leaving = [
            Leaving(s.slot, s.context[: s.cached])
            for s in self._held
            if s.state is RequestState.FINISHED and s.slot >= 0 and s.cached > 0
        ]
        self.kv_reserved -= sum(s.kv_need for s in self._held if s.state is RequestState.FINISHED)
        decoding = [s for s in self._held if s.state is RequestState.DECODING]
        prefilling = [s for s in self._held if s.state is RequestState.PREFILLING]
        moves: list[Move] = []
        n = len(decoding)
        holes = sorted({*range(n)} - {s.slot for s in decoding})
        movers = sorted((s for s in decoding if s.slot >= n), key=lambda s: s.slot)
        for seq, hole in zip(movers, holes, strict=True):
            moves.append(Move(seq.slot, hole, seq.cached))
            seq.slot = hole
        decoding.sort(key=lambda s: s.slot)
        for target, seq in enumerate(prefilling, start=n):
            if seq.slot != target:
                if seq.slot < target:
                    raise RuntimeError(f"row order broken: slot {seq.slot} would move up to {target}")
                moves.append(Move(seq.slot, target, seq.cached))
                seq.slot = target
        self._held = [*decoding, *prefilling]
        return Layout(leaving=leaving, moves=moves, held=len(self._held))

    def drop_finished_queued(self) -> None:
        self._queue = collections.deque(s for s in self._queue if s.state is not RequestState.FINISHED)

    def clear(self) -> None:
        self._queue.clear()
        self._held = []
        self.kv_reserved = 0


def common_prefix(a: Seq[int], b: Seq[int], limit: int) -> int:
    """How many leading tokens ``a`` and ``b`` share, up to ``limit``."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if n >= limit or x != y:
            break
        n += 1
    return n
