"""Run the official JSON Schema Test Suite through thinkstruct's grammar backends.

Used by ``tests/grammar/test_conformance.py`` and as a command line tool::

    python -m tests.grammar.conformance_support --report            # table from the committed file
    python -m tests.grammar.conformance_support --report --run      # run the suite, then the table
    python -m tests.grammar.conformance_support --update            # run, rewrite the expectations
    python -m tests.grammar.conformance_support --run --times out.json  # per-schema compile times

For each schema of each top-level test file (``draft2020-12/*.json`` and ``draft7/*.json``,
not ``optional/``), a backend compiles the schema once; each instance of the schema, written
in the compact form ``json.dumps(data, separators=(",", ":"), ensure_ascii=False)``, counts
as accepted when :func:`thinkstruct.grammar.api.first_rejected` returns ``None`` (what
:func:`thinkstruct.accepts` does).

Compiles run in worker processes (a JSON-lines protocol over pipes) under a per-schema
time limit: a compile still running at the limit counts as a compile failure with reason
``timeout``, and its worker is killed and replaced, so a hung Rust/C++ compile cannot hang
the test run. Workers are reused (loading the 129k tokenizer takes seconds) and load each
backend lazily.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

HERE = Path(__file__).resolve().parent
EXPECTATIONS_PATH = HERE / "conformance_expectations.json"

#: Where the suite lives; ``THINKSTRUCT_JSON_SCHEMA_SUITE`` overrides it (its ``tests`` dir).
DEFAULT_SUITE_DIR = Path(__file__).resolve().parent.parent / "data" / "JSON-Schema-Test-Suite" / "tests"
DRAFTS = ("draft2020-12", "draft7")
BACKENDS = ("xgrammar", "llguidance", "outlines")

#: Setting this to 1 makes the conformance test rewrite the expectations file.
UPDATE_ENV = "THINKSTRUCT_UPDATE_EXPECTATIONS"

#: The tokenizer each backend is measured with (see the test module's docstring).
TOKENIZER_FOR_BACKEND = {
    "xgrammar": "deepseek-v4",
    "llguidance": "deepseek-v4",
    "outlines": "deepseek-v4",
}

#: Seconds a single schema's compile may take (wall clock, in a worker that shares the
#: machine with one other worker). Chosen with a margin on both sides of the measured
#: compile times (see docs/keyword_support.md), so no schema sits near the limit. For
#: outlines-core the compiles that finish take at most about 7 s and the next ones about
#: 25 s (``{"allOf": [{}]}``: 20-31 s depending on load, so a 20 s limit flapped).
COMPILE_TIMEOUT_S = {
    "xgrammar": 10.0,
    "llguidance": 10.0,
    "outlines": 12.0,
}

#: Seconds all instances of one compiled schema may take to match (they take milliseconds;
#: this only keeps a hung matcher from hanging the run).
MATCH_TIMEOUT_S = 120.0

#: Seconds a fresh worker may take to load a tokenizer and a backend's vocabulary.
STARTUP_TIMEOUT_S = 300.0

#: Outcome codes of a schema that did not compile.
REFUSED = "!refused"  # the backend (or thinkstruct's checks) raised InvalidConstraint
TIMEOUT = "!timeout"  # the compile ran past COMPILE_TIMEOUT_S
CRASH = "!crash"  # the worker process died while compiling or matching
ERROR = "!error"  # compile raised something other than InvalidConstraint (a bug)
MATCH_TIMEOUT = "!match-timeout"
FAILURES = (REFUSED, TIMEOUT, CRASH, ERROR, MATCH_TIMEOUT)
ACCEPTED, REJECTED, MATCH_ERROR = "+", "-", "E"


# ---- the suite ------------------------------------------------------------------------


@dataclass(frozen=True)
class Instance:
    description: str
    text: str
    valid: bool


@dataclass(frozen=True)
class SchemaCase:
    draft: str
    file: str
    index: int
    description: str
    schema: Any
    instances: tuple[Instance, ...]

    @property
    def id(self) -> str:
        """``"const.json#3"``: the 4th schema of const.json (unique within a draft)."""
        return f"{self.file}#{self.index}"

    @property
    def keyword(self) -> str:
        return self.file.removesuffix(".json")


def suite_dir() -> Path:
    return Path(os.environ.get("THINKSTRUCT_JSON_SCHEMA_SUITE") or DEFAULT_SUITE_DIR)


def serialize(data: Any) -> str:
    """An instance as the backend-neutral compact JSON text every backend is fed."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def load_draft(draft: str, root: Path | None = None) -> list[SchemaCase]:
    """Every schema of the draft's top-level test files, in file then suite order."""
    directory = (root or suite_dir()) / draft
    cases = []
    for path in sorted(directory.glob("*.json")):
        with open(path, encoding="utf-8") as f:
            groups = json.load(f)
        for index, group in enumerate(groups):
            instances = tuple(
                Instance(t["description"], serialize(t["data"]), bool(t["valid"]))
                for t in group["tests"]
            )
            cases.append(
                SchemaCase(draft, path.name, index, group["description"], group["schema"], instances)
            )
    return cases


