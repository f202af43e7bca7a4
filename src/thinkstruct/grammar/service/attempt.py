"""One cold compile of one key, from the checks to the last fallback: :class:`CompileAttempt`.

An attempt never holds a thread while it waits. Each step is a short task on the
compiler's in-process pool (thinkstruct's checks, the backend plan and a small llguidance
compile in one task; loading what a worker compiled) or a job in a backend's worker queue
whose reply schedules the next step; so a cheap in-process compile never waits behind
compiles running in workers. One absolute deadline covers every step and every wait; a
watchdog (:class:`Deadlines`) ends the attempt at the deadline whatever it is doing.

When every candidate fails, the error keeps the most informative cause: thinkstruct's own
findings first, then a backend's refusal (llguidance's "schema too large", a panic's
message), and a timeout only when nothing else was learnt.
"""

from __future__ import annotations

import concurrent.futures
import heapq
import itertools
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Iterator
from typing import TYPE_CHECKING, Protocol

from thinkstruct.errors import CompileTimeout, InternalCompileError, InvalidConstraint, UnsupportedConstraint
from thinkstruct.grammar.compiled import CompiledGrammar, InvalidGrammar
from thinkstruct.grammar.schema.validation import check_constraint
from thinkstruct.grammar.service.auto import Candidate, plan
from thinkstruct.grammar.service.workers import WorkerCrashed, WorkTimeout

if TYPE_CHECKING:
    from thinkstruct.grammar.base import GrammarBackend
    from thinkstruct.grammar.constraint import Constraint
    from thinkstruct.grammar.service.config import CompilerConfig
    from thinkstruct.grammar.service.workers import Reply, WorkerPool

#: Seconds past the deadline the watchdog waits before ending an attempt itself, so the
#: worker pools' own, more precise timeouts (which kill the worker) are reported first.
WATCHDOG_GRACE_S = 0.1


class AttemptHost(Protocol):
    """What an attempt needs from its compiler."""

    config: CompilerConfig

    def backend(self, name: str, lenient: bool) -> GrammarBackend: ...

    def pool_for(self, backend: GrammarBackend, constraint: Constraint) -> WorkerPool | None: ...

    def run_inline(self, task: Callable[[], None], *, large: bool) -> None: ...

    def count(self, counter: str) -> None: ...

    def finish(
        self, attempt: CompileAttempt, outcome: CompiledGrammar | BaseException, *, remember: bool
    ) -> None: ...


