"""What thinkstruct's grammar interface costs over calling each grammar library directly.

For each backend, the valid instances of a fixed, seeded subset of the JSONSchemaBench
sample (see ``maskbench_sample.py``) are serialized compactly, tokenized with the default
DeepSeek-V4 tokenizer (129,280 tokens) and walked token by token by two matchers in the
same process, interleaved:

- **raw**: the library's own matcher over the very artefact thinkstruct compiled, called
  the way an engine using the library directly would. Fill / accept:

  - xgrammar: ``GrammarMatcher.fill_next_token_bitmask(b, r)`` / ``accept_token(t)``
  - llguidance: ``llguidance.torch.fill_next_token_bitmask(m, b, r)`` / ``consume_token(t)``
  - outlines: the library's own torch helper
    ``outlines_core.kernels.torch.fill_next_token_bitmask(guide, b[r:r+1])`` (the row view
    cut outside the timing) / ``advance(t, False)``
  - outlines@pointer: the bare ``Guide.write_mask_into(ptr, words, 4)`` with ``ptr``
    worked out once per bitmask, outside the timing: the least any wrapper could cost
    (the strictest baseline, reported beside the other).

  Raw matchers are built as thinkstruct builds its own (xgrammar's unlimited rollback is
  its default; outlines gets the same ``max_rollback``), so only the interface differs.
- **ours**: ``thinkstruct.compile(...).matcher()``'s ``fill_bitmask(b, r)`` and
  ``accept_token(t)``.

At every position both fill their own row of one bitmask; one ``perf_counter_ns`` reading
ends the first call and starts the second, and the side that goes first alternates every
token, instance and walk, so cache warmth and machine noise fall on both equally. The fill
after the last token (where the stop token becomes allowed) is timed too. Each instance is
first walked once, untimed, by both sides: that warms lazily built state, skips instances
the backend rejects (counted) and catches raw/ours disagreements; then it is walked
``--walks`` times with fresh matchers. The two rows are compared after every timed fill.

Compiles run in a worker process per backend that the parent kills when a compile exceeds
``--compile-timeout`` (xgrammar and outlines take tens of seconds on some schemas); the
schema is skipped and a fresh worker started. Timing never crosses a process.

The first table pools every fill of a backend (ratio = ours / raw of each statistic). One
backend's fills span three orders of magnitude (a forced ``{`` against a free string), so
a fixed per-call cost can move a pooled median from one cluster to the next; the second
table pairs each call with its twin (median of ours - raw and of ours / raw).

Run::

    .venv/bin/python benchmarks/mask_overhead.py
    .venv/bin/python benchmarks/mask_overhead.py --backends outlines --max-schemas 100

The target is ours / raw <= 1.10 for every backend. Like every benchmark here it prints
tables and asserts nothing about time.
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import multiprocessing.connection
import sys
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

try:
    from maskbench_sample import DEFAULT_MASKBENCH_DIR, MaskbenchSchema, load_maskbench, sample_schemas
except ImportError:  # run from elsewhere than benchmarks/: the loader sits beside this file
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from maskbench_sample import DEFAULT_MASKBENCH_DIR, MaskbenchSchema, load_maskbench, sample_schemas

if TYPE_CHECKING:
    import torch

    from thinkstruct import CompiledGrammar, GrammarMatcher

BACKENDS = ("xgrammar", "llguidance", "outlines", "outlines@pointer")

#: Seconds a fresh worker may take to load the tokenizer and build a backend's vocabulary.
STARTUP_TIMEOUT_S = 180.0
#: Seconds the walk of one schema's instances may take once it compiled.
WALK_TIMEOUT_S = 600.0


# ---- results -------------------------------------------------------------------------


@dataclass
class SchemaWalk:
    """Per-token nanoseconds for one schema's instances, raw and ours, in walk order."""

    raw_fill: array[int] = field(default_factory=lambda: array("q"))
    ours_fill: array[int] = field(default_factory=lambda: array("q"))
    raw_accept: array[int] = field(default_factory=lambda: array("q"))
    ours_accept: array[int] = field(default_factory=lambda: array("q"))
    instances: int = 0
    #: Tokens of the instances walked (each instance counted once, however many walks).
    tokens: int = 0
    #: Instances thinkstruct rejects (a token refused, or no stop allowed at the end).
    rejected: int = 0
    #: Instances where the raw library and thinkstruct answered differently.
    disagreements: int = 0
    #: Timed fills after which the raw row and thinkstruct's row differed.
    mask_mismatches: int = 0


