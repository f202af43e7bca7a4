"""Compiles in worker processes that can be killed: :class:`WorkerPool`.

Some compiles run in native code that cannot be interrupted and may take minutes
(xgrammar, outlines-core, llguidance on very large grammars). A thread running past its
time limit would pin a core until it finishes, so such compiles run in a separate process:
at the deadline the process is killed (its CPU is freed at once) and a fresh one is
started for the next compile. The compiled artefact travels back serialized (xgrammar's
JSON form, outlines' pickled index) and is rebuilt against the parent's tokenizer.

One pool per backend, each worker building only that backend's view of the vocabulary.
A job carries an absolute deadline that covers every wait: the queue, a worker still
starting, the compile. Each worker slot is served by its own dispatcher thread, so a
caller never holds a thread while it waits, and a job whose deadline passed in the queue
is dropped without running. A worker that dies (out of memory, a native crash) is an
internal error, not the constraint's fault: the job is retried once on a fresh worker and
the crash is counted.

Workers are forked, their setup already built, from a zygote process
(:mod:`~thinkstruct.grammar.service.zygote`: a few milliseconds against 2-3 CPU-seconds for
a process of its own), and speak length-prefixed pickles over pipes, so they never
re-import the parent's ``__main__`` (as multiprocessing's spawn would). What the libraries
print to stderr (C++ warnings, Rust panics) is forwarded line by line to the
``thinkstruct.grammar`` logger.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import pickle
import select
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

from thinkstruct.errors import CompileTimeout, InternalCompileError, ThinkstructError
from thinkstruct.grammar.service import zygote
from thinkstruct.grammar.service.messages import read_message, write_message
from thinkstruct.grammar.service.zygote import STARTUP_ALLOWANCE_S, Started, WorkerProcess, start_worker

if TYPE_CHECKING:
    from thinkstruct.grammar.constraint import Constraint
    from thinkstruct.grammar.json_format import JsonFormat
    from thinkstruct.tokenizer import Tokenizer

logger = logging.getLogger("thinkstruct.grammar")

#: A worker's reply: ``("ok", (payload, start row bytes), seconds)`` or
#: ``("invalid", InvalidConstraint, seconds)``; the start row is the probe's first mask
#: (:attr:`~thinkstruct.grammar.compiled.CompiledGrammar.start_row`), empty when none.
Reply = tuple[str, Any, float]


class WorkerCrashed(InternalCompileError):
    """A compile worker process died twice on one job (out of memory, a native crash)."""


class QueueTimeout(CompileTimeout):
    """The deadline passed before a worker could take the job: a matter of load, not of the
    constraint, so it is never remembered as the constraint's failure."""


class WorkTimeout(CompileTimeout):
    """The compile itself ran to the deadline and its worker was killed.

    Attributes:
        waited_s: seconds the job waited before the worker took it, for a free worker or
            one starting (the pool's load, not the constraint's doing).
    """

    waited_s: float = 0.0


@dataclass(eq=False)
class _Job:
    lenient: bool
    constraint: Constraint
    deadline: float
    future: concurrent.futures.Future[Reply] = field(default_factory=concurrent.futures.Future)
    crashes: int = 0
    submitted: float = field(default_factory=time.monotonic)


