"""The scheduler's states and slot layout, as a state machine: whatever requests join,
start, finish or wait for their grammar, decoding rows hold slots 0..n-1, prefilling rows
the slots above, and carrying out the returned moves leaves every row's KV in its slot."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from thinkstruct.engine.core.scheduler import RequestState, Scheduler
from thinkstruct.engine.request import FinishReason


@dataclass(eq=False)
class Row:
    """What the scheduler reads and writes of a request."""

    name: int
    pending: list[int]
    grammar_ready: bool = True
    state: RequestState = RequestState.WAITING
    slot: int = -1
    cached: int = 0
    submitted_at: float = 0.0
    finish_reason: FinishReason | None = None
    left: list[int] = field(default_factory=list)


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.scheduler = Scheduler(max_batch=4, prefill_chunk=8, decode_positions=16, packs_tokens=True)
        self.kv: dict[int, int] = {}  # slot -> the row whose KV it holds
        self.rows: list[Row] = []
        self.left: list[Row] = []

    def _lay_out(self) -> None:
        def leaving(row: Row) -> None:
            self.left.append(row)

        for move in self.scheduler.layout(leaving):  # type: ignore[arg-type]
            self.kv[move.dst] = self.kv[move.src]

    @rule(length=st.integers(1, 20), ready=st.booleans())
    def submit(self, length: int, ready: bool) -> None:
        row = Row(name=len(self.rows), pending=list(range(length)), grammar_ready=ready)
        self.rows.append(row)
        self.scheduler.enqueue(row)  # type: ignore[arg-type]
        assert row.state is (RequestState.WAITING if ready else RequestState.WAITING_FOR_GRAMMAR)

    @rule()
    def grammars_compile(self) -> None:
        for row in self.rows:
            row.grammar_ready = True

    @rule()
    def step(self) -> None:
        self.scheduler.admit(lambda row: None)
        for row in self.scheduler.prefilling:
            self.kv.setdefault(row.slot, row.name)
            if row.cached == 0:
                self.kv[row.slot] = row.name
        plan = self.scheduler.prefill_plan(lambda row: None)
        if plan is not None:
            assert sum(len(c) for c in plan.chunks) <= 8 or len(plan.rows) == 1
            joining = []
            for row, chunk in zip(plan.rows, plan.chunks, strict=True):
                assert self.kv[row.slot] == row.name
                row.cached += len(chunk)
                del row.pending[: len(chunk)]
                if not row.pending:
                    joining.append(row)
            self.scheduler.started(joining)  # type: ignore[arg-type]
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
    def finished_rows_left_once(self) -> None:
        assert len(self.left) == len({id(r) for r in self.left})
        assert all(r.state is RequestState.FINISHED for r in self.left)


SchedulerMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
test_scheduler_states_and_layout = SchedulerMachine.TestCase