class CompileAttempt:
    """Compile ``constraint`` with the planned backends in turn until one succeeds.

    Args:
        host: the compiler (pools, backends, counters, the cache).
        key: the host's cache key of this attempt.
        constraint, backend, strict: what to compile and how (``backend`` may be ``auto``).
        deadline: ``time.monotonic()`` by which the attempt has an outcome.
        future: completed with the compiled grammar or the error.
    """

    def __init__(
        self,
        host: AttemptHost,
        key: Hashable,
        constraint: Constraint,
        *,
        backend: str,
        strict: bool,
        deadline: float,
        future: concurrent.futures.Future[CompiledGrammar],
    ) -> None:
        self.host = host
        self.key = key
        self.constraint = constraint
        self.backend = backend
        self.strict = strict
        self.deadline = deadline
        self.future = future
        self.started = time.monotonic()
        #: Its in-process steps run apart from small constraints' (see the host).
        self.large = len(constraint.value) > host.config.inline_compile_bytes
        self._candidates: Iterator[Candidate] = iter(())
        self._errors: list[InvalidGrammar] = []
        self._tried = 0
        self._lock = threading.Lock()
        self._done = False
        #: Seconds it waited in a queue before its checks ran (load, not the constraint).
        self._queued_s = 0.0
        #: The worker job of the candidate being compiled out of process, if any.
        self._job: concurrent.futures.Future[Reply] | None = None
        #: Where the attempt is (for the watchdog's message).
        self._phase = "checking the constraint"
        self._backend_name: str | None = None

    # ---- steps -----------------------------------------------------------------------

    def start(self) -> None:
        """Run thinkstruct's own checks and plan the candidates (an in-process task)."""
        self._queued_s = time.monotonic() - self.started
        try:
            config = self.host.config
            if len(self.constraint.value) > config.max_constraint_bytes:
                raise InvalidConstraint(
                    f"the constraint is {len(self.constraint.value):,} characters long; the limit "
                    f"is {config.max_constraint_bytes:,} (CompilerConfig.max_constraint_bytes)",
                    kind=self.constraint.kind.value,
                )
            # Once, before any backend: the same error for all.
            check_constraint(
                self.constraint,
                max_answer_tokens=config.max_answer_tokens,
                # Strict auto checks the patterns no grammar runs (auto.plan's last resort).
                python_patterns=self.strict and self.backend == "auto",
            )
            self._candidates = plan(self.constraint, backend=self.backend, strict=self.strict)
        except InvalidConstraint as error:
            self._finish(error, remember=True)
            return
        except BaseException as error:  # noqa: BLE001 - reported on the future, never lost
            self._finish(error, remember=False)
            return
        self._next()

    def _next(self) -> None:
        if self._done:
            return
        try:
            candidate = next(self._candidates, None)
        except InvalidConstraint as error:  # strict refusal, raised when first asked
            self._finish(error, remember=True)
            return
        if candidate is None:
            self._give_up()
            return
        if self._tried:
            self.host.count("fallbacks")
        self._tried += 1
        self._job = None
        self._backend_name = candidate.backend
        try:
            backend = self.host.backend(candidate.backend, candidate.lenient)
            pool = self.host.pool_for(backend, candidate.constraint)
        except BaseException as error:  # noqa: BLE001 - reported on the future, never lost
            self._finish(error, remember=False)
            return
        if pool is None:
            # Every step runs on one of the host's in-process threads already (start, a
            # worker's reply, a refused candidate): compile here, no second hand-off.
            self._phase = f"compiling with {candidate.backend}"
            self._compile_inline(candidate, backend)
            return
        self._phase = f"waiting for or compiling in a {candidate.backend} worker"
        try:
            job = pool.submit(candidate.constraint, lenient=candidate.lenient, deadline=self.deadline)
        except BaseException as error:  # noqa: BLE001 - reported on the future, never lost
            self._finish(error, remember=False)
            return
        self._job = job
        # Loading a backend's grammar that does not serialize builds it again here, as
        # long as the worker took: never on the threads small compiles share.
        large = self.large or not backend.isolated
        job.add_done_callback(
            lambda reply: self.host.run_inline(lambda: self._load(candidate, backend, reply), large=large)
        )

    def _compile_inline(self, candidate: Candidate, backend: GrammarBackend) -> None:
        if self._done:
            return
        try:
            result = backend.compile(candidate.constraint, checked=True)
        except BaseException as error:  # noqa: BLE001 - reported on the future, never lost
            self._finish(error, remember=False)
            return
        self._result(candidate, result)

    def _load(
        self, candidate: Candidate, backend: GrammarBackend, reply: concurrent.futures.Future[Reply]
    ) -> None:
        if self._done:
            return
        constraint = candidate.constraint
        try:
            status, payload, seconds = reply.result()
        except CompileTimeout as error:
            # The deadline has passed: nothing more can be tried.
            waited = self.deadline - self.started
            timeout = CompileTimeout(
                f"compiling took longer than {self.host.config.timeout_s:g} s and was stopped"
                if isinstance(error, WorkTimeout)
                else f"{error.reason} ({waited:.1f} s after the request)",
                backend=candidate.backend,
                kind=self.constraint.kind.value,
            )
            self._errors.append(InvalidGrammar(constraint, candidate.backend, timeout))
            # A compile that ran out of time is the constraint's doing (its checks, its
            # transfer to the worker and its compile: their cost grows with it) unless
            # queues ate half the time: waiting for a thread, a free worker or one
            # starting is load, and not remembered. A load-free repeat is answered from
            # memory however slow the machine is.
            self._give_up(remember=self._constraints_own(error))
            return
        except WorkerCrashed as error:
            self._errors.append(
                InvalidGrammar(
                    constraint, candidate.backend, _internal(str(error), candidate.backend, constraint)
                )
            )
            self._next()
            return
        except BaseException as error:  # noqa: BLE001 - reported on the future, never lost
            self._finish(error, remember=False)
            return
        if status != "ok":
            self._result(candidate, InvalidGrammar(constraint, candidate.backend, payload))
            return
        self._phase = f"loading the {candidate.backend} grammar"
        exported, start_row = payload
        try:
            compiled = backend.load(constraint, exported, seconds)
            if start_row:
                import torch

                compiled.keep_start_row(torch.frombuffer(bytearray(start_row), dtype=torch.int32))
        except InvalidConstraint as error:
            self._result(candidate, InvalidGrammar(constraint, candidate.backend, error))
            return
        except BaseException as error:  # noqa: BLE001 - reported on the future, never lost
            self._finish(error, remember=False)
            return
        self._result(candidate, compiled)

    def _result(self, candidate: Candidate, result: CompiledGrammar | InvalidGrammar) -> None:
        if isinstance(result, InvalidGrammar):
            self._errors.append(result)
            self._next()
            return
        # The key and the result name the constraint as asked, not as rewritten.
        self._finish(
            result.renamed(
                self.constraint,
                ignored_keywords=candidate.ignored,
                checks=candidate.checks,
                requested=self.backend,
            ),
            remember=True,
        )

    def _give_up(self, *, remember: bool = True) -> None:
        if not self._errors:
            self._finish(
                UnsupportedConstraint(
                    "no backend enforces this schema exactly (strict mode)", kind=self.constraint.kind.value
                ),
                remember=True,
            )
            return
        error = combine_errors(self.constraint, self._errors)
        internal = isinstance(error, InternalCompileError)
        self._finish(error, remember=remember and not internal)

    # ---- the end -----------------------------------------------------------------------

    def _constraints_own(self, error: BaseException | None) -> bool:
        """Whether a timeout is the constraint's doing: the worker compiled it to the
        deadline and queues (a thread, a free worker, one starting) took less than half
        the time."""
        if not isinstance(error, WorkTimeout):
            return False
        return self._queued_s + error.waited_s < 0.5 * self.host.config.timeout_s

    def expire(self) -> None:
        """Called by the watchdog at the deadline: end the attempt if it has not ended.

        A worker that ran the compile to the deadline has already answered; its answer
        may only be waiting for a thread (a busy machine), so it is judged as the reply
        itself would be, not as load."""
        if self._done:
            return
        job = self._job
        worker_timeout = job.exception() if job is not None and job.done() else None
        self._finish(
            CompileTimeout(
                f"compiling took longer than {self.host.config.timeout_s:g} s (while {self._phase})",
                backend=self._backend_name,
                kind=self.constraint.kind.value,
            ),
            remember=self._constraints_own(worker_timeout),
        )

    def _finish(self, outcome: CompiledGrammar | BaseException, *, remember: bool) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
        self.host.finish(self, outcome, remember=remember)