@dataclass
class BackendTotals:
    """Everything measured for one backend, pooled over its schemas."""

    backend: str
    walk: SchemaWalk = field(default_factory=SchemaWalk)
    schemas: int = 0
    compile_timeouts: int = 0
    compile_errors: int = 0
    #: Schemas whose worker died while compiling or walking them.
    crashes: int = 0
    compile_seconds: list[float] = field(default_factory=list)

    def add(self, walk: SchemaWalk, compile_seconds: float) -> None:
        self.compile_seconds.append(compile_seconds)
        if walk.instances:
            self.schemas += 1
        for name in ("raw_fill", "ours_fill", "raw_accept", "ours_accept"):
            getattr(self.walk, name).extend(getattr(walk, name))
        for name in ("instances", "tokens", "rejected", "disagreements", "mask_mismatches"):
            setattr(self.walk, name, getattr(self.walk, name) + getattr(walk, name))


# ---- the timed walk (worker side) ------------------------------------------------------


@dataclass(frozen=True)
class _Sides:
    """The raw calls for one instance, with their arguments bound up front; the timed loop
    calls both sides the same way, ``fill(*args)`` and ``accept(t, *extra)``."""

    raw_fill: Callable[..., Any]
    raw_fill_args: tuple[Any, ...]
    raw_accept: Callable[..., Any]
    raw_accept_extra: tuple[Any, ...]
    raw_accept_raises: bool  # outlines reports a refused token by raising ValueError
    ours: GrammarMatcher
    bitmask: torch.Tensor  # row 0: raw, row 1: ours


def _raw_sides(
    backend: str, compiled: CompiledGrammar, ours: GrammarMatcher, bitmask: torch.Tensor
) -> _Sides:
    """A fresh raw matcher over ``compiled``'s own artefact, next to ``ours``."""
    tok = compiled.tokenizer
    if backend == "xgrammar":
        import xgrammar

        m = xgrammar.GrammarMatcher(compiled.ctx)  # type: ignore[attr-defined]
        return _Sides(m.fill_next_token_bitmask, (bitmask, 0), m.accept_token, (), False, ours, bitmask)
    if backend == "llguidance":
        import llguidance
        import llguidance.torch

        from thinkstruct.grammar.backends.llguidance_backend import ll_tokenizer

        m = llguidance.LLMatcher(ll_tokenizer(tok), compiled.grammar, log_level=0)  # type: ignore[attr-defined]
        return _Sides(
            llguidance.torch.fill_next_token_bitmask,
            (m, bitmask, 0),
            m.consume_token,
            (),
            False,
            ours,
            bitmask,
        )
    if backend in ("outlines", "outlines@pointer"):
        import outlines_core
        import outlines_core.kernels.torch

        from thinkstruct.grammar.backends.outlines_backend import MAX_ROLLBACK_TOKENS

        g = outlines_core.Guide(compiled.index, max_rollback=MAX_ROLLBACK_TOKENS)  # type: ignore[attr-defined]
        if backend == "outlines":
            # The library's own torch helper, as xgrammar's and llguidance's rows use
            # theirs (the row view is cut outside the timing, in raw's favour).
            fill, args = outlines_core.kernels.torch.fill_next_token_bitmask, (g, bitmask[0:1])
        else:
            # The bare pointer call with the pointer worked out once: the least any
            # wrapper could cost.
            fill, args = g.write_mask_into, (bitmask.data_ptr(), bitmask.shape[1], 4)
        return _Sides(fill, args, g.advance, (False,), True, ours, bitmask)
    raise ValueError(f"unknown backend {backend!r}")


def _raw_accepts(sides: _Sides, token: int) -> bool:
    try:
        ok = sides.raw_accept(token, *sides.raw_accept_extra)
    except ValueError:
        return False
    return True if sides.raw_accept_raises else bool(ok)