class _Worker:
    """One compile worker, from the moment it is asked for: it starts on a thread of its
    own (a fork from the zygote, or a process of its own), so asking never blocks."""

    def __init__(self, setup: bytes, backend: str) -> None:
        self.backend = backend
        self.started = time.monotonic()
        self.ready = False
        # Readiness is read by one thread at a time (a dispatcher or warm-up).
        self._ready_lock = threading.Lock()
        self._killed = False
        self._start: concurrent.futures.Future[Started] = concurrent.futures.Future()
        threading.Thread(
            target=self._begin, args=(setup,), name=f"thinkstruct-{backend}-start", daemon=True
        ).start()

    def _begin(self, setup: bytes) -> None:
        try:
            self._start.set_result(start_worker(setup, self.backend))
        except BaseException as error:  # noqa: BLE001 - the waiter reports it
            self._start.set_exception(error)

    @property
    def process(self) -> WorkerProcess:
        """The worker's process (once :meth:`wait_ready` said it is ready)."""
        return self._start.result(0).process

    @property
    def stdin(self) -> IO[bytes]:
        return self._start.result(0).stdin

    @property
    def stdout(self) -> IO[bytes]:
        return self._start.result(0).stdout

    def pid(self) -> int | None:
        """Its process id, once it has one."""
        if not self._start.done() or self._start.exception() is not None:
            return None
        return self._start.result().process.pid

    def wait_ready(self, deadline: float) -> bool:
        """Wait until the worker has started, at most until ``deadline``; whether it has.

        Raises:
            WorkerCrashed: it died while starting, or took longer than
                :data:`STARTUP_ALLOWANCE_S`.
        """
        if self.ready:
            return True
        limit = min(deadline, self.started + STARTUP_ALLOWANCE_S)
        if not self._ready_lock.acquire(timeout=max(limit - time.monotonic(), 0.0)):
            return False
        try:
            if self.ready:
                return True
            try:
                stdout: IO[bytes] | None = self._start.result(
                    timeout=max(limit - time.monotonic(), 0.0)
                ).stdout
            except concurrent.futures.TimeoutError:
                stdout = None
            except Exception:  # noqa: BLE001 - no process could be started
                raise WorkerCrashed(f"a {self.backend} compile worker could not be started") from None
            if stdout is None or not select.select([stdout], [], [], max(limit - time.monotonic(), 0.0))[0]:
                if time.monotonic() >= self.started + STARTUP_ALLOWANCE_S:
                    raise WorkerCrashed(f"a {self.backend} compile worker did not start")
                return False
            try:
                if pickle.loads(read_message(stdout)) != "ready":
                    raise EOFError
            except (EOFError, OSError, pickle.UnpicklingError):
                raise WorkerCrashed(f"a {self.backend} compile worker died while starting") from None
            self.ready = True
            return True
        finally:
            self._ready_lock.release()

    def alive(self) -> bool:
        if not self._start.done():
            return not self._killed
        if self._start.exception() is not None:
            return False
        return self._start.result().process.poll() is None

    def kill(self) -> None:
        """Kill it and close its pipes (where it is still starting: once it has started)."""
        self._killed = True
        self._start.add_done_callback(_end)


def _end(start: concurrent.futures.Future[Started]) -> None:
    if start.exception() is not None:
        return
    started = start.result()
    if started.process.poll() is None:
        started.process.kill()
    try:
        started.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        logger.warning("compile worker %d outlived SIGKILL by 10 s", started.process.pid)
    for stream in (started.stdin, started.stdout):
        try:
            stream.close()
        except OSError:
            pass


