"""The batch and the prefill pass held to a step latency target (:class:`TargetedSize`), fed
measured pass durations as plain data: the size stays within its bounds, shrinks after a
pass over the target, grows after a full pass under it (never past what a pass of the
target's length would hold if its time grew in proportion), and settles where a linear
cost model puts the target; the scheduler admits as many rows as it says, within the KV
budget and ``max_batch``."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_scheduler import Request, Row

from thinkstruct.engine.core.batch_size import TargetedSize
from thinkstruct.engine.core.scheduler import START_ROWS, PrefillPlan, Scheduler
from thinkstruct.engine.core.sequence import RequestState
from thinkstruct.engine.core.step import RowOutput, StepResult

TARGET = 0.1

sizes = st.builds(
    lambda low, extra, value: TargetedSize(target_s=TARGET, low=low, high=low + extra, value=value),
    st.integers(1, 8),
    st.integers(0, 120),
    st.integers(0, 200),
)
passes = st.tuples(st.integers(1, 200), st.floats(1e-4, 2.0, allow_nan=False))


@given(size=sizes, observed=st.lists(passes, max_size=60))
def test_the_size_never_leaves_its_bounds(size: TargetedSize, observed: list[tuple[int, float]]) -> None:
    assert size.low <= size.value <= size.high
    for rows, seconds in observed:
        size.observe(size=rows, seconds=seconds)
        assert size.low <= size.value <= size.high


@given(size=sizes, data=st.data())
def test_a_pass_over_the_target_shrinks_the_size(size: TargetedSize, data: st.DataObject) -> None:
    before = size.value
    rows = data.draw(st.integers(1, before))
    seconds = data.draw(st.floats(TARGET * 1.0001, 5.0))
    size.observe(size=rows, seconds=seconds)
    assert size.value == size.low or size.value < before
    # Half-way towards what fits, not below it (unless at the floor).
    assert size.value >= min(before - 1, math.floor(rows * TARGET / seconds)) or size.value == size.low


@given(size=sizes, data=st.data())
def test_a_full_pass_under_the_target_grows_the_size_within_what_fits(
    size: TargetedSize, data: st.DataObject
) -> None:
    before = size.value
    rows = data.draw(st.integers(before, before + 20))
    # Fast enough that a pass of the target's length holds one more row, in proportion.
    seconds = data.draw(st.floats(1e-4, min(TARGET, 0.999 * TARGET * rows / (before + 1))))
    size.observe(size=rows, seconds=seconds)
    fitting = rows * TARGET / seconds
    assert size.value == size.high or size.value > before
    assert size.value <= max(before + 1, math.floor(fitting))


@given(size=sizes, data=st.data())
def test_a_pass_short_of_the_size_under_the_target_leaves_it(size: TargetedSize, data: st.DataObject) -> None:
    before = size.value
    if before == 1:
        return
    rows = data.draw(st.integers(1, before - 1))
    size.observe(size=rows, seconds=data.draw(st.floats(1e-4, TARGET)))
    assert size.value == before


def test_without_a_target_the_size_is_its_cap() -> None:
    size = TargetedSize(target_s=None, low=1, high=64, value=8)
    assert size.value == 64
    size.observe(size=64, seconds=10.0)
    assert size.value == 64


@pytest.mark.parametrize(("fixed_s", "per_row_s"), [(0.0065, 0.0028), (0.02, 0.001), (0.001, 0.01)])
def test_under_full_load_the_batch_settles_at_the_target(fixed_s: float, per_row_s: float) -> None:
    """Steps cost ``fixed + per_row * rows``: fed its own size's step times, the batch
    ends within the target and above 80 % of it, or at its cap."""
    size = TargetedSize(target_s=TARGET, low=1, high=64, value=START_ROWS)
    for _ in range(40):
        size.observe(size=size.value, seconds=fixed_s + per_row_s * size.value)
    step = fixed_s + per_row_s * size.value
    assert step <= TARGET
    assert size.value == 64 or step >= 0.8 * TARGET


# ---- the scheduler's admissions ------------------------------------------------------------


def scheduler(*, kv_bytes: int = 1000, max_batch: int = 16) -> Scheduler:
    s = Scheduler(
        max_batch=max_batch,
        prefill_chunk=256,
        decode_positions=64,
        packs_tokens=True,
        kv_bytes=kv_bytes,
        step_target_s=TARGET,
        chunk_target_s=TARGET,
    )
    for i in range(40):
        s.enqueue(Row(i, Request([i, i + 1]), [i, i + 1]))  # type: ignore[arg-type]
    return s


def admit(s: Scheduler) -> int:
    rows = s.admissions()
    s.admit(rows)
    return len(rows)


def test_the_batch_follows_the_measured_steps() -> None:
    s = scheduler()
    assert admit(s) == START_ROWS  # before any step was measured
    s.decode_took(rows=8, seconds=0.04)  # 20 rows would fit: half-way there
    assert s.batch.value == 14
    assert admit(s) == 6
    s.decode_took(rows=14, seconds=0.2)  # over: 7 would fit
    assert s.batch.value == 10
    assert admit(s) == 0  # the rows holding a slot keep it
    for _ in range(10):
        s.decode_took(rows=s.batch.value, seconds=0.01)  # fast steps: up to the cap
    assert s.batch.value == 16
    assert admit(s) == 2


def test_the_kv_budget_and_the_cap_still_bound_the_batch() -> None:
    s = scheduler(kv_bytes=5)
    s.decode_took(rows=8, seconds=0.001)
    assert s.batch.value == 16
    assert admit(s) == 5  # five rows' keys and values fit
    s = scheduler(max_batch=4)
    assert admit(s) == 4
    s.decode_took(rows=4, seconds=0.001)
    assert s.batch.value == 4 and admit(s) == 0


def test_a_prefill_pass_beside_decoding_rows_follows_the_target() -> None:
    s = Scheduler(
        max_batch=8,
        prefill_chunk=256,
        decode_positions=64,
        packs_tokens=True,
        kv_bytes=100,
        step_target_s=TARGET,
        chunk_target_s=TARGET,
    )
    long = list(range(1000, 1600))
    for i, prompt in enumerate(([1, 2], [3, 4], long)):
        s.enqueue(Row(i, Request(prompt), list(prompt)))  # type: ignore[arg-type]
    assert admit(s) == 3

    def run(plan: PrefillPlan | None) -> int:
        assert plan is not None
        rows = [
            RowOutput(seq=row, computed=len(chunk), pending=row.pending[len(chunk) :], draws=[])
            for row, chunk in zip(plan.rows, plan.chunks, strict=True)
        ]
        s.update(StepResult(rows=rows))  # type: ignore[arg-type]
        return plan.positions

    assert run(s.prefill_plan({})) == 4  # the two short prompts (the long one does not fit beside them)
    assert len(s.decoding) == 2
    assert run(s.prefill_plan({})) == 256  # no pass measured yet: the cap
    s.prefill_took(positions=256, seconds=0.4)  # 64 positions would take the target
    assert s.chunk.value == 160  # half-way
    s.prefill_took(positions=160, seconds=0.25)
    assert s.chunk.value == 112
    assert run(s.prefill_plan({})) == 112
    for row in s.decoding:
        row.state = RequestState.FINISHED
    s.layout()
    assert run(s.prefill_plan({})) == 600 - 256 - 112  # nobody decodes: up to the cap