def _rows_equal(bitmask: torch.Tensor) -> bool:
    import torch

    return bool(torch.equal(bitmask[0], bitmask[1]))


def _stop_allowed(bitmask: torch.Tensor, row: int, eos_ids: Sequence[int]) -> bool:
    from thinkstruct.grammar.runtime.bitmask import is_allowed

    return any(is_allowed(bitmask, row, e) for e in eos_ids)


def _check_walk(sides: _Sides, tokens: Sequence[int], eos_ids: Sequence[int]) -> str:
    """Walk once, untimed: ``"ok"``, ``"rejected"`` (by thinkstruct) or ``"disagree"``."""
    for token in tokens:
        sides.raw_fill(*sides.raw_fill_args)
        sides.ours.fill_bitmask(sides.bitmask, 1)
        ours_ok = sides.ours.accept_token(token)
        raw_ok = _raw_accepts(sides, token)
        if ours_ok != raw_ok:
            return "disagree"
        if not ours_ok:
            return "rejected"
    sides.raw_fill(*sides.raw_fill_args)
    sides.ours.fill_bitmask(sides.bitmask, 1)
    ours_stop = _stop_allowed(sides.bitmask, 1, eos_ids)
    if ours_stop != _stop_allowed(sides.bitmask, 0, eos_ids):
        return "disagree"
    return "ok" if ours_stop else "rejected"


def _timed_walk(sides: _Sides, tokens: Sequence[int], raw_first: bool, out: SchemaWalk) -> bool:
    """Walk ``tokens`` with both sides, appending per-call nanoseconds to ``out``.

    Returns False if a side refused a token the check walk accepted (nothing is kept then).
    """
    clock = time.perf_counter_ns
    raw_fill, raw_args = sides.raw_fill, sides.raw_fill_args
    raw_accept, raw_extra = sides.raw_accept, sides.raw_accept_extra
    ours_fill, ours_args = sides.ours.fill_bitmask, (sides.bitmask, 1)
    ours_accept, ours_extra = sides.ours.accept_token, ()
    bitmask = sides.bitmask
    fills_raw, fills_ours = array("q"), array("q")
    accepts_raw, accepts_ours = array("q"), array("q")
    mismatches = 0
    last = len(tokens)
    for i in range(last + 1):
        if raw_first:
            t0 = clock()
            raw_fill(*raw_args)
            t1 = clock()
            ours_fill(*ours_args)
            t2 = clock()
            fills_raw.append(t1 - t0)
            fills_ours.append(t2 - t1)
        else:
            t0 = clock()
            ours_fill(*ours_args)
            t1 = clock()
            raw_fill(*raw_args)
            t2 = clock()
            fills_ours.append(t1 - t0)
            fills_raw.append(t2 - t1)
        if not _rows_equal(bitmask):
            mismatches += 1
        if i == last:
            break
        token = tokens[i]
        try:
            if raw_first:
                t0 = clock()
                raw_ok = raw_accept(token, *raw_extra)
                t1 = clock()
                ours_ok = ours_accept(token, *ours_extra)
                t2 = clock()
                accepts_raw.append(t1 - t0)
                accepts_ours.append(t2 - t1)
            else:
                t0 = clock()
                ours_ok = ours_accept(token, *ours_extra)
                t1 = clock()
                raw_ok = raw_accept(token, *raw_extra)
                t2 = clock()
                accepts_ours.append(t1 - t0)
                accepts_raw.append(t2 - t1)
        except ValueError:  # outlines' raw advance refusing a token
            return False
        if not ours_ok or not (sides.raw_accept_raises or raw_ok):
            return False
        raw_first = not raw_first
    out.raw_fill.extend(fills_raw)
    out.ours_fill.extend(fills_ours)
    out.raw_accept.extend(accepts_raw)
    out.ours_accept.extend(accepts_ours)
    out.mask_mismatches += mismatches
    return True