# ---- the worker process ---------------------------------------------------------------


def _worker_main() -> None:
    """Serve compile+match requests, one JSON line each, on the original stdout."""
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)  # anything a library prints goes to stderr, not into the protocol
    sys.stdout = sys.stderr

    import thinkstruct
    from thinkstruct.grammar.api import first_rejected

    tokenizers: dict[str, Any] = {}

    def tokenizer(name: str) -> Any:
        if name not in tokenizers:
            tokenizers[name] = load_tokenizer(name)
        return tokenizers[name]

    def send(message: dict[str, Any]) -> None:
        protocol.write(json.dumps(message) + "\n")
        protocol.flush()

    for line in sys.stdin:
        request = json.loads(line)
        if request.get("prepare"):
            from thinkstruct.grammar.api import get_backend

            get_backend(tokenizer(request["tokenizer"]), request["backend"])
            send({"phase": "ready"})
            continue
        tok = tokenizer(request["tokenizer"])
        start = time.perf_counter()
        try:
            constraint = thinkstruct.Constraint.json_schema(request["schema"])
            compiled = thinkstruct.compile(constraint, tok, request["backend"])
        except thinkstruct.InvalidConstraint as e:
            send({"phase": "failed", "outcome": REFUSED, "reason": str(e)})
            continue
        except Exception as e:  # noqa: BLE001 - reported as a finding, not hidden
            send({"phase": "failed", "outcome": ERROR, "reason": f"{type(e).__name__}: {e}"})
            continue
        send({"phase": "compiled", "seconds": time.perf_counter() - start})
        marks = []
        errors = []
        for text in request["instances"]:
            try:
                marks.append(ACCEPTED if first_rejected(compiled, text) is None else REJECTED)
            except Exception as e:  # noqa: BLE001
                marks.append(MATCH_ERROR)
                errors.append(f"{text!r}: {type(e).__name__}: {e}")
        send({"phase": "matched", "marks": "".join(marks), "errors": errors})


def load_tokenizer(name: str) -> Any:
    from thinkstruct import Tokenizer
    from thinkstruct.tokenizer import smollm2_gguf_path

    if name == "deepseek-v4":
        return Tokenizer.default()
    if name == "smollm2":
        return Tokenizer.from_pretrained(smollm2_gguf_path())
    raise ValueError(f"unknown tokenizer {name!r}")


class WorkerDied(Exception):
    pass


class Worker:
    """One worker process; every wait on it has a deadline."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
             "import conformance_support as c; c._worker_main()", str(HERE)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            bufsize=0,
        )
        self._buffer = b""
        self.prepared: set[tuple[str, str]] = set()

    def send(self, message: dict[str, Any]) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise WorkerDied(str(e)) from None

    def receive(self, timeout: float) -> dict[str, Any] | None:
        """The next message, or ``None`` if none came within ``timeout`` seconds."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([self.proc.stdout], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not chunk:
                raise WorkerDied(f"exit status {self.proc.wait()}")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def prepare(self, backend: str, tokenizer: str) -> None:
        """Load the tokenizer and build the backend's vocabulary (outside any time limit)."""
        if (backend, tokenizer) in self.prepared:
            return
        self.send({"prepare": True, "backend": backend, "tokenizer": tokenizer})
        if self.receive(STARTUP_TIMEOUT_S) is None:
            raise WorkerDied(f"no {backend} backend after {STARTUP_TIMEOUT_S} s")
        self.prepared.add((backend, tokenizer))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


