"""Run the official JSON Schema Test Suite through thinkstruct's grammar backends.

Used by ``tests/grammar/test_conformance.py`` and as a command line tool::

    python -m tests.grammar.conformance_support --report            # table from the committed file
    python -m tests.grammar.conformance_support --report --run      # run the suite, then the table
    python -m tests.grammar.conformance_support --update            # run, rewrite the expectations
    python -m tests.grammar.conformance_support --update --carry    # the same, recorded timeouts carried
    python -m tests.grammar.conformance_support --run --times out.json  # per-schema compile times

For each schema of each top-level test file (``draft2020-12/*.json`` and ``draft7/*.json``,
not ``optional/``), a backend compiles the schema once; each instance of the schema, written
in the compact form ``json.dumps(data, separators=(",", ":"), ensure_ascii=False)``, counts
as accepted when :func:`thinkstruct.grammar.api.first_rejected` returns ``None`` (what
:func:`thinkstruct.accepts` does).

Compiles run in the project's own compile workers (a :class:`GrammarCompiler` per backend
with every compile, llguidance's included, in a killable worker process) under a
per-schema time limit: a compile still running at the limit counts as a compile failure
with reason ``timeout``, and its worker is killed and replaced, so a hung Rust/C++ compile
cannot hang the test run. Instances are matched in this process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
                Instance(t["description"], serialize(t["data"]), bool(t["valid"])) for t in group["tests"]
            )
            cases.append(
                SchemaCase(draft, path.name, index, group["description"], group["schema"], instances)
            )
    return cases


# ---- compiling and matching --------------------------------------------------------------


def load_tokenizer(name: str) -> Any:
    from thinkstruct import Tokenizer
    from thinkstruct.tokenizer import smollm2_gguf_path

    if name == "deepseek-v4":
        return Tokenizer.default()
    if name == "smollm2":
        return Tokenizer.from_pretrained(smollm2_gguf_path())
    raise ValueError(f"unknown tokenizer {name!r}")


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

    @property
    def compiled(self) -> bool:
        return not self.outcome.startswith("!")


class WorkerPool:
    """Runs (backend, case) tasks through one :class:`GrammarCompiler` per backend and time
    limit, ``size`` compiles at a time (each compile in one of the compiler's ``size``
    killable workers, so none waits in a queue against its limit)."""

    def __init__(self, size: int = 2) -> None:
        self.size = size
        self._compilers: dict[tuple[str, str, float], Any] = {}
        self._lock = threading.Lock()

    def compiler(self, backend: str, tokenizer: str, limit: float) -> Any:
        """The started compiler for ``backend`` with time limit ``limit``."""
        from thinkstruct.grammar.service.compiler import CompilerConfig, GrammarCompiler

        key = (backend, tokenizer, limit)
        with self._lock:
            compiler = self._compilers.get(key)
            if compiler is None:
                config = CompilerConfig(
                    backend=backend,
                    timeout_s=max(limit, 1e-3),
                    failure_ttl_s=0.0,
                    worker_processes=self.size,
                    inline_compile_bytes=0,  # every compile killable, llguidance's too
                    cache_entries=1,
                )
                compiler = self._compilers[key] = GrammarCompiler(load_tokenizer(tokenizer), config)
                compiler.warm_up((backend,), timeout_s=STARTUP_TIMEOUT_S)
        return compiler

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
            try:
                while True:
                    with queue_lock:
                        if not todo or failures:
                            break
                        i, (backend, case) = todo.pop(0)
                    results[i] = self._one(backend, case, timeouts[backend], tokenizers[backend])
                    if progress:
                        r = results[i]
                        print(
                            f"{backend:10} {case.draft}/{case.id:40} {r.outcome[:30]:30} "
                            f"{r.compile_seconds or 0:7.2f}s",
                            file=sys.stderr,
                            flush=True,
                        )
            except BaseException as e:
                failures.append(e)

        threads = [threading.Thread(target=drive) for _ in range(min(self.size, len(todo)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if failures:
            raise failures[0]
        return [r for r in results if r is not None]

    def _one(self, backend: str, case: SchemaCase, limit: float, tokenizer: str) -> SchemaResult:
        import thinkstruct
        from thinkstruct.errors import InternalCompileError
        from thinkstruct.grammar.api import first_rejected

        compiler = self.compiler(backend, tokenizer, limit)
        start = time.perf_counter()
        try:
            compiled = compiler.compile(thinkstruct.Constraint.json_schema(case.schema))
        except thinkstruct.CompileTimeout:
            return SchemaResult(case, backend, TIMEOUT, reason=f"compile ran past {limit} s")
        except thinkstruct.InvalidConstraint as e:
            return SchemaResult(case, backend, REFUSED, reason=str(e))
        except InternalCompileError as e:
            return SchemaResult(case, backend, CRASH, reason=f"worker died: {e}")
        except Exception as e:
            return SchemaResult(case, backend, ERROR, reason=f"{type(e).__name__}: {e}")
        seconds = compiled.compile_seconds or (time.perf_counter() - start)
        marks, errors = [], []
        for inst in case.instances:
            try:
                marks.append(ACCEPTED if first_rejected(compiled, inst.text) is None else REJECTED)
            except Exception as e:
                marks.append(MATCH_ERROR)
                errors.append(f"{inst.text!r}: {type(e).__name__}: {e}")
        return SchemaResult(case, backend, "".join(marks), seconds, match_errors=errors)

    def close(self) -> None:
        """Stop every compiler this pool started (and their workers)."""
        with self._lock:
            compilers, self._compilers = list(self._compilers.values()), {}
        for c in compilers:
            c.close()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- summaries and the expectations file ----------------------------------------------


def counts(outcomes: dict[str, str], cases: list[SchemaCase]) -> dict[str, int]:
    """The summary numbers of one backend on one draft, from per-schema outcomes."""
    c = dict.fromkeys(
        (
            "schemas",
            "compiled",
            "compile_failures",
            "timeouts",
            "valid_total",
            "valid_accepted",
            "invalid_total",
            "invalid_rejected",
            "silent_violations",
        ),
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
        lines.append(f"    {json.dumps(backend)}: {{")
        drafts = list(doc["results"][backend])
        for di, draft in enumerate(drafts):
            sec = doc["results"][backend][draft]
            lines.append(f"      {json.dumps(draft)}: {{")
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
    new["compile_timeout_s"] = {
        b: new["compile_timeout_s"][b] for b in BACKENDS if b in new["compile_timeout_s"]
    }
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
    header = (
        "| keyword (test file) | "
        + " | ".join(f"{b} compiled | {b} silent violations" for b in BACKENDS)
        + " |"
    )
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


def capability_table() -> str:
    """A Markdown table of what each registered backend declares (the registry in
    ``thinkstruct.grammar.backends``, which ``auto`` reads): docs/keyword_support.md holds
    it verbatim, and a test fails when the two disagree."""
    from thinkstruct.grammar.backends import backend_classes
    from thinkstruct.grammar.constraint import ConstraintKind

    lines = [
        "| backend | kinds (auto's rank; - = never chosen by auto) | keywords not enforced exactly (checked in strict mode) | lenient | compiles in |",
        "|---|---|---|---|---|",
    ]
    for cls in backend_classes():
        kinds = ", ".join(f"{k.value} ({cls.rank.get(k, '-')})" for k in ConstraintKind if k in cls.kinds)
        lenient = "mode" if cls.lenient_mode else "ignores them" if cls.ignores_inexact else "refuses them"
        where = "a worker process" if cls.isolated else "a thread (a worker past the inline size)"
        lines.append(
            f"| {cls.name} | {kinds} | {', '.join(f'`{k}`' for k in sorted(cls.inexact_keywords))} | {lenient} | {where} |"
        )
    return "\n".join(lines)


def vllm_keyword_table() -> str:
    """A Markdown table of what strict mode does with each keyword some backend leaves to
    checks, in thinkstruct's engine and inside vLLM (``thinkstruct.grammar.schema.dead_ends``):
    docs/keyword_support.md holds it verbatim, and a test fails when the two disagree."""
    from thinkstruct.grammar.backends import backend_classes
    from thinkstruct.grammar.schema.dead_ends import RULES

    keywords = sorted({k for cls in backend_classes() for k in cls.inexact_keywords})
    lines = [
        "| keyword | thinkstruct's engine | inside vLLM |",
        "|---|---|---|",
    ]
    for keyword in keywords:
        rule = RULES.get(keyword)
        inside = (
            f"enforced at its value's closing token where {rule.when}; elsewhere a 400 naming its pointer"
            if rule is not None
            else "a 400 naming its pointer"
        )
        lines.append(
            f"| `{keyword}` | checked as its value closes; a failing value is drawn again | {inside} |"
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
    carry: dict[str, Any] | None = None,
) -> tuple[dict[tuple[str, str], list[SchemaResult]], dict[str, list[SchemaCase]]]:
    cases = {d: load_draft(d) for d in drafts}
    tasks, carried = [], []
    for b in backends:
        recorded = (carry or {}).get("results", {}).get(b, {})
        for d in cases:
            outcomes = recorded.get(d, {}).get("outcomes", {})
            slow = set(recorded.get(d, {}).get("slow", []))
            for c in cases[d]:
                if carry is not None and (outcomes.get(c.id) == TIMEOUT or c.id in slow):
                    # Carried as recorded, with a compile time that keeps it "slow".
                    seconds = None if outcomes[c.id] == TIMEOUT else COMPILE_TIMEOUT_S[b]
                    carried.append(SchemaResult(c, b, outcomes[c.id], seconds, reason="recorded"))
                else:
                    tasks.append((b, c))
    with WorkerPool(workers) as pool:
        results = pool.run(tasks, progress=progress, timeouts=timeouts) + carried
    grouped: dict[tuple[str, str], list[SchemaResult]] = defaultdict(list)
    for r in results:
        grouped[(r.backend, r.case.draft)].append(r)
    order = {d: {c.id: i for i, c in enumerate(cs)} for d, cs in cases.items()}
    for (_, d), rs in grouped.items():
        rs.sort(key=lambda r: order[d][r.case.id])
    return grouped, cases


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--report", action="store_true", help="print the keyword tables")
    parser.add_argument("--run", action="store_true", help="run the suite instead of reading the file")
    parser.add_argument("--update", action="store_true", help="run and rewrite the expectations file")
    parser.add_argument("--backend", action="append", choices=BACKENDS, help="default: all")
    parser.add_argument("--times", type=Path, help="write per-schema compile times and reasons here")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument(
        "--limit",
        type=float,
        help="compile time limit (s) for every backend; for measuring only, not with --update",
    )
    parser.add_argument(
        "--carry",
        action="store_true",
        help="with --update: carry the recorded "
        "timeouts and slow compiles instead of re-measuring them (as a plain test run does)",
    )
    args = parser.parse_args(argv)
    backends = args.backend or list(BACKENDS)
    doc = read_expectations()
    if args.run or args.update:
        start = time.monotonic()
        if args.limit and args.update:
            parser.error("--limit is for measuring; the expectations use COMPILE_TIMEOUT_S")
        timeouts = dict.fromkeys(BACKENDS, args.limit) if args.limit else None
        carry = doc if args.update and args.carry else None
        grouped, cases = run_all(
            backends, progress=not args.quiet, workers=args.workers, timeouts=timeouts, carry=carry
        )
        print(f"ran in {time.monotonic() - start:.1f} s", file=sys.stderr)
        run_doc = dict(doc) if args.update else {}
        for (backend, draft), results in grouped.items():
            run_doc = updated_expectations(run_doc, backend, draft, results, cases[draft])
        if args.update:
            write_expectations(run_doc)
        doc = run_doc
        if args.times:
            rows = [
                {
                    "backend": r.backend,
                    "draft": r.case.draft,
                    "id": r.case.id,
                    "outcome": r.outcome,
                    "seconds": r.compile_seconds,
                    "reason": r.reason,
                    "match_errors": r.match_errors,
                }
                for rs in grouped.values()
                for r in rs
            ]
            args.times.write_text(json.dumps(rows, indent=1, ensure_ascii=False))
    if args.report or not (args.run or args.update):
        print(capability_table())
        print()
        print(vllm_keyword_table())
        print()
        print(counts_table(doc))
        print()
        print(keyword_table(doc))
        print()
        print("Compile timeouts:")
        print(failure_listing(doc))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
