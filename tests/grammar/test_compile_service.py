"""The compile service under load and failure: deadlines that hold through every wait,
cheap compiles that never queue behind expensive ones, worker crashes as internal errors,
killable large compiles, size limits, library warnings in the log."""

from __future__ import annotations

import concurrent.futures
import logging
import os
import signal
import time

import psutil
import pytest

from polling import wait_until
from thinkstruct import CompileTimeout, Constraint, InvalidConstraint, Tokenizer
from thinkstruct.errors import InternalCompileError
from thinkstruct.grammar.api import first_rejected
from thinkstruct.grammar.service.compiler import CompilerConfig, GrammarCompiler

pytestmark = [pytest.mark.slow]

#: What a request may wait past its timeout_s in all (the watchdog's grace, a kill).
MARGIN_S = 1.5

CHEAP = Constraint.json_schema({"type": "object", "properties": {"x": {"type": "integer"}}})


def slow_outlines(n: int) -> Constraint:
    """outlines-core needs minutes for this (a free-form value under a 129k vocabulary)."""
    return Constraint.json_schema(
        {"type": "object", "properties": {f"x{n}": {}, "y": {"type": "array"}}, "required": [f"x{n}", "y"]}
    )


def big_enum(n: int, size: int = 20_000) -> Constraint:
    """xgrammar takes about 2 CPU-seconds for a 20,000-string enum (a warm worker)."""
    return Constraint.json_schema({"enum": [f"value-{n}-{i}" for i in range(size)]})


def _wait_busy(pid: int, cpu_s: float = 0.3, timeout_s: float = 30.0) -> None:
    """Until process ``pid`` has used ``cpu_s`` more CPU seconds (it is compiling)."""
    proc = psutil.Process(pid)
    start = sum(proc.cpu_times()[:2])
    deadline = time.monotonic() + timeout_s
    while sum(proc.cpu_times()[:2]) - start < cpu_s:
        assert time.monotonic() < deadline, "the worker never got busy"
        time.sleep(0.05)


def test_cheap_compile_does_not_wait_behind_six_slow_ones(tokenizer: Tokenizer) -> None:
    config = CompilerConfig(timeout_s=6.0)
    with GrammarCompiler(tokenizer, config) as c:
        c.warm_up(("outlines",))
        [worker] = c.worker_pids()
        start = time.monotonic()
        slow = [c.submit(slow_outlines(i), backend="outlines") for i in range(6)]
        _wait_busy(worker)  # the worker compiles the first; the other five queue behind it
        cheap_start = time.monotonic()
        compiled = c.compile(CHEAP)
        cheap_s = time.monotonic() - cheap_start
        pending = [not f.done() for f in slow]
        print(f"\ncheap compile with 6 slow ones in flight: {cheap_s * 1000:.1f} ms")
        assert compiled.backend == "llguidance" and first_rejected(compiled, '{"x":1}') is None
        assert all(pending)  # it came back while every slow one was still in flight
        # Each slow request ends at its own deadline, queue wait included, not one after
        # the other (6 x 6 s).
        ends = []
        for future in concurrent.futures.as_completed(slow, timeout=config.timeout_s + 10):
            with pytest.raises(CompileTimeout):
                future.result()
            ends.append(time.monotonic() - start)
        print("slow requests ended after " + ", ".join(f"{e:.1f}" for e in sorted(ends)) + " s")
        assert max(ends) <= config.timeout_s + MARGIN_S
        assert c.stats.timeouts == 6


def test_sixteen_heavy_xgrammar_compiles_each_end_at_their_deadline(tokenizer: Tokenizer) -> None:
    config = CompilerConfig(timeout_s=3.0)
    constraints = [big_enum(i) for i in range(16)]
    with GrammarCompiler(tokenizer, config) as c:
        c.warm_up(("xgrammar",))
        start = time.monotonic()
        heavy = [c.submit(k, backend="xgrammar") for k in constraints]
        trivial_start = time.monotonic()
        trivial = c.compile(Constraint.regex("[0-9]+"))
        trivial_s = time.monotonic() - trivial_start
        assert trivial.backend == "llguidance"
        waits = []
        for future in heavy:
            with pytest.raises(CompileTimeout) as info:
                future.result(timeout=config.timeout_s + 10)
            waits.append(time.monotonic() - start)
            assert info.value.kind == "json_schema"
        print(
            f"\ntrivial compile: {trivial_s * 1000:.1f} ms; heavy ones ended after at most {max(waits):.2f} s"
        )
        assert max(waits) <= config.timeout_s + MARGIN_S
        # Only the one that ran to its limit may be remembered as the constraint's
        # failure; the fifteen that waited in the queue are load, tried again next time.
        assert len(c._failures) <= 1