def walk_schema(
    backend: str, compiled: CompiledGrammar, instances: Sequence[str], *, walks: int, first_instance: int
) -> SchemaWalk:
    """Time every instance of one compiled schema, raw against ours, ``walks`` times each
    (fresh matchers every walk, the side that goes first alternating between walks)."""
    from thinkstruct.grammar.runtime.bitmask import allocate_bitmask

    tok = compiled.tokenizer
    eos_ids = tok.eos_token_ids
    out = SchemaWalk()
    bitmask = allocate_bitmask(2, tok.vocab_size)
    for n, text in enumerate(instances):
        tokens = tok.encode(text)
        verdict = _check_walk(_raw_sides(backend, compiled, compiled.matcher(), bitmask), tokens, eos_ids)
        if verdict == "rejected":
            out.rejected += 1
            continue
        if verdict == "disagree":
            out.disagreements += 1
            continue
        timed = True
        for k in range(walks):
            sides = _raw_sides(backend, compiled, compiled.matcher(), bitmask)
            gc.collect()
            gc.disable()
            try:
                timed = _timed_walk(sides, tokens, (first_instance + n + k) % 2 == 0, out)
            finally:
                gc.enable()
            if not timed:
                break
        if timed:
            out.instances += 1
            out.tokens += len(tokens)
        else:
            out.disagreements += 1
    return out


# ---- worker process -------------------------------------------------------------------


def _worker_main(conn: multiprocessing.connection.Connection, backend: str) -> None:
    """Serve ``("walk", schema, instances, walks, first_instance)`` requests for one backend."""
    import thinkstruct
    from thinkstruct.grammar.api import get_backend
    from thinkstruct.grammar.base import InvalidGrammar

    tok = thinkstruct.Tokenizer.default()
    library = backend.split("@")[0]  # "outlines@pointer" compiles with outlines
    get_backend(tok, library)  # build the backend's vocabulary before any compile is timed
    tok.encode("{}")
    conn.send(("ready",))
    while True:
        request = conn.recv()
        if request[0] == "stop":
            return
        _, schema, instances, walks, first_instance = request
        start = time.perf_counter()
        try:
            # The backend itself, in this killable process (thinkstruct.compile would hand
            # the compile to the shared compiler's own worker processes).
            result = get_backend(tok, library).compile(thinkstruct.Constraint.json_schema(schema))
            if isinstance(result, InvalidGrammar):
                raise result.error
            compiled = result
        except thinkstruct.InvalidConstraint as e:
            conn.send(("invalid", str(e).splitlines()[0][:200]))
            continue
        except Exception as e:
            conn.send(("invalid", f"{type(e).__name__}: {e}".splitlines()[0][:200]))
            continue
        conn.send(("compiled", time.perf_counter() - start))
        conn.send(
            ("walked", walk_schema(backend, compiled, instances, walks=walks, first_instance=first_instance))
        )
        del compiled


