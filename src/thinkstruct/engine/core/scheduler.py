"""The scheduler: which requests hold a KV slot and what each feeds next (:class:`Scheduler`).

It owns the requests' states (:class:`RequestState`) and their slots, and answers three
questions each round of the engine loop, without touching the model:

1. **admit**: queued requests whose grammar is ready take free slots (a request whose
   grammar is still compiling keeps its place and lets others pass);
2. **prefill plan**: the next prompt chunks, several prompts in one pass of at most
   ``prefill_chunk`` positions, shortest first (one passed over too long goes first);
3. **decode plan**: every decoding row's feed (its sampled token and the tokens its
   grammar forced, within ``decode_positions`` for the pass);

and after a pass, **layout**: finished rows leave and the decoding row in the highest
slot moves into each hole, so decoding rows always hold slots ``0..n-1`` and prefilling
rows the slots above them. It returns the moves; the executor carries them out.
"""

from __future__ import annotations

import collections
import enum
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from thinkstruct.engine.core.sequence import Sequence


#: Seconds a prompt may be passed over by shorter ones; after that it goes ahead of every
#: prompt that has waited less, oldest first. Below it the order is shortest first: a
#: burst of prompts takes seconds to prefill on two cores (measured, 64 streaming clients
#: joining over 10 s: 28 prompts waiting, about 7 s of prefill), and when a wait counted
#: linearly against a prompt's length (256, then 32 tokens a second) every prompt of the
#: backlog had aged past a fresh 35-token question, which then waited behind up to nine
#: passes of older, twice-as-long schema prompts.
PREFILL_PATIENCE_S = 5.0


class RequestState(enum.Enum):
    """Where a request is in its life (one value at a time)."""

    WAITING = "waiting"
    """Queued for a KV slot."""
    WAITING_FOR_GRAMMAR = "waiting_for_grammar"
    """Queued; its grammar is still compiling (others may pass it)."""
    PREFILLING = "prefilling"
    """Holds a slot; its prompt is being fed."""
    DECODING = "decoding"
    """Holds a slot; generating."""
    FINISHED = "finished"
    """Ended (its finish reason says why); its slot is free after the next layout."""


@dataclass(frozen=True, slots=True)
class PrefillPlan:
    """One prefill pass: ``rows`` (in consecutive slots from ``rows[0].slot``) feed ``chunks``."""

    rows: list[Sequence]
    chunks: list[list[int]]


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