def test_a_worker_crash_is_retried_on_a_fresh_worker(tokenizer: Tokenizer) -> None:
    with GrammarCompiler(tokenizer, CompilerConfig(timeout_s=60.0)) as c:
        c.warm_up(("xgrammar",))
        [pid] = c.worker_pids()
        future = c.submit(big_enum(0), backend="xgrammar")
        _wait_busy(pid)
        os.kill(pid, signal.SIGKILL)  # the kernel's OOM killer does the same
        compiled = future.result(timeout=60)
        assert compiled.backend == "xgrammar"
        assert first_rejected(compiled, '"value-0-17"') is None
        assert c.stats.worker_crashes == 1 and c.stats.internal_errors == 0


def test_a_constraint_that_kills_its_worker_twice_is_an_internal_error_not_cached(
    tokenizer: Tokenizer,
) -> None:
    constraint = slow_outlines(0)
    with GrammarCompiler(tokenizer, CompilerConfig(timeout_s=60.0, failure_ttl_s=60.0)) as c:
        c.warm_up(("outlines",))
        future = c.submit(constraint, backend="outlines")
        for _ in range(2):  # the first worker, then the fresh one it is retried on
            pid = _busy_worker(c)
            os.kill(pid, signal.SIGKILL)
        with pytest.raises(InternalCompileError) as info:
            future.result(timeout=60)
        assert not isinstance(info.value, InvalidConstraint)  # not the constraint's fault
        assert c.stats.worker_crashes == 2 and c.stats.internal_errors == 1
        misses = c.stats.misses
        again = c.submit(constraint, backend="outlines")  # compiled again, not answered from memory
        assert c.stats.misses == misses + 1
        again.cancel()


def _busy_worker(c: GrammarCompiler, timeout_s: float = 60.0) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        for pid in c.worker_pids():
            try:
                _wait_busy(pid, timeout_s=max(deadline - time.monotonic(), 0.1))
                return pid
            except (AssertionError, psutil.NoSuchProcess):
                pass
        assert time.monotonic() < deadline, "no worker got busy"
        time.sleep(0.1)


def test_large_llguidance_compiles_are_killable_and_keep_their_cause(tokenizer: Tokenizer) -> None:
    # llguidance needs seconds for 300,000 options and then refuses them ("lexer too big"):
    # that work runs in a worker, and the cause survives xgrammar's timeout after it.
    options = [f"o{i}" for i in range(300_000)]
    config = CompilerConfig(timeout_s=8.0)
    with GrammarCompiler(tokenizer, config) as c:
        c.warm_up(("llguidance", "xgrammar"))
        before = set(c.worker_pids())
        start = time.monotonic()
        with pytest.raises(InvalidConstraint) as info:
            c.compile(Constraint.choice(options))
        elapsed = time.monotonic() - start
        print(
            f"\n300,000 options: {type(info.value).__name__} after {elapsed:.1f} s: {str(info.value)[:160]}"
        )
        assert elapsed <= config.timeout_s + MARGIN_S
        assert "llguidance" in str(info.value) and "too big" in str(info.value)
        # Nothing of that compile still runs: the workers that ran it were killed or are
        # idle, and this process is idle.
        cpu = time.process_time()
        busy = {pid: _cpu(pid) for pid in before}
        time.sleep(1.0)
        assert time.process_time() - cpu < 0.5
        for pid, used in busy.items():
            now = _cpu(pid)
            assert now is None or now - used < 0.5, f"worker {pid} still burns CPU"


def _cpu(pid: int) -> float | None:
    try:
        return sum(psutil.Process(pid).cpu_times()[:2])
    except psutil.NoSuchProcess:
        return None


def test_size_limits_are_named(tokenizer: Tokenizer) -> None:
    with GrammarCompiler(tokenizer, CompilerConfig(max_constraint_bytes=1000, worker_processes=0)) as c:
        with pytest.raises(InvalidConstraint, match="max_constraint_bytes"):
            c.compile(Constraint.choice([f"o{i}" for i in range(500)]))
    grammar = "root ::= " + " | ".join(f'"x{i}"' for i in range(20_000))
    with GrammarCompiler(tokenizer, CompilerConfig(worker_processes=0)) as c:
        with pytest.raises(
            InvalidConstraint, match=r"too many alternatives for llguidance: 20,000 > limit 10,000"
        ):
            c.compile(Constraint.ebnf(grammar), backend="llguidance")


def test_library_warnings_reach_the_log(tokenizer: Tokenizer, caplog: pytest.LogCaptureFixture) -> None:
    overlapping = Constraint.json_schema({"oneOf": [{"type": "integer"}, {"type": "number"}]})
    caplog.set_level(logging.WARNING, logger="thinkstruct.grammar")
    with GrammarCompiler(tokenizer, CompilerConfig(timeout_s=60.0)) as c:
        compiled = c.compile(overlapping, backend="xgrammar")
        assert compiled.backend == "xgrammar"
        wait_until(
            lambda: any("xgrammar" in r.getMessage() and "oneOf" in r.getMessage() for r in caplog.records),
            "xgrammar's warning about the overlapping oneOf in the log",
        )