class BackendWorker:
    """A worker process for one backend, replaced whenever a compile runs too long."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self._ctx = multiprocessing.get_context("spawn")  # no fork: the libraries hold threads
        self._proc: multiprocessing.process.BaseProcess | None = None
        self._conn: multiprocessing.connection.Connection | None = None

    def _start(self) -> multiprocessing.connection.Connection:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_worker_main, args=(child, self.backend), daemon=True)
        proc.start()
        child.close()
        try:
            ready = parent.poll(STARTUP_TIMEOUT_S) and parent.recv()
        except EOFError:  # it died while loading
            ready = None
        if not ready:
            proc.kill()
            proc.join()
            raise RuntimeError(
                f"the {self.backend} worker did not start within {STARTUP_TIMEOUT_S:.0f} s "
                f"(exit status {proc.exitcode})"
            )
        self._proc, self._conn = proc, parent
        return parent

    def run(
        self, schema: MaskbenchSchema, *, compile_timeout: float, walks: int, first_instance: int
    ) -> tuple[str, Any]:
        """``("timeout", None)``, ``("invalid", message)``, ``("crashed", exit status)`` or
        ``("walked", (walk, seconds))``."""
        conn = self._conn or self._start()
        try:
            conn.send(("walk", schema.schema, schema.instances, walks, first_instance))
            if not conn.poll(compile_timeout):
                self.close(kill=True)
                return "timeout", None
            kind, value = conn.recv()
            if kind == "invalid":
                return "invalid", value
            if not conn.poll(WALK_TIMEOUT_S):
                self.close(kill=True)
                raise RuntimeError(f"{self.backend}: walking {schema.name} took over {WALK_TIMEOUT_S:.0f} s")
            _, walk = conn.recv()
        except (EOFError, OSError):  # the worker died (a native crash, or killed from outside)
            assert self._proc is not None
            self._proc.join(10)
            status = self._proc.exitcode
            self.close(kill=True)
            return "crashed", status
        return "walked", (walk, value)

    def close(self, *, kill: bool = False) -> None:
        if self._proc is None or self._conn is None:
            return
        if kill:
            self._proc.kill()
        else:
            try:
                self._conn.send(("stop",))
            except OSError:
                self._proc.kill()
        self._proc.join(10)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._conn.close()
        self._proc = self._conn = None


# ---- driver and report ------------------------------------------------------------------


def measure_backend(
    backend: str,
    schemas: Sequence[MaskbenchSchema],
    *,
    compile_timeout: float,
    max_instances: int | None,
    walks: int,
    progress: bool,
) -> BackendTotals:
    """Compile and walk every schema of ``schemas`` with one backend."""
    totals = BackendTotals(backend)
    worker = BackendWorker(backend)
    started = time.perf_counter()
    first_instance = 0
    try:
        for n, schema in enumerate(schemas, 1):
            if max_instances is not None:
                schema = MaskbenchSchema(schema.name, schema.schema, schema.instances[:max_instances])
            kind, value = worker.run(
                schema, compile_timeout=compile_timeout, walks=walks, first_instance=first_instance
            )
            first_instance += len(schema.instances)
            if kind == "timeout":
                totals.compile_timeouts += 1
                note = f"compile > {compile_timeout:g} s, skipped"
            elif kind == "crashed":
                totals.crashes += 1
                note = f"worker died (exit status {value}), skipped"
            elif kind == "invalid":
                totals.compile_errors += 1
                note = f"refused: {value}"
            else:
                walk, seconds = value
                totals.add(walk, seconds)
                note = (
                    f"compiled {seconds:.2f} s, {walk.instances}/{len(schema.instances)} instances, "
                    f"{walk.tokens} tokens"
                )
            if progress:
                elapsed = time.perf_counter() - started
                print(
                    f"[{backend} {n}/{len(schemas)} {elapsed:4.0f}s] {schema.name}: {note}",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        worker.close()
    return totals


def _stats(values: array[int]) -> tuple[float, float, float]:
    """(p50, p99, mean) in microseconds."""
    import numpy as np

    if not values:
        return float("nan"), float("nan"), float("nan")
    a = np.frombuffer(values, dtype=np.int64) / 1000.0
    return float(np.percentile(a, 50)), float(np.percentile(a, 99)), float(a.mean())


def _paired(ours: array[int], raw: array[int]) -> tuple[float, float]:
    """Median per-call difference (ours - raw) in nanoseconds and median per-call ratio.

    Fills of one backend span three orders of magnitude (a forced ``{`` against a state
    inside a free string), so a fixed cost can move the pooled median from one cluster to
    another; these paired figures compare each call with its own twin instead.
    """
    import numpy as np

    if not ours:
        return float("nan"), float("nan")
    o = np.frombuffer(ours, dtype=np.int64).astype(np.float64)
    r = np.frombuffer(raw, dtype=np.int64).astype(np.float64)
    return float(np.median(o - r)), float(np.median(o / np.maximum(r, 1.0)))


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    line = lambda cells: "| " + " | ".join(c.rjust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    rule = "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|"
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


def format_report(results: Sequence[BackendTotals]) -> str:
    """The fill table, the accept/overhead table and the skip counts."""
    fill_rows, accept_rows, notes = [], [], []
    for t in results:
        w = t.walk
        r50, r99, rmean = _stats(w.raw_fill)
        o50, o99, omean = _stats(w.ours_fill)
        fill_rows.append(
            [
                t.backend,
                str(t.schemas),
                str(w.instances),
                str(w.tokens),
                str(len(w.raw_fill)),
                f"{r50:.2f}",
                f"{o50:.2f}",
                f"{o50 / r50:.3f}",
                f"{r99:.2f}",
                f"{o99:.2f}",
                f"{o99 / r99:.3f}",
                f"{rmean:.2f}",
                f"{omean:.2f}",
                f"{omean / rmean:.3f}",
            ]
        )
        a50, _, amean = _stats(w.raw_accept)
        b50, _, bmean = _stats(w.ours_accept)
        fill_delta, fill_ratio = _paired(w.ours_fill, w.raw_fill)
        accept_delta, _ = _paired(w.ours_accept, w.raw_accept)
        accept_rows.append(
            [
                t.backend,
                f"{fill_delta:+.0f}",
                f"{fill_ratio:.3f}",
                f"{a50:.2f}",
                f"{b50:.2f}",
                f"{b50 / a50:.3f}",
                f"{amean:.2f}",
                f"{bmean:.2f}",
                f"{bmean / amean:.3f}",
                f"{accept_delta:+.0f}",
            ]
        )
        compile_p50 = (
            sorted(t.compile_seconds)[len(t.compile_seconds) // 2] if t.compile_seconds else float("nan")
        )
        notes.append(
            f"{t.backend}: compile p50 {compile_p50:.2f} s; skipped {t.compile_timeouts} schemas "
            f"(compile timeout), {t.compile_errors} (refused by the backend), {t.crashes} (worker died); "
            f"{w.rejected} instances rejected; {w.disagreements} raw/ours disagreements; "
            f"{w.mask_mismatches} fills with differing masks"
        )
    fill = _table(
        [
            "backend",
            "schemas",
            "instances",
            "tokens",
            "fills",
            "raw p50 µs",
            "ours p50 µs",
            "ratio p50",
            "raw p99",
            "ours p99",
            "ratio p99",
            "raw mean",
            "ours mean",
            "ratio mean",
        ],
        fill_rows,
    )
    accept = _table(
        [
            "backend",
            "fill Δ p50 ns",
            "fill ratio paired p50",
            "raw accept p50 µs",
            "ours accept p50 µs",
            "ratio p50",
            "raw accept mean",
            "ours accept mean",
            "ratio mean",
            "accept Δ p50 ns",
        ],
        accept_rows,
    )
    return (
        "Mask fill per token (fills: timed samples, (tokens + 1) per instance and walk; "
        "target ratio <= 1.10):\n"
        f"{fill}\n\nPaired per call (median of ours - raw, of ours / raw) and accept_token:\n{accept}\n\n"
        + "\n".join(notes)
    )


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--backends", default=",".join(BACKENDS), help="comma-separated, from: " + ", ".join(BACKENDS)
    )
    p.add_argument("--max-schemas", type=int, default=20, help="schemas sampled (0: all); default 20")
    p.add_argument(
        "--max-instances", type=int, default=4, help="valid instances per schema (0: all); default 4"
    )
    p.add_argument(
        "--compile-timeout",
        type=float,
        default=5.0,
        help="skip a schema whose compile takes longer (seconds); default 5",
    )
    p.add_argument("--walks", type=int, default=3, help="timed walks of each instance; default 3")
    p.add_argument("--seed", type=int, default=0, help="seed of the schema subset and its order")
    p.add_argument("--maskbench-dir", default=str(DEFAULT_MASKBENCH_DIR), help="the sample's folder")
    p.add_argument("--quiet", action="store_true", help="no per-schema progress on stderr")
    args = p.parse_args(argv)
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = [b for b in args.backends if b not in BACKENDS]
    if unknown:
        p.error(f"unknown backends {unknown}; choose from {', '.join(BACKENDS)}")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = _parse_args(argv)
    schemas = sample_schemas(
        load_maskbench(args.maskbench_dir), count=args.max_schemas or None, seed=args.seed
    )
    started = time.perf_counter()
    results = [
        measure_backend(
            backend,
            schemas,
            compile_timeout=args.compile_timeout,
            max_instances=args.max_instances or None,
            walks=max(1, args.walks),
            progress=not args.quiet,
        )
        for backend in args.backends
    ]
    print(
        f"{len(schemas)} schemas (seed {args.seed}) from {args.maskbench_dir}, DeepSeek-V4 tokenizer, "
        f"compile timeout {args.compile_timeout:g} s, {time.perf_counter() - started:.0f} s in all\n"
    )
    print(format_report(results))


if __name__ == "__main__":
    main()