class WorkerPool:
    """Worker processes of one backend for one tokenizer and JSON format.

    Args:
        backend: the backend every worker of this pool compiles with.
        tokenizer: pickled once into each worker.
        json_format: the JSON format of the backend in each worker.
        processes: how many compiles may run at once.
        on_crash: called once per worker that died (for the compiler's counters).
    """

    def __init__(
        self,
        backend: str,
        tokenizer: Tokenizer,
        json_format: JsonFormat,
        *,
        processes: int = 1,
        on_crash: Callable[[], None] = lambda: None,
    ) -> None:
        if processes < 1:
            raise ValueError("a worker pool needs at least one process")
        self.backend = backend
        self._setup = pickle.dumps((tokenizer, json_format, backend), protocol=pickle.HIGHEST_PROTOCOL)
        self._processes = processes
        self._on_crash = on_crash
        self._queue: collections.deque[_Job] = collections.deque()
        self._cond = threading.Condition()
        self._workers: list[_Worker | None] = [None] * processes
        self._dispatchers: list[threading.Thread] = []
        self._closed = False
        zygote.hold()

    # ---- public ----------------------------------------------------------------------

    def submit(
        self, constraint: Constraint, *, lenient: bool, deadline: float
    ) -> concurrent.futures.Future[Reply]:
        """Queue a compile of a checked constraint; the future holds the worker's reply.

        The future fails with :class:`QueueTimeout` or :class:`WorkTimeout` at
        ``deadline`` (a ``time.monotonic()`` value), with :class:`WorkerCrashed` after a
        second crash, or with :class:`~thinkstruct.ThinkstructError` once the pool is closed.
        """
        job = _Job(lenient, constraint, deadline)
        with self._cond:
            if self._closed:
                raise ThinkstructError("the compiler is closed")
            self._start_dispatchers()
            self._queue.append(job)
            self._cond.notify()
        return job.future

    def warm_up(self, timeout_s: float = STARTUP_ALLOWANCE_S) -> None:
        """Start every worker of the pool now and wait (at most ``timeout_s``) until each is ready."""
        self.wait_ready(self.start(), time.monotonic() + timeout_s)

    def start(self) -> list[_Worker]:
        """Start every worker of the pool that is not running, without waiting; the
        workers, for :meth:`wait_ready`."""
        with self._cond:
            if self._closed:
                raise ThinkstructError("the compiler is closed")
            self._start_dispatchers()
            starting = []
            for slot, worker in enumerate(self._workers):
                if worker is None or not worker.alive():
                    worker = self._workers[slot] = _Worker(self._setup, self.backend)
                starting.append(worker)
        return starting

    def wait_ready(self, workers: list[_Worker], deadline: float) -> None:
        """Wait until each of ``workers`` (from :meth:`start`) is ready, at most until ``deadline``."""
        for worker in workers:
            try:
                worker.wait_ready(deadline)
            except WorkerCrashed:
                self._on_crash()  # the dispatcher replaces it on its next job

    def pids(self) -> list[int]:
        """Process ids of the live workers."""
        with self._cond:
            return [
                pid for w in self._workers if w is not None and w.alive() and (pid := w.pid()) is not None
            ]

    def close(self) -> None:
        """Kill every worker and fail the jobs still queued."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            workers = [w for w in self._workers if w is not None]
            self._workers = [None] * self._processes
            queued = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        for w in workers:
            w.kill()
        zygote.release()
        for job in queued:
            _fail(job, ThinkstructError("the compiler is closed"))

    # ---- the dispatchers -----------------------------------------------------------

    def _start_dispatchers(self) -> None:
        # The caller holds the condition.
        while len(self._dispatchers) < self._processes:
            slot = len(self._dispatchers)
            thread = threading.Thread(
                target=self._dispatch, args=(slot,), name=f"thinkstruct-{self.backend}-{slot}", daemon=True
            )
            self._dispatchers.append(thread)
            thread.start()

    def _next_job(self) -> _Job | None:
        with self._cond:
            while True:
                if self._closed:
                    return None
                while self._queue:
                    job = self._queue.popleft()
                    if job.future.done():
                        continue  # the caller gave up
                    if time.monotonic() >= job.deadline:
                        _fail(job, QueueTimeout("no compile worker was free before the deadline"))
                        continue
                    return job
                self._cond.wait()

    def _dispatch(self, slot: int) -> None:
        while True:
            job = self._next_job()
            if job is None:
                return
            try:
                self._run(slot, job)
            except BaseException as error:  # noqa: BLE001 - a bug here must not kill the slot
                _fail(job, error)

    def _worker(self, slot: int) -> _Worker:
        with self._cond:
            if self._closed:
                raise ThinkstructError("the compiler is closed")
            worker = self._workers[slot]
            if worker is None or not worker.alive():
                if worker is not None:
                    worker.kill()
                worker = self._workers[slot] = _Worker(self._setup, self.backend)
            return worker

    def _discard(self, slot: int, worker: _Worker) -> None:
        worker.kill()
        with self._cond:
            if self._workers[slot] is worker:
                self._workers[slot] = None

    def _run(self, slot: int, job: _Job) -> None:
        kind = job.constraint.kind.value
        while True:
            worker = self._worker(slot)
            try:
                started = worker.wait_ready(job.deadline)
            except WorkerCrashed:
                self._discard(slot, worker)
                self._on_crash()
                if self._retry(job):
                    continue
                raise
            if not started:
                # Still starting: it stays for the next job; this one ran out of time.
                _fail(
                    job, QueueTimeout(f"the {self.backend} compile worker was still starting at the deadline")
                )
                return
            taken = time.monotonic()
            try:
                write_message(
                    worker.stdin,
                    pickle.dumps((job.lenient, job.constraint), protocol=pickle.HIGHEST_PROTOCOL),
                )
                ready, _, _ = select.select(
                    [worker.stdout], [], [], max(job.deadline - time.monotonic(), 0.0)
                )
                if not ready:
                    timeout = WorkTimeout(
                        "compiling took too long and was stopped", backend=self.backend, kind=kind
                    )
                    timeout.waited_s = taken - job.submitted
                    worker.process.kill()  # the CPU is free from here on
                    _fail(job, timeout)  # then the caller, then reaping the process
                    self._discard(slot, worker)
                    self._replace(slot)
                    return
                reply: Reply = pickle.loads(read_message(worker.stdout))
            except (EOFError, OSError, pickle.UnpicklingError):
                self._discard(slot, worker)
                self._on_crash()
                if self._retry(job):
                    continue
                raise WorkerCrashed(
                    f"the {self.backend} compile worker died twice compiling this constraint"
                ) from None
            if not job.future.done():
                job.future.set_result(reply)
            return

    def _replace(self, slot: int) -> None:
        # Start the next worker now, so the next job finds it (nearly) ready.
        try:
            self._worker(slot)
        except ThinkstructError:  # closed meanwhile
            pass

    def _retry(self, job: _Job) -> bool:
        job.crashes += 1
        return job.crashes < 2 and time.monotonic() < job.deadline and not job.future.done()


def _fail(job: _Job, error: BaseException) -> None:
    if not job.future.done():
        job.future.set_exception(error)
