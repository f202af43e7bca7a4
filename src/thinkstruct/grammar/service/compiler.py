"""The compile service: :class:`GrammarCompiler`.

Compiling is the expensive part of constrained decoding (xgrammar's median is about a
second over a 129k vocabulary, some schemas take minutes), so the service:

- caches compiled grammars in a bounded LRU (by entries and measured bytes), keyed by the
  backend, the strictness and the constraint;
- shares one compile among all callers asking for the same cold key at once;
- compiles off the caller's thread: small in-process work on a thread pool, everything
  that may run long (xgrammar, outlines-core, large llguidance grammars) in worker
  processes it can kill, so a cheap compile never waits behind an expensive one
  (see :mod:`.attempt`);
- gives every request one absolute deadline (``timeout_s`` from the call) covering the
  queue, worker start-up, fallbacks and the compile; at the deadline the caller gets
  :class:`~thinkstruct.CompileTimeout` and the work is stopped;
- remembers a constraint's failure for ``failure_ttl_s`` (never an internal error, such
  as a worker crash, nor a timeout caused by load), measured on an injectable clock;
- chooses the backend per constraint with ``backend="auto"`` (see :mod:`.auto`);
- counts what it does (:class:`CompilerStats`) for the server's ``/metrics``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Self, cast

from thinkstruct.errors import CompileTimeout, InvalidConstraint, ThinkstructError
from thinkstruct.grammar.backends import BACKEND_NAMES, backend_class, backend_classes
from thinkstruct.grammar.base import CompiledGrammar, GrammarBackend
from thinkstruct.grammar.service.attempt import CompileAttempt, Deadlines
from thinkstruct.grammar.service.config import CompilerConfig, check_backend_name
from thinkstruct.grammar.service.workers import WorkerPool
from thinkstruct.grammar.service.zygote import STARTUP_ALLOWANCE_S

if TYPE_CHECKING:
    from thinkstruct.grammar.constraint import Constraint
    from thinkstruct.tokenizer import Tokenizer

__all__ = ["CompilerConfig", "CompilerStats", "GrammarCompiler"]

#: Seconds a blocked caller waits past its deadline for the attempt's own answer before
#: giving up itself (the watchdog answers within milliseconds; this is a safety net).
_CALLER_MARGIN_S = 1.0


@dataclass
class CompilerStats:
    """Counters of one :class:`GrammarCompiler` (monotonic except ``entries``/``bytes``)."""

    hits: int = 0
    misses: int = 0
    compiles: int = 0
    compile_seconds: float = 0.0
    timeouts: int = 0
    fallbacks: int = 0
    invalid: int = 0
    evictions: int = 0
    #: Compile worker processes that died (each is retried once on a fresh worker).
    worker_crashes: int = 0
    #: Requests that failed for an internal reason (not the constraint's).
    internal_errors: int = 0
    entries: int = 0
    bytes: int = 0

    def snapshot(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, slots=True)
class _Key:
    backend: str
    strict: bool
    constraint: Constraint


@dataclass(frozen=True, slots=True)
class _Failure:
    error: BaseException
    expires: float


class GrammarCompiler:
    """Compiles constraints for one tokenizer, with a cache, deadlines and backend choice.

    Args:
        tokenizer: the model's vocabulary.
        config: how to compile (defaults: :class:`CompilerConfig`).
        clock: seconds on a monotonic clock, read for the failure memory's expiry
            (``failure_ttl_s``) and nothing else; compile deadlines bound real work, so
            they always run on :func:`time.monotonic`. Tests pass a clock they advance.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        config: CompilerConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tokenizer = tokenizer
        self.config = config or CompilerConfig()
        self.clock = clock
        self.stats = CompilerStats()
        self._cache: OrderedDict[_Key, CompiledGrammar] = OrderedDict()
        self._failures: dict[_Key, _Failure] = {}
        self._inflight: dict[_Key, concurrent.futures.Future[CompiledGrammar]] = {}
        self._lock = threading.Lock()
        self._backends: dict[tuple[str, bool], GrammarBackend] = {}
        self._pools: dict[str, WorkerPool] = {}
        self._inline = concurrent.futures.ThreadPoolExecutor(
            self.config.threads, thread_name_prefix="thinkstruct-compile"
        )
        self._inline_large = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="thinkstruct-compile-large"
        )
        self._deadlines = Deadlines()
        self._closed = False

    # ---- public ----------------------------------------------------------------------

    def compile(
        self, constraint: Constraint, *, backend: str | None = None, strict: bool | None = None
    ) -> CompiledGrammar:
        """The compiled grammar, from the cache or compiled now (off this thread).

        Args:
            backend, strict: override the config's for this call (part of the cache key).

        Raises:
            InvalidConstraint: the constraint is invalid, or no backend may enforce it.
            CompileTimeout: no grammar within ``timeout_s`` of the call.
            InternalCompileError: compiling failed for a reason not the constraint's.
        """
        key = self._key(constraint, backend, strict)
        hit = self._lookup(key)
        if hit is not None:
            return hit
        start = time.monotonic()
        future = self._submit(key)
        try:
            return future.result(
                timeout=self.config.timeout_s + _CALLER_MARGIN_S - (time.monotonic() - start)
            )
        except concurrent.futures.TimeoutError:
            raise self._waited_too_long(constraint) from None

    async def compile_async(
        self, constraint: Constraint, *, backend: str | None = None, strict: bool | None = None
    ) -> CompiledGrammar:
        """As :meth:`compile`, awaiting instead of blocking the event loop."""
        key = self._key(constraint, backend, strict)
        hit = self._lookup(key)
        if hit is not None:
            return hit
        return await self.wait_async(self._submit(key), constraint)

    async def wait_async(
        self, future: concurrent.futures.Future[CompiledGrammar], constraint: Constraint
    ) -> CompiledGrammar:
        """The grammar of a future from :meth:`submit`, awaited without blocking the event
        loop, within the same time limit as :meth:`compile`.

        Raises:
            InvalidConstraint, CompileTimeout, InternalCompileError: as :meth:`compile`.
        """
        try:
            return await asyncio.wait_for(
                asyncio.shield(asyncio.wrap_future(future)), self.config.timeout_s + _CALLER_MARGIN_S
            )
        except TimeoutError:
            raise self._waited_too_long(constraint) from None

    def submit(
        self, constraint: Constraint, *, backend: str | None = None, strict: bool | None = None
    ) -> concurrent.futures.Future[CompiledGrammar]:
        """A future of the compiled grammar, done by ``timeout_s`` after the call;
        concurrent callers of one key share it."""
        return self._submit(self._key(constraint, backend, strict))

    def warm_up(
        self, backends: tuple[str, ...] | None = None, *, timeout_s: float = STARTUP_ALLOWANCE_S
    ) -> None:
        """Build what compiles need now rather than at the first compile: the in-process
        vocabulary views and the compile workers.

        Args:
            backends: whose workers to start (default: every backend that compiles in a
                worker, and llguidance for large grammars, when the config's backend is
                ``auto``; else that backend's).
            timeout_s: most seconds to wait for them to be ready.
        """
        # In-process state every first compile would otherwise build: the text encoder
        # the probes use and the vocabulary views of the backends that compile in threads
        # (seconds each on 129k tokens).
        self.tokenizer.encode("")
        for cls in backend_classes():
            if not cls.isolated:
                self.backend(cls.name, False)
        if self.config.worker_processes == 0:
            return
        if backends is None:
            if self.config.backend == "auto":
                backends = BACKEND_NAMES
            else:
                backends = (self.config.backend,)
        # Every pool's workers start at once (their start-ups overlap), then are waited for.
        deadline = time.monotonic() + timeout_s
        started = [(pool, pool.start()) for pool in (self._pool(name) for name in backends)]
        for pool, workers in started:
            pool.wait_ready(workers, deadline)

    def close(self) -> None:
        """Stop the compile workers and threads; pending requests fail."""
        with self._lock:
            self._closed = True
            pools = list(self._pools.values())
            pending = list(self._inflight.values())
            self._inflight.clear()
        for pool in pools:
            pool.close()
        self._deadlines.close()
        self._inline.shutdown(wait=False, cancel_futures=True)
        self._inline_large.shutdown(wait=False, cancel_futures=True)
        for future in pending:
            if not future.done():
                future.set_exception(ThinkstructError("the compiler is closed"))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def worker_pids(self) -> list[int]:
        """Process ids of the live compile workers (for monitoring and tests)."""
        with self._lock:
            pools = list(self._pools.values())
        return [pid for pool in pools for pid in pool.pids()]

    # ---- the cache and in-flight compiles --------------------------------------------

    def _key(self, constraint: Constraint, backend: str | None, strict: bool | None) -> _Key:
        if backend is None:
            backend = self.config.backend
        else:
            check_backend_name(backend)
        return _Key(backend, self.config.strict if strict is None else strict, constraint)

    def _lookup(self, key: _Key) -> CompiledGrammar | None:
        with self._lock:
            return self._cached(key)

    def _cached(self, key: _Key) -> CompiledGrammar | None:
        # The caller holds the lock.
        compiled = self._cache.get(key)
        if compiled is not None:
            self._cache.move_to_end(key)
            self.stats.hits += 1
        return compiled

    def _submit(self, key: _Key) -> concurrent.futures.Future[CompiledGrammar]:
        with self._lock:
            if self._closed:
                return _failed(ThinkstructError("the compiler is closed"))
            compiled = self._cached(key)
            if compiled is not None:
                return _done(compiled)
            failure = self._failures.get(key)
            if failure is not None:
                if failure.expires > self.clock():
                    self.stats.hits += 1
                    return _failed(failure.error)
                del self._failures[key]
            future = self._inflight.get(key)
            if future is not None:
                self.stats.hits += 1
                return future
            self.stats.misses += 1
            future = concurrent.futures.Future()
            self._inflight[key] = future
        attempt = CompileAttempt(
            self,
            key,
            key.constraint,
            backend=key.backend,
            strict=key.strict,
            deadline=time.monotonic() + self.config.timeout_s,
            future=future,
        )
        self._deadlines.watch(attempt)
        self.run_inline(attempt.start, large=attempt.large)
        return future

    def _waited_too_long(self, constraint: Constraint) -> CompileTimeout:
        with self._lock:
            self.stats.timeouts += 1
        return CompileTimeout(
            f"compiling took longer than {self.config.timeout_s:g} s", kind=constraint.kind.value
        )

    def _store(self, key: _Key, compiled: CompiledGrammar) -> None:
        # The caller holds the lock.
        self._cache[key] = compiled
        self.stats.bytes += compiled.memory_bytes
        while len(self._cache) > self.config.cache_entries or (
            self.stats.bytes > self.config.cache_bytes and len(self._cache) > 1
        ):
            _, evicted = self._cache.popitem(last=False)
            self.stats.bytes -= evicted.memory_bytes
            self.stats.evictions += 1
        self.stats.entries = len(self._cache)

    # ---- AttemptHost -----------------------------------------------------------------

    def backend(self, name: str, lenient: bool) -> GrammarBackend:
        """The shared backend instance for ``name`` in this compiler's JSON format."""
        with self._lock:
            backend = self._backends.get((name, lenient))
        if backend is None:
            # Built outside the lock: the first instance builds the backend's vocabulary
            # view (seconds), which must not stall cache hits.
            built = backend_class(name)(self.tokenizer, json_format=self.config.json_format, lenient=lenient)
            with self._lock:
                backend = self._backends.setdefault((name, lenient), built)
        return backend

    def pool_for(self, backend: GrammarBackend, constraint: Constraint) -> WorkerPool | None:
        """The worker pool a compile goes to, or ``None`` to compile it in a thread."""
        if self.config.worker_processes == 0:
            return None
        if (
            backend.isolated
            or len(constraint.value) > self.config.inline_compile_bytes
            or backend.runs_long(constraint)
        ):
            return self._pool(backend.name)
        return None

    def run_inline(self, task: Callable[[], None], *, large: bool) -> None:
        """Run a step of an attempt in this process: a small constraint's on the pool of
        ``threads``, a large one's (checks of megabytes, loading big artefacts) on a thread
        of its own, so small requests never queue behind large ones."""
        try:
            (self._inline_large if large else self._inline).submit(task)
        except RuntimeError:  # shut down: the attempt's future was failed by close()
            pass

    def count(self, counter: str) -> None:
        with self._lock:
            setattr(self.stats, counter, getattr(self.stats, counter) + 1)

    def finish(
        self, attempt: CompileAttempt, outcome: CompiledGrammar | BaseException, *, remember: bool
    ) -> None:
        """Record an attempt's outcome and complete its future."""
        key = cast(_Key, attempt.key)
        with self._lock:
            self._inflight.pop(key, None)
            if isinstance(outcome, CompiledGrammar):
                self.stats.compiles += 1
                self.stats.compile_seconds += time.monotonic() - attempt.started
                self._store(key, outcome)
            else:
                if isinstance(outcome, CompileTimeout):
                    self.stats.timeouts += 1
                elif isinstance(outcome, InvalidConstraint):
                    self.stats.invalid += 1
                else:
                    self.stats.internal_errors += 1
                if remember and isinstance(outcome, InvalidConstraint):
                    self._failures[key] = _Failure(outcome, self.clock() + self.config.failure_ttl_s)
        future = attempt.future
        if future.done():
            return
        if isinstance(outcome, CompiledGrammar):
            future.set_result(outcome)
        else:
            future.set_exception(outcome)

    def _pool(self, name: str) -> WorkerPool:
        with self._lock:
            if self._closed:
                raise ThinkstructError("the compiler is closed")
            pool = self._pools.get(name)
            if pool is None:
                # Derived once here and shipped to every worker with the tokenizer.
                self.tokenizer.all_special_json()
                self.tokenizer.decoded_vocab()
                pool = self._pools[name] = WorkerPool(
                    name,
                    self.tokenizer,
                    self.config.json_format,
                    processes=self.config.worker_processes,
                    on_crash=lambda: self.count("worker_crashes"),
                )
        return pool


def _done(value: CompiledGrammar) -> concurrent.futures.Future[CompiledGrammar]:
    f: concurrent.futures.Future[CompiledGrammar] = concurrent.futures.Future()
    f.set_result(value)
    return f


def _failed(error: BaseException) -> concurrent.futures.Future[CompiledGrammar]:
    f: concurrent.futures.Future[CompiledGrammar] = concurrent.futures.Future()
    f.set_exception(error)
    return f