def _internal(reason: str, backend: str, constraint: Constraint) -> InvalidConstraint:
    # Carried among the candidates' errors; combine_errors turns it back into an
    # InternalCompileError when nothing better was learnt.
    return _InternalFailure(reason, backend=backend, kind=constraint.kind.value)


class _InternalFailure(InvalidConstraint):
    """A candidate that failed for an internal reason (its worker crashed twice)."""


def combine_errors(constraint: Constraint, errors: list[InvalidGrammar]) -> BaseException:
    """The error to report when every candidate failed: the most informative cause."""

    def weight(e: InvalidGrammar) -> int:
        if isinstance(e.error, _InternalFailure):
            return 3
        if isinstance(e.error, CompileTimeout):
            return 2
        return 0 if e.error.backend is None else 1

    ranked = sorted(errors, key=weight)
    best = ranked[0].error
    if isinstance(best, _InternalFailure):
        return InternalCompileError(f"compiling failed: {best.reason}")
    if len(errors) == 1 or best.backend is None or all(e.error.reason == best.reason for e in errors):
        return best
    # Several backends refused: name each, the most informative first.
    tried = "; ".join(f"{e.backend}: {e.error.reason}" for e in ranked)
    cls = CompileTimeout if isinstance(best, CompileTimeout) else InvalidConstraint
    return cls(
        f"no backend could compile it ({tried})",
        pointer=best.pointer,
        position=best.position,
        kind=constraint.kind.value,
        line=best.line,
        column=best.column,
    )


class Deadlines:
    """One watchdog thread calling ``expire()`` on attempts whose deadline passed.

    It holds attempts weakly: a finished attempt (and the grammar its future holds) is
    freed at once, not at its deadline. An unfinished one is always held by the step it
    waits on (a queued task, a worker job's callback).
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, weakref.ref[CompileAttempt]]] = []
        self._order = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def watch(self, attempt: CompileAttempt) -> None:
        with self._cond:
            if self._closed:
                return
            entry = (attempt.deadline + WATCHDOG_GRACE_S, next(self._order), weakref.ref(attempt))
            heapq.heappush(self._heap, entry)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="thinkstruct-deadlines", daemon=True)
                self._thread.start()
            if self._heap[0] is entry:  # sooner than the watchdog sleeps to: wake it
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (not self._heap or self._heap[0][0] > time.monotonic()):
                    if self._heap:
                        self._cond.wait(self._heap[0][0] - time.monotonic())
                    else:
                        self._cond.wait()
                if self._closed:
                    return
                _, _, ref = heapq.heappop(self._heap)
            attempt = ref()
            if attempt is not None and not attempt.future.done():
                attempt.expire()
