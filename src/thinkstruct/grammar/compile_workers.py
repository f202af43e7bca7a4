"""Compiles in worker processes that can be killed.

xgrammar and outlines-core compile in native code that cannot be interrupted; some
schemas take minutes. A compile thread that runs past its time limit would pin a core
until it finishes, so those backends compile in a separate process: on timeout the
process is killed (its CPU is freed at once) and a fresh one is started for the next
compile. The compiled artefact travels back serialized (xgrammar's JSON form, outlines'
pickled index) and is rebuilt against the parent's tokenizer.

Workers are plain ``python -m thinkstruct.grammar.compile_worker_process`` subprocesses
speaking length-prefixed pickles over stdin/stdout, so they never re-import the parent's
``__main__`` (as multiprocessing's spawn would).
"""

from __future__ import annotations

import os
import pickle
import queue
import select
import struct
import subprocess
import sys
import threading
from typing import IO, TYPE_CHECKING, Any

from thinkstruct.errors import CompileTimeout, ThinkstructError

if TYPE_CHECKING:
    from thinkstruct.grammar.constraint import Constraint
    from thinkstruct.grammar.json_format import JsonFormat
    from thinkstruct.tokenizer import Tokenizer

_HEADER = struct.Struct("<Q")


class WorkerCrashed(ThinkstructError):
    """A compile worker process died (out of memory, a native crash)."""


class _Worker:
    def __init__(self, setup: bytes) -> None:
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "thinkstruct.grammar.compile_worker_process"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self.stdin: IO[bytes] = self.process.stdin
        self.stdout: IO[bytes] = self.process.stdout
        self.ready = False
        write_message(self.stdin, setup)

    def wait_ready(self) -> None:
        """Wait for the worker's start-up (imports, tokenizer, vocabularies) to finish."""
        if self.ready:
            return
        ready, _, _ = select.select([self.stdout], [], [], STARTUP_ALLOWANCE_S)
        if not ready or pickle.loads(read_message(self.stdout)) != "ready":
            raise WorkerCrashed("a compile worker did not start")
        self.ready = True

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        if self.alive():
            self.process.kill()
        self.process.wait(timeout=10)
        for stream in (self.stdin, self.stdout):
            try:
                stream.close()
            except OSError:
                pass


class CompileWorkers:
    """A small pool of compile processes for one tokenizer and JSON format.

    Args:
        tokenizer: pickled once into each worker.
        json_format: the JSON format every backend in the worker uses.
        processes: how many compiles may run at once.
    """

    def __init__(self, tokenizer: Tokenizer, json_format: JsonFormat, *, processes: int = 1) -> None:
        self._setup = pickle.dumps((tokenizer, json_format), protocol=pickle.HIGHEST_PROTOCOL)
        self._idle: queue.SimpleQueue[_Worker | None] = queue.SimpleQueue()
        self._all: set[_Worker] = set()
        self._lock = threading.Lock()
        self._closed = False
        for _ in range(processes):
            self._idle.put(None)  # a slot; its process starts on first use

    def compile(self, backend: str, constraint: Constraint, *, timeout_s: float) -> tuple[str, Any, float]:
        """Compile a constraint the caller has checked (``check_constraint``) in a worker:
        ``("ok", payload, seconds)`` or ``("invalid", error, seconds)``.

        The time limit covers the compile itself; a worker that is still starting (a few
        seconds: imports and the tokenizer's vocabularies) is waited for first.

        Raises:
            CompileTimeout: no answer in time; the worker was killed.
            WorkerCrashed: the worker died.
        """
        worker = self._idle.get()
        try:
            if worker is None or not worker.alive():
                worker = self._start()
            try:
                worker.wait_ready()
            except (WorkerCrashed, EOFError, OSError, pickle.UnpicklingError):
                self._discard(worker)
                worker = None
                raise WorkerCrashed(f"the {backend} compile worker did not start") from None
            # The caller has run thinkstruct's own checks on the constraint.
            write_message(worker.stdin, pickle.dumps((backend, constraint), protocol=pickle.HIGHEST_PROTOCOL))
            ready, _, _ = select.select([worker.stdout], [], [], max(timeout_s, 0.0))
            if not ready:
                self._discard(worker)
                worker = None
                raise CompileTimeout(
                    "compiling took too long and was stopped", backend=backend, kind=constraint.kind.value
                )
            try:
                reply = pickle.loads(read_message(worker.stdout))
            except (EOFError, OSError, pickle.UnpicklingError):
                self._discard(worker)
                worker = None
                raise WorkerCrashed(f"the {backend} compile worker died") from None
            return reply
        except BrokenPipeError:
            if worker is not None:
                self._discard(worker)
                worker = None
            raise WorkerCrashed(f"the {backend} compile worker died") from None
        finally:
            self._idle.put(worker)

    def warm_up(self) -> None:
        """Start every worker process that is not running yet."""
        slots = []
        while True:
            try:
                slots.append(self._idle.get_nowait())
            except queue.Empty:
                break
        try:
            slots = [w if w is not None and w.alive() else self._start() for w in slots]
            for w in slots:
                w.wait_ready()
        finally:
            for w in slots:
                self._idle.put(w)

    def pids(self) -> list[int]:
        """Process ids of the live workers."""
        with self._lock:
            return [w.process.pid for w in self._all if w.alive()]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers = list(self._all)
        for w in workers:
            self._discard(w)

    def _start(self) -> _Worker:
        with self._lock:
            if self._closed:
                raise ThinkstructError("the compiler is closed")
        worker = _Worker(self._setup)
        with self._lock:
            self._all.add(worker)
        return worker

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self._all.discard(worker)


#: Most seconds a new worker may take to start (imports, tokenizer, vocabularies).
STARTUP_ALLOWANCE_S = 60.0


def write_message(stream: IO[bytes], payload: bytes) -> None:
    stream.write(_HEADER.pack(len(payload)))
    stream.write(payload)
    stream.flush()


def read_message(stream: IO[bytes]) -> bytes:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError
    (size,) = _HEADER.unpack(header)
    payload = stream.read(size)
    if len(payload) < size:
        raise EOFError
    return payload
