"""The compile service: :class:`GrammarCompiler`.

Compiling is the expensive part of constrained decoding (xgrammar's median is about a
second over a 129k vocabulary, some schemas take minutes), so the service:

- caches compiled grammars in a bounded LRU (by entries and approximate bytes), keyed by
  the backend options and the constraint;
- shares one compile among all callers asking for the same cold key at once;
- compiles off the caller's thread (a thread pool; xgrammar and outlines-core in worker
  processes it can kill);
- fails a compile that runs past ``timeout_s`` with :class:`~thinkstruct.CompileTimeout`,
  stops its work, and remembers the failure only for ``failure_ttl_s``;
- chooses the backend per constraint with ``backend="auto"`` (see :mod:`.auto`);
- counts what it does (:class:`CompilerStats`) for the server's ``/metrics``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from thinkstruct.errors import CompileTimeout, InvalidConstraint, UnsupportedConstraint
from thinkstruct.grammar.auto import Candidate, plan
from thinkstruct.grammar.backends import BACKEND_NAMES, backend_class
from thinkstruct.grammar.base import CompiledGrammar, GrammarBackend, InvalidGrammar
from thinkstruct.grammar.compile_workers import STARTUP_ALLOWANCE_S, CompileWorkers, WorkerCrashed
from thinkstruct.grammar.json_format import JsonFormat
from thinkstruct.grammar.validation import check_constraint

if TYPE_CHECKING:
    from thinkstruct.grammar.constraint import Constraint
    from thinkstruct.tokenizer import Tokenizer


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
    error: InvalidConstraint
    expires: float


@dataclass(frozen=True, kw_only=True)
class CompilerConfig:
    """How a :class:`GrammarCompiler` compiles; the server builds one from its command line.

    Args:
        backend: ``"auto"`` (per constraint, see :mod:`thinkstruct.grammar.auto`) or one of
            ``xgrammar``, ``llguidance``, ``outlines``; a call may ask for another.
        strict: with ``auto``, refuse a constraint that no backend enforces exactly,
            listing every keyword none can enforce with its JSON pointer; without it, fall
            back to a backend that ignores those keywords (named on the result's
            ``ignored_keywords``).
        json_format: the JSON text format every backend is configured to.
        cache_entries: most compiled grammars kept.
        cache_bytes: most bytes of compiled grammars kept (as accounted by each grammar's
            ``memory_bytes``).
        timeout_s: seconds one compile may take in all, from the call: waiting for a
            worker, fallbacks and checks included.
        failure_ttl_s: seconds an invalid or timed-out constraint is answered from memory
            before it may be tried again.
        threads: in-process compiles (llguidance, thinkstruct's checks) that may run at once.
        worker_processes: compile processes per backend that compiles out of process;
            0 compiles everything in threads instead (faster to start, but a timed-out
            compile then runs on).
    """

    backend: str = "auto"
    strict: bool = False
    json_format: JsonFormat = field(default_factory=JsonFormat)
    cache_entries: int = 1024
    cache_bytes: int = 2 << 30
    timeout_s: float = 30.0
    failure_ttl_s: float = 30.0
    threads: int = 4
    worker_processes: int = 1

    def __post_init__(self) -> None:
        check_backend_name(self.backend)
        if self.cache_entries < 1 or self.cache_bytes < 1:
            raise ValueError("cache_entries and cache_bytes must be positive")
        if not self.timeout_s > 0:
            raise ValueError("timeout_s must be positive")
        if self.failure_ttl_s < 0:
            raise ValueError("failure_ttl_s must not be negative")
        if self.threads < 1 or self.worker_processes < 0:
            raise ValueError("threads must be positive and worker_processes not negative")


def check_backend_name(name: str) -> None:
    """Raise ``ValueError`` listing the known names unless ``name`` is ``auto`` or a backend."""
    if name != "auto" and name not in BACKEND_NAMES:
        raise ValueError(f"unknown backend {name!r}; known backends: auto, {', '.join(BACKEND_NAMES)}")


class GrammarCompiler:
    """Compiles constraints for one tokenizer, with a cache, timeouts and backend choice.

    Args:
        tokenizer: the model's vocabulary.
        config: how to compile (defaults: :class:`CompilerConfig`).
    """

    def __init__(self, tokenizer: Tokenizer, config: CompilerConfig | None = None) -> None:
        config = config or CompilerConfig()
        self.tokenizer = tokenizer
        self.config = config
        self.stats = CompilerStats()
        self._cache: OrderedDict[_Key, CompiledGrammar] = OrderedDict()
        self._failures: dict[_Key, _Failure] = {}
        self._inflight: dict[_Key, concurrent.futures.Future[CompiledGrammar]] = {}
        self._lock = threading.Lock()
        self._backends: dict[tuple[str, bool], GrammarBackend] = {}
        self._backends_lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(config.threads, thread_name_prefix="thinkstruct-compile")
        self._workers = (
            CompileWorkers(tokenizer, config.json_format, processes=config.worker_processes)
            if config.worker_processes > 0
            else None
        )

    # ---- public ----------------------------------------------------------------------

    def compile(
        self, constraint: Constraint, *, backend: str | None = None, strict: bool | None = None
    ) -> CompiledGrammar:
        """The compiled grammar, from the cache or compiled now (off this thread).

        Args:
            backend, strict: override the config's for this call (part of the cache key).

        Raises:
            InvalidConstraint: the constraint is invalid, or no backend may enforce it.
            CompileTimeout: compiling took longer than ``timeout_s``.
        """
        key = self._key(constraint, backend, strict)
        hit = self._lookup(key)
        if hit is not None:
            return hit
        future = self._submit(key)
        try:
            return future.result(timeout=self._wait_limit_s)
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
        future = asyncio.wrap_future(self._submit(key))
        try:
            return await asyncio.wait_for(asyncio.shield(future), self._wait_limit_s)
        except asyncio.TimeoutError:
            raise self._waited_too_long(constraint) from None

    def submit(
        self, constraint: Constraint, *, backend: str | None = None, strict: bool | None = None
    ) -> concurrent.futures.Future[CompiledGrammar]:
        """A future of the compiled grammar; concurrent callers of one key share it."""
        return self._submit(self._key(constraint, backend, strict))

    def _submit(self, key: _Key) -> concurrent.futures.Future[CompiledGrammar]:
        with self._lock:
            compiled = self._cached(key)
            if compiled is not None:
                return _done(compiled)
            failure = self._failures.get(key)
            if failure is not None:
                if failure.expires > time.monotonic():
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
        self._pool.submit(self._run, key, future)
        return future

    @property
    def _wait_limit_s(self) -> float:
        # The compile itself enforces timeout_s (a worker is killed at its deadline); the
        # caller waits longer only as a safety net, e.g. for a worker still starting.
        return self.config.timeout_s + STARTUP_ALLOWANCE_S + 5.0

    def warm_up(self) -> None:
        """Start the compile workers now rather than at the first compile that needs one."""
        if self._workers is not None:
            self._workers.warm_up()

    def close(self) -> None:
        """Stop the compile workers and threads."""
        if self._workers is not None:
            self._workers.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> GrammarCompiler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def worker_pids(self) -> list[int]:
        """Process ids of the live compile workers (for monitoring and tests)."""
        return self._workers.pids() if self._workers is not None else []

    # ---- internals -------------------------------------------------------------------

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

    def _waited_too_long(self, constraint: Constraint) -> CompileTimeout:
        with self._lock:
            self.stats.timeouts += 1
        return CompileTimeout(
            f"compiling took longer than {self.config.timeout_s:g} s", kind=constraint.kind.value
        )

    def _run(self, key: _Key, future: concurrent.futures.Future[CompiledGrammar]) -> None:
        start = time.perf_counter()
        try:
            compiled = self._compile_planned(key, deadline=time.monotonic() + self.config.timeout_s)
        except InvalidConstraint as error:
            with self._lock:
                self._inflight.pop(key, None)
                self._failures[key] = _Failure(error, time.monotonic() + self.config.failure_ttl_s)
                if isinstance(error, CompileTimeout):
                    self.stats.timeouts += 1
                else:
                    self.stats.invalid += 1
            future.set_exception(error)
            return
        except BaseException as error:  # a bug, not bad input: report it, cache nothing
            with self._lock:
                self._inflight.pop(key, None)
            future.set_exception(error)
            return
        with self._lock:
            self._inflight.pop(key, None)
            self.stats.compiles += 1
            self.stats.compile_seconds += time.perf_counter() - start
            self._store(key, compiled)
        future.set_result(compiled)

    def _store(self, key: _Key, compiled: CompiledGrammar) -> None:
        self._cache[key] = compiled
        self.stats.bytes += compiled.memory_bytes
        while len(self._cache) > self.config.cache_entries or (
            self.stats.bytes > self.config.cache_bytes and len(self._cache) > 1
        ):
            _, evicted = self._cache.popitem(last=False)
            self.stats.bytes -= evicted.memory_bytes
            self.stats.evictions += 1
        self.stats.entries = len(self._cache)

    def _compile_planned(self, key: _Key, *, deadline: float) -> CompiledGrammar:
        constraint = key.constraint
        check_constraint(constraint)  # once, before any backend: the same error for all
        candidates = plan(constraint, backend=key.backend, strict=key.strict)
        errors: list[InvalidGrammar] = []
        for i, candidate in enumerate(candidates):
            if i:
                with self._lock:
                    self.stats.fallbacks += 1
            result = self._compile_with(candidate, deadline=deadline)
            if not isinstance(result, InvalidGrammar):
                # The key and the result name the constraint as asked, not as rewritten.
                return dataclasses.replace(
                    result, constraint=constraint, ignored_keywords=candidate.ignored
                )
            errors.append(result)
            if isinstance(result.error, CompileTimeout):
                break
        if not errors:
            raise UnsupportedConstraint(
                "no backend enforces this schema exactly (strict mode)", kind=constraint.kind.value
            )
        raise _combine(constraint, errors)

    def _compile_with(self, candidate: Candidate, *, deadline: float) -> CompiledGrammar | InvalidGrammar:
        constraint = candidate.constraint
        backend = self._backend(candidate.backend, candidate.lenient)
        if backend.isolated and self._workers is not None and constraint.kind in backend.kinds:
            remaining = deadline - time.monotonic()
            try:
                status, payload, seconds = self._workers.compile(
                    candidate.backend, constraint, timeout_s=max(remaining, 0.05)
                )
            except (CompileTimeout, WorkerCrashed) as error:
                if not isinstance(error, CompileTimeout):
                    error = InvalidConstraint(str(error), backend=candidate.backend, kind=constraint.kind.value)
                return InvalidGrammar(constraint, candidate.backend, error)
            if status == "invalid":
                return InvalidGrammar(constraint, candidate.backend, payload)
            return backend.load(constraint, payload, seconds)
        return backend.compile(constraint, checked=True)

    def _backend(self, name: str, lenient: bool) -> GrammarBackend:
        with self._backends_lock:
            backend = self._backends.get((name, lenient))
            if backend is None:
                cls = backend_class(name)
                if lenient:
                    backend = cls(self.tokenizer, json_format=self.config.json_format, lenient=True)  # type: ignore[call-arg]
                else:
                    backend = cls(self.tokenizer, json_format=self.config.json_format)
                self._backends[(name, lenient)] = backend
        return backend


def _combine(constraint: Constraint, errors: list[InvalidGrammar]) -> InvalidConstraint:
    if len(errors) == 1:
        return errors[0].error
    timeout = next((e.error for e in errors if isinstance(e.error, CompileTimeout)), None)
    if timeout is not None:
        return timeout
    # The first error is the most specific (thinkstruct's own checks run before any
    # backend and fail every backend alike).
    first = errors[0].error
    if first.backend is None or all(e.error.reason == first.reason for e in errors):
        return first
    tried = "; ".join(f"{e.backend}: {e.error.reason}" for e in errors)
    return InvalidConstraint(
        f"no backend could compile it ({tried})",
        pointer=first.pointer,
        position=first.position,
        kind=constraint.kind.value,
    )


def _done(value: CompiledGrammar) -> concurrent.futures.Future[CompiledGrammar]:
    f: concurrent.futures.Future[CompiledGrammar] = concurrent.futures.Future()
    f.set_result(value)
    return f


def _failed(error: BaseException) -> concurrent.futures.Future[CompiledGrammar]:
    f: concurrent.futures.Future[CompiledGrammar] = concurrent.futures.Future()
    f.set_exception(error)
    return f