class Scheduler:
    """Request states, slots and the plan of each pass.

    Args:
        max_batch: KV slots (most requests prefilling or decoding at once).
        prefill_chunk: positions a prefill pass computes (see
            :attr:`~thinkstruct.engine.core.engine.EngineConfig.prefill_chunk`).
        decode_positions: positions a decoding pass may compute, at least one per row.
        packs_tokens: the runner computes only the tokens fed (else rows x the longest).
        clock: seconds, monotonic (injectable for tests).
    """

    def __init__(
        self,
        *,
        max_batch: int,
        prefill_chunk: int,
        decode_positions: int,
        packs_tokens: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk
        self.decode_positions = decode_positions
        self.packs_tokens = packs_tokens
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

    def has_work(self) -> bool:
        return bool(self._queue or self._held)

    def enqueue(self, seq: Sequence) -> None:
        seq.state = RequestState.WAITING if seq.grammar_ready else RequestState.WAITING_FOR_GRAMMAR
        self._queue.append(seq)

    def everyone(self) -> list[Sequence]:
        return [*self._held, *self._queue]

    # ---- admission -------------------------------------------------------------------

    def admit(self, ready: Callable[[Sequence], None]) -> None:
        """Give free slots to queued requests in order, passing over those whose grammar
        is still compiling; ``ready(seq)`` prepares each admitted one (builds its
        matcher; may finish it)."""
        if len(self._held) >= self.max_batch or not self._queue:
            return
        kept: collections.deque[Sequence] = collections.deque()
        while self._queue:
            seq = self._queue.popleft()
            if seq.state is RequestState.FINISHED:
                continue
            if not seq.grammar_ready:
                seq.state = RequestState.WAITING_FOR_GRAMMAR
                kept.append(seq)
                continue
            if len(self._held) >= self.max_batch:
                seq.state = RequestState.WAITING
                kept.append(seq)
                continue
            ready(seq)
            if seq.finish_reason is not None:  # its grammar could not be used
                continue
            seq.state = RequestState.PREFILLING
            seq.slot = len(self._held)
            seq.cached = 0
            self._held.append(seq)
        self._queue = kept

    # ---- plans -----------------------------------------------------------------------

    def prefill_plan(self, reuse: Callable[[Sequence], None]) -> PrefillPlan | None:
        """The next prefill pass, or ``None`` when nothing is prefilling. ``reuse(seq)``
        lets a prompt about to start take a cached prefix (it may advance ``seq.cached``).

        Each prompt is cut at multiples of ``prefill_chunk`` whatever else is prefilling,
        so a request's own computation never depends on the others (with batch-invariant
        kernels, a seed then gives the same tokens in any batch); rows join the pass in
        order while their next chunk fits the pass's token budget."""
        if not self.prefilling:
            return None
        self._order_prefills()
        size = self.prefill_chunk
        rows: list[Sequence] = []
        chunks: list[list[int]] = []
        width = fed = 0
        for seq in self.prefilling:
            if seq.cached == 0:
                # Now, not at admission: the order above renumbers only prompts holding no
                # KV, and a prompt that reuses a prefix here is in this pass or the next.
                reuse(seq)
            chunk = seq.pending[:size]
            # What the pass computes: its tokens, or (a runner that pads) rows x its longest.
            cost = fed + len(chunk) if self.packs_tokens else (len(rows) + 1) * max(width, len(chunk))
            if rows and cost > size:
                break
            width = max(width, len(chunk))
            fed += len(chunk)
            rows.append(seq)
            chunks.append(chunk)
        return PrefillPlan(rows=rows, chunks=chunks)

    def decode_plan(self) -> DecodePlan | None:
        rows = self.decoding
        if not rows:
            return None
        width = max(self.decode_positions, len(rows)) // len(rows)  # at least 1
        feeds = [s.pending[:width] for s in rows]
        ready = [i for i, s in enumerate(rows) if len(s.pending) <= width]
        return DecodePlan(rows=rows, feeds=feeds, ready=ready, width=width)

    def started(self, rows: list[Sequence]) -> None:
        """``rows`` fed their whole prompt and sampled their first token: they decode.
        They are always the lowest prefilling rows (a prompt that is not complete fills
        its pass alone), so decoding rows stay below every prefilling one."""
        for seq in rows:
            if seq.state is RequestState.PREFILLING:
                seq.state = RequestState.DECODING
        order = {RequestState.DECODING: 0, RequestState.FINISHED: 0, RequestState.PREFILLING: 1}
        self._held.sort(key=lambda s: (order.get(s.state, 1), s.slot))

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

    def layout(self, leaving: Callable[[Sequence], None]) -> list[Move]:
        """Drop finished rows (``leaving(seq)`` first, while their slot still holds their
        KV); return the moves that lay the others out as decoding rows in slots
        ``0..n-1``, then the prefilling ones (the rows' ``slot`` is already updated).

        A decoding row that leaves is replaced by the decoding row in the highest slot
        (one move per row that leaves, not one per row after it: moving every later row
        down cost ~3 ms a row, 0.2 s when the first of 64 left). Prefilling rows keep
        their order and only move down.

        Raises:
            RuntimeError: the slot order is broken (a prefilling row would move up).
        """
        for seq in self._held:
            if seq.state is RequestState.FINISHED:
                leaving(seq)
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
        return moves

    def drop_finished_queued(self) -> None:
        self._queue = collections.deque(s for s in self._queue if s.state is not RequestState.FINISHED)

    def clear(self) -> None:
        self._queue.clear()
        self._held = []