@dataclass
class SchemaResult:
    """What one backend did with one schema."""

    case: SchemaCase
    backend: str
    #: A failure code (``"!refused"``...) or one ``+``/``-`` per instance (accepted/rejected).
    outcome: str
    compile_seconds: float | None = None
    reason: str = ""
    match_errors: list[str] = field(default_factory=list)
    #: The worker process that ran it (0 when nothing ran).
    worker_pid: int = 0

    @property
    def compiled(self) -> bool:
        return not self.outcome.startswith("!")


class WorkerPool:
    """``size`` reusable workers; a worker that times out or dies is replaced."""

    def __init__(self, size: int = 2) -> None:
        self.size = size
        self._idle: list[Worker] = []
        self._started: list[Worker] = []
        self._lock = threading.Lock()

    def _take(self) -> Worker:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return self._new()

    def _new(self) -> Worker:
        worker = Worker()
        with self._lock:
            self._started.append(worker)
        return worker

    def _give(self, worker: Worker) -> None:
        with self._lock:
            self._idle.append(worker)

    def run(
        self,
        tasks: Iterable[tuple[str, SchemaCase]],
        *,
        timeouts: dict[str, float] | None = None,
        tokenizers: dict[str, str] | None = None,
        progress: bool = False,
    ) -> list[SchemaResult]:
        """Compile and match every (backend, case); results in task order."""
        timeouts = timeouts or COMPILE_TIMEOUT_S
        tokenizers = tokenizers or TOKENIZER_FOR_BACKEND
        todo = list(enumerate(tasks))
        results: list[SchemaResult | None] = [None] * len(todo)
        queue_lock = threading.Lock()
        failures: list[BaseException] = []

        def drive() -> None:
            worker = self._take()
            try:
                while True:
                    with queue_lock:
                        if not todo or failures:
                            break
                        i, (backend, case) = todo.pop(0)
                    results[i], worker = self._one(
                        worker, backend, case, timeouts[backend], tokenizers[backend]
                    )
                    if progress:
                        r = results[i]
                        print(f"{backend:10} {case.draft}/{case.id:40} {r.outcome[:30]:30} "
                              f"{r.compile_seconds or 0:7.2f}s", file=sys.stderr, flush=True)
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller
                failures.append(e)
            finally:
                self._give(worker)

        threads = [threading.Thread(target=drive) for _ in range(min(self.size, len(todo)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if failures:
            raise failures[0]
        return [r for r in results if r is not None]

    def _one(
        self, worker: Worker, backend: str, case: SchemaCase, limit: float, tokenizer: str
    ) -> tuple[SchemaResult, Worker]:
        worker.prepare(backend, tokenizer)
        pid = worker.proc.pid
        request = {
            "backend": backend,
            "tokenizer": tokenizer,
            "schema": case.schema,
            "instances": [inst.text for inst in case.instances],
        }
        try:
            worker.send(request)
            first = worker.receive(limit)
            if first is None:
                worker.kill()
                reason = f"compile ran past {limit} s"
                return SchemaResult(case, backend, TIMEOUT, reason=reason, worker_pid=pid), self._new()
            if first["phase"] == "failed":
                return SchemaResult(case, backend, first["outcome"], reason=first["reason"], worker_pid=pid), worker
            seconds = first["seconds"]
            second = worker.receive(MATCH_TIMEOUT_S)
            if second is None:
                worker.kill()
                reason = f"matching ran past {MATCH_TIMEOUT_S} s"
                return SchemaResult(case, backend, MATCH_TIMEOUT, seconds, reason, worker_pid=pid), self._new()
            result = SchemaResult(
                case, backend, second["marks"], seconds, match_errors=second["errors"], worker_pid=pid
            )
            return result, worker
        except WorkerDied as e:
            worker.kill()
            return SchemaResult(case, backend, CRASH, reason=f"worker died: {e}", worker_pid=pid), self._new()

    def close(self) -> None:
        """Kill every worker this pool started (also those still busy, e.g. after an
        interrupted run)."""
        with self._lock:
            workers, self._started, self._idle = self._started, [], []
        for w in workers:
            w.kill()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- summaries and the expectations file ----------------------------------------------


def counts(outcomes: dict[str, str], cases: list[SchemaCase]) -> dict[str, int]:
    """The summary numbers of one backend on one draft, from per-schema outcomes."""
    c = dict.fromkeys(
        ("schemas", "compiled", "compile_failures", "timeouts", "valid_total", "valid_accepted",
         "invalid_total", "invalid_rejected", "silent_violations"),
        0,
    )
    for case in cases:
        outcome = outcomes.get(case.id, "")
        c["schemas"] += 1
        c["valid_total"] += sum(i.valid for i in case.instances)
        c["invalid_total"] += sum(not i.valid for i in case.instances)
        if outcome.startswith("!") or len(outcome) != len(case.instances):
            c["compile_failures"] += 1
            c["timeouts"] += outcome == TIMEOUT
            continue
        c["compiled"] += 1
        for inst, mark in zip(case.instances, outcome):
            if inst.valid:
                c["valid_accepted"] += mark == ACCEPTED
            elif mark == ACCEPTED:
                c["silent_violations"] += 1
            else:
                c["invalid_rejected"] += 1
    return c


#: A schema whose recorded compile took more than this share of its time limit is "slow":
#: a plain test run carries its recorded outcome instead of compiling it again, so no
#: compile near the limit can flap between "compiled" and "timeout" (an update run
#: measures it again).
SLOW_SHARE = 0.25


def section(results: list[SchemaResult], cases: list[SchemaCase]) -> dict[str, Any]:
    """The expectations-file entry of one backend on one draft."""
    outcomes = {r.case.id: r.outcome for r in results}
    slow = sorted(
        r.case.id
        for r in results
        if r.compiled
        and r.compile_seconds is not None
        and r.compile_seconds > SLOW_SHARE * COMPILE_TIMEOUT_S[r.backend]
    )
    return {"counts": counts(outcomes, cases), "slow": slow, "outcomes": outcomes}


def read_expectations(path: Path = EXPECTATIONS_PATH) -> dict[str, Any]:
    if not path.exists():
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_expectations(doc: dict[str, Any], path: Path = EXPECTATIONS_PATH) -> None:
    # One schema per line keeps diffs readable while the file stays compact.
    lines = ["{"]
    lines.append(f'  "about": {json.dumps(doc["about"])},')
    lines.append(f'  "compile_timeout_s": {json.dumps(doc["compile_timeout_s"])},')
    lines.append(f'  "tokenizers": {json.dumps(doc["tokenizers"])},')
    lines.append('  "results": {')
    backends = list(doc["results"])
    for bi, backend in enumerate(backends):
        lines.append(f'    {json.dumps(backend)}: {{')
        drafts = list(doc["results"][backend])
        for di, draft in enumerate(drafts):
            sec = doc["results"][backend][draft]
            lines.append(f'      {json.dumps(draft)}: {{')
            lines.append(f'        "counts": {json.dumps(sec["counts"])},')
            lines.append(f'        "slow": {json.dumps(sec.get("slow", []))},')
            lines.append('        "outcomes": {')
            items = list(sec["outcomes"].items())
            for oi, (k, v) in enumerate(items):
                comma = "," if oi < len(items) - 1 else ""
                lines.append(f"          {json.dumps(k)}: {json.dumps(v)}{comma}")
            lines.append("        }")
            lines.append("      }" + ("," if di < len(drafts) - 1 else ""))
        lines.append("    }" + ("," if bi < len(backends) - 1 else ""))
    lines.append("  }")
    lines.append("}")
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.replace(tmp, path)


ABOUT = (
    "JSON Schema Test Suite conformance per backend and draft, written by "
    "tests/grammar/conformance_support.py (set THINKSTRUCT_UPDATE_EXPECTATIONS=1 when "
    "running tests/grammar/test_conformance.py to rewrite). outcomes: schema id "
    "'file#index' -> one char per test in suite order ('+' accepted, '-' rejected) or a "
    "compile failure ('!refused', '!timeout', '!crash', '!error', '!match-timeout'). slow: "
    "schemas whose compile took over a quarter of the time limit (not re-run by a plain test run)."
)


def updated_expectations(
    doc: dict[str, Any], backend: str, draft: str, results: list[SchemaResult], cases: list[SchemaCase]
) -> dict[str, Any]:
    """``doc`` with one backend/draft section replaced (other sections kept as they are)."""
    new = {
        "about": ABOUT,
        "compile_timeout_s": {**doc.get("compile_timeout_s", {}), backend: COMPILE_TIMEOUT_S[backend]},
        "tokenizers": {**doc.get("tokenizers", {}), backend: TOKENIZER_FOR_BACKEND[backend]},
        "results": {b: dict(d) for b, d in doc.get("results", {}).items()},
    }
    new["results"].setdefault(backend, {})[draft] = section(results, cases)
    # Stable order: backends and drafts as listed here.
    new["results"] = {
        b: {d: new["results"][b][d] for d in DRAFTS if d in new["results"][b]}
        for b in BACKENDS
        if b in new["results"]
    }
    new["compile_timeout_s"] = {b: new["compile_timeout_s"][b] for b in BACKENDS if b in new["compile_timeout_s"]}
    new["tokenizers"] = {b: new["tokenizers"][b] for b in BACKENDS if b in new["tokenizers"]}
    return new


# ---- comparison -----------------------------------------------------------------------


@dataclass
class Comparison:
    regressions: list[str] = field(default_factory=list)
    improvements: list[str] = field(default_factory=list)
    #: Differences that are neither better nor worse (a refusal turned timeout, a valid
    #: instance's and an invalid instance's marks both flipped...).
    changes: list[str] = field(default_factory=list)


def compare(
    expected: dict[str, str], actual: dict[str, str], cases: list[SchemaCase], draft: str
) -> Comparison:
    """Schema by schema and instance by instance, what got worse and what got better."""
    cmp = Comparison()
    for case in cases:
        where = f"{draft}/{case.id} ({case.description!r})"
        old, new = expected.get(case.id), actual.get(case.id)
        if old is None:
            cmp.changes.append(f"{where}: not in the expectations file (suite changed?)")
            continue
        if new is None:
            cmp.changes.append(f"{where}: not run")
            continue
        old_ok, new_ok = not old.startswith("!"), not new.startswith("!")
        if old_ok and not new_ok:
            cmp.regressions.append(f"{where}: compiled before, now {new[1:]}")
            continue
        if new_ok and not old_ok:
            cmp.improvements.append(f"{where}: now compiles (was {old[1:]})")
            continue
        if not old_ok:
            if old != new:
                cmp.changes.append(f"{where}: compile failure {old[1:]} is now {new[1:]}")
            continue
        if len(old) != len(new):
            cmp.changes.append(f"{where}: {len(old)} tests expected, {len(new)} run (suite changed?)")
            continue
        for n, (inst, was, now) in enumerate(zip(case.instances, old, new)):
            if was == now:
                continue
            label = f"{where} test #{n} ({inst.description!r}, {'valid' if inst.valid else 'invalid'}: {inst.text[:80]})"
            if inst.valid:
                (cmp.improvements if now == ACCEPTED else cmp.regressions).append(
                    f"{label}: {'now accepted' if now == ACCEPTED else 'now rejected'}"
                )
            else:
                (cmp.improvements if now == REJECTED else cmp.regressions).append(
                    f"{label}: {'now rejected' if now == REJECTED else 'now accepted (silent violation)'}"
                )
    for extra in sorted(set(expected) - {c.id for c in cases}):
        cmp.changes.append(f"{draft}/{extra}: in the expectations file but not in the suite")
    return cmp


# ---- the keyword report ---------------------------------------------------------------


def keyword_table(doc: dict[str, Any], drafts: Iterable[str] = DRAFTS) -> str:
    """A Markdown table: per keyword (test file) and backend, schemas compiled/total, and
    silent violations (invalid instances accepted) / invalid instances of compiled schemas."""
    per: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0, 0, 0, 0]))
    for draft in drafts:
        cases = load_draft(draft)
        for backend in BACKENDS:
            outcomes = doc.get("results", {}).get(backend, {}).get(draft, {}).get("outcomes", {})
            for case in cases:
                row = per[case.keyword][backend]
                outcome = outcomes.get(case.id, "!missing")
                row[1] += 1
                if outcome.startswith("!"):
                    continue
                row[0] += 1
                for inst, mark in zip(case.instances, outcome):
                    if inst.valid:
                        row[4] += mark != ACCEPTED
                    else:
                        row[3] += 1
                        row[2] += mark == ACCEPTED
    header = "| keyword (test file) | " + " | ".join(
        f"{b} compiled | {b} silent violations" for b in BACKENDS
    ) + " |"
    rule = "|---|" + "---:|---:|" * len(BACKENDS)
    lines = [header, rule]
    totals = {b: [0, 0, 0, 0, 0] for b in BACKENDS}
    for keyword in sorted(per, key=str.lower):
        cells = []
        for b in BACKENDS:
            compiled, total, silent, invalid, _ = per[keyword][b]
            for k, v in enumerate(per[keyword][b]):
                totals[b][k] += v
            cells.append(f"{compiled}/{total}")
            cells.append(f"**{silent}**/{invalid}" if silent else f"0/{invalid}")
        lines.append(f"| {keyword} | " + " | ".join(cells) + " |")
    cells = []
    for b in BACKENDS:
        compiled, total, silent, invalid, _ = totals[b]
        cells += [f"{compiled}/{total}", f"{silent}/{invalid}"]
    lines.append("| **all** | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def failure_listing(doc: dict[str, Any], outcome: str = TIMEOUT) -> str:
    """The schemas that ended in ``outcome`` (default: timeouts), per backend and draft."""
    lines = []
    for backend, drafts in doc.get("results", {}).items():
        for draft, sec in drafts.items():
            ids = [k for k, v in sec["outcomes"].items() if v == outcome]
            if ids:
                lines.append(f"- {backend} {draft} ({len(ids)}): " + ", ".join(ids))
    return "\n".join(lines) or "(none)"


def counts_table(doc: dict[str, Any]) -> str:
    """A Markdown table of the per-backend, per-draft counts."""
    lines = [
        "| backend | draft | tokenizer | compiled | failures (timeouts) | valid accepted | "
        "invalid rejected | silent violations |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for backend, drafts in doc.get("results", {}).items():
        for draft, sec in drafts.items():
            c = sec["counts"]
            lines.append(
                f"| {backend} | {draft} | {doc['tokenizers'].get(backend, '?')} | "
                f"{c['compiled']}/{c['schemas']} | {c['compile_failures']} ({c['timeouts']}) | "
                f"{c['valid_accepted']}/{c['valid_total']} | "
                f"{c['invalid_rejected']}/{c['invalid_total']} | {c['silent_violations']} |"
            )
    return "\n".join(lines)


# ---- command line ---------------------------------------------------------------------


def run_all(
    backends: Iterable[str],
    drafts: Iterable[str] = DRAFTS,
    *,
    progress: bool = True,
    workers: int = 2,
    timeouts: dict[str, float] | None = None,
) -> tuple[dict[tuple[str, str], list[SchemaResult]], dict[str, list[SchemaCase]]]:
    cases = {d: load_draft(d) for d in drafts}
    tasks = [(b, c) for b in backends for d in cases for c in cases[d]]
    with WorkerPool(workers) as pool:
        results = pool.run(tasks, progress=progress, timeouts=timeouts)
    grouped: dict[tuple[str, str], list[SchemaResult]] = defaultdict(list)
    for r in results:
        grouped[(r.backend, r.case.draft)].append(r)
    return grouped, cases


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--report", action="store_true", help="print the keyword tables")
    parser.add_argument("--run", action="store_true", help="run the suite instead of reading the file")
    parser.add_argument("--update", action="store_true", help="run and rewrite the expectations file")
    parser.add_argument("--backend", action="append", choices=BACKENDS, help="default: all")
    parser.add_argument("--times", type=Path, help="write per-schema compile times and reasons here")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--limit", type=float, help="compile time limit (s) for every backend; "
                        "for measuring only, not with --update")
    args = parser.parse_args(argv)
    backends = args.backend or list(BACKENDS)
    doc = read_expectations()
    if args.run or args.update:
        start = time.monotonic()
        if args.limit and args.update:
            parser.error("--limit is for measuring; the expectations use COMPILE_TIMEOUT_S")
        timeouts = {b: args.limit for b in BACKENDS} if args.limit else None
        grouped, cases = run_all(backends, progress=not args.quiet, workers=args.workers, timeouts=timeouts)
        print(f"ran in {time.monotonic() - start:.1f} s", file=sys.stderr)
        run_doc = dict(doc) if args.update else {}
        for (backend, draft), results in grouped.items():
            run_doc = updated_expectations(run_doc, backend, draft, results, cases[draft])
        if args.update:
            write_expectations(run_doc)
        doc = run_doc
        if args.times:
            rows = [
                {"backend": r.backend, "draft": r.case.draft, "id": r.case.id,
                 "outcome": r.outcome, "seconds": r.compile_seconds, "reason": r.reason,
                 "match_errors": r.match_errors}
                for rs in grouped.values() for r in rs
            ]
            args.times.write_text(json.dumps(rows, indent=1, ensure_ascii=False))
    if args.report or not (args.run or args.update):
        print(counts_table(doc))
        print()
        print(keyword_table(doc))
        print()
        print("Compile timeouts:")
        print(failure_listing(doc))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
