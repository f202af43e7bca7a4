"""The scheduler's states, plans and slot layout, as a state machine: whatever requests
join, start, finish or wait for their grammar, decoding rows hold slots 0..n-1, prefilling
rows the slots above, a reused prefix comes from a slot (or the prefix cache) that holds
those very tokens, carrying out the returned moves leaves every row's KV in its slot, and
the rows holding a slot never reserve more keys and values than the budget (the first
ready request that does not fit waits, and nobody passes it), and whatever the decoding
steps' times, admissions never take more rows than the batch allows now nor more than
``max_batch``."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from thinkstruct.engine.core.scheduler import MIN_REUSED_PREFIX, Scheduler
from thinkstruct.engine.core.sequence import RequestState
from thinkstruct.engine.core.step import RowOutput, StepResult
from thinkstruct.engine.request import FinishReason

#: Tokens the model's prefix cache keeps together (a block).
BLOCK = 4
#: The start prompts may share (a system prompt).
SHARED = list(range(100, 112))
#: The KV budget, in the units the rows' needs are drawn in.
KV_BYTES = 10
#: Seconds a decoding step should take (the batch follows the steps' drawn times).
TARGET_S = 1.0


@dataclass(frozen=True)
class Request:
    prompt_ids: list[int]


@dataclass(eq=False)
class Row:
    """What the scheduler reads and writes of a request."""

    name: int
    request: Request
    pending: list[int]
    grammar_ready: bool = True
    state: RequestState = RequestState.WAITING
    slot: int = -1
    cached: int = 0
    cached_prompt_tokens: int = 0
    submitted_at: float = 0.0
    kv_need: int = 1
    finish_reason: FinishReason | None = None
    left: list[int] = field(default_factory=list)

    @property
    def prompt_tokens(self) -> int:
        return len(self.request.prompt_ids)

    @property
    def context(self) -> list[int]:
        return self.request.prompt_ids


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.scheduler = Scheduler(
            max_batch=4,
            prefill_chunk=8,
            decode_positions=16,
            packs_tokens=True,
            kv_bytes=KV_BYTES,
            step_target_s=TARGET_S,
        )
        self.kv: dict[int, int] = {}  # slot -> the row whose KV it holds
        self.rows: list[Row] = []
        self.left: list[Row] = []
        self.cache: list[tuple[int, ...]] = []  # what leaving rows' slots held

    def _stored(self, prompt: list[int]) -> int:
        """Whole blocks of ``prompt`` (short of its last token) that a leaving row held."""
        best = 0
        for tokens in self.cache:
            n = 0
            while n < min(len(tokens), len(prompt) - 1) and tokens[n] == prompt[n]:
                n += 1
            best = max(best, n // BLOCK * BLOCK)
        return best

    def _lay_out(self) -> None:
        finished = [r for r in self.scheduler.held if r.state is RequestState.FINISHED]
        layout = self.scheduler.layout()
        assert [(x.slot, x.tokens) for x in layout.leaving] == [
            (r.slot, r.context[: r.cached]) for r in finished if r.cached
        ]
        for leaving in layout.leaving:
            self.cache.append(tuple(leaving.tokens))
        self.left.extend(finished)
        for move in layout.moves:
            self.kv[move.dst] = self.kv[move.src]
        assert layout.held == len(self.scheduler.held)

    @rule(
        shared=st.integers(0, len(SHARED)),
        tail=st.lists(st.integers(0, 3), max_size=12),
        ready=st.booleans(),
        kv_need=st.integers(1, KV_BYTES),
    )
    def submit(self, shared: int, tail: list[int], ready: bool, kv_need: int) -> None:
        prompt = SHARED[:shared] + tail or [0]
        row = Row(
            name=len(self.rows),
            request=Request(prompt),
            pending=list(prompt),
            grammar_ready=ready,
            kv_need=kv_need,
        )
        self.rows.append(row)
        self.scheduler.enqueue(row)  # type: ignore[arg-type]
        assert row.state is (RequestState.WAITING if ready else RequestState.WAITING_FOR_GRAMMAR)

    @rule()
    def grammars_compile(self) -> None:
        for row in self.rows:
            row.grammar_ready = True

    @rule(seconds=st.floats(0.01, 4.0))
    def decoding_step_took(self, seconds: float) -> None:
        rows = len(self.scheduler.decoding)
        before = self.scheduler.batch.value
        self.scheduler.decode_took(rows=rows, seconds=seconds)
        if rows and rows <= before and seconds > TARGET_S:
            assert self.scheduler.batch.value == 1 or self.scheduler.batch.value < before

    @rule()
    def step(self) -> None:
        free = self.scheduler.batch.value - len(self.scheduler.held)
        reserved = self.scheduler.kv_reserved
        candidates = self.scheduler.admissions()
        assert all(r.grammar_ready and r.state is not RequestState.FINISHED for r in candidates)
        assert len(candidates) <= max(free, 0)
        assert reserved + sum(r.kv_need for r in candidates) <= KV_BYTES
        ready = [r for r in self.scheduler.queued if r.grammar_ready and r.state is not RequestState.FINISHED]
        assert candidates == ready[: len(candidates)]  # in queue order, none passed over
        if len(candidates) < free and len(ready) > len(candidates):
            waiting = ready[len(candidates)]  # the first left out waits for memory
            assert reserved + sum(r.kv_need for r in candidates) + waiting.kv_need > KV_BYTES
        self.scheduler.admit(candidates)
        for row in self.scheduler.prefilling:
            if row.cached == 0:
                self.kv[row.slot] = row.name
        unstarted = self.scheduler.unstarted
        plan = self.scheduler.prefill_plan({r: self._stored(r.request.prompt_ids) for r in unstarted})  # type: ignore[misc]
        if plan is None:
            return
        for reuse in plan.reuses:
            row = next(r for r in self.rows if r.slot == reuse.slot and r.state is RequestState.PREFILLING)
            assert MIN_REUSED_PREFIX <= reuse.tokens < row.prompt_tokens == len(reuse.prompt)
            assert row.cached == row.cached_prompt_tokens == reuse.tokens
            if reuse.donor is None:
                assert reuse.tokens == self._stored(row.request.prompt_ids)
            else:
                donor = next(r for r in self.rows if r.name == self.kv[reuse.donor])
                assert donor.cached >= reuse.tokens
                assert donor.request.prompt_ids[: reuse.tokens] == row.request.prompt_ids[: reuse.tokens]
        assert sum(len(c) for c in plan.chunks) <= 8 or len(plan.rows) == 1
        outputs = []
        for row, chunk in zip(plan.rows, plan.chunks, strict=True):
            assert self.kv[row.slot] == row.name
            assert chunk == row.pending[: len(chunk)]
            outputs.append(
                RowOutput(seq=row, computed=len(chunk), pending=row.pending[len(chunk) :], draws=[])
            )  # type: ignore[arg-type]
        complete = [
            row for row, chunk in zip(plan.rows, plan.chunks, strict=True) if len(chunk) == len(row.pending)
        ]
        started = self.scheduler.update(StepResult(rows=outputs))
        assert started == complete
        assert all(r.state is RequestState.DECODING and r.cached == r.prompt_tokens for r in started)
        self._lay_out()

    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        held = self.scheduler.held
        if not held:
            return
        row = data.draw(st.sampled_from(held))
        row.finish_reason = FinishReason.STOP
        row.state = RequestState.FINISHED
        self._lay_out()

    @invariant()
    def slots_are_laid_out(self) -> None:
        held = self.scheduler.held
        assert [r.slot for r in held] == list(range(len(held)))
        states = [r.state for r in held]
        decoding = states.count(RequestState.DECODING)
        assert states == [RequestState.DECODING] * decoding + [RequestState.PREFILLING] * (
            len(held) - decoding
        )
        for row in held:
            if row.cached:
                assert self.kv[row.slot] == row.name  # its KV followed it
        assert len(held) <= 4
        for row in self.scheduler.queued:
            assert row.state in (RequestState.WAITING, RequestState.WAITING_FOR_GRAMMAR)

    @invariant()
    def the_rows_holding_a_slot_reserve_what_they_need_within_the_budget(self) -> None:
        assert self.scheduler.kv_reserved == sum(r.kv_need for r in self.scheduler.held) <= KV_BYTES

    @invariant()
    def finished_rows_left_once(self) -> None:
        assert len(self.left) == len({id(r) for r in self.left})
        assert all(r.state is RequestState.FINISHED for r in self.left)


SchedulerMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
test_scheduler_states_and_layout = SchedulerMachine.TestCase
