"""Which schemas each backend enforces, how fast, and how exactly.

Over the JSONSchemaBench sample (MaskBench, ``$THINKSTRUCT_MASKBENCH``) and the official
JSON-Schema-Test-Suite (draft 2020-12 and 7, ``$THINKSTRUCT_JSON_SCHEMA_SUITE``), for
each backend and for ``auto`` (strict and lenient), through the real compile service
(:class:`~thinkstruct.grammar.service.compiler.GrammarCompiler`: xgrammar and outlines-core in
killable worker processes, one time limit per compile), prints per suite and mode:

- compile success rate;
- compile time p50/p90 (the library's own compile time) and *time to first mask* p50/p90
  (the service's wall time from a cold ``compile`` to the first filled mask row);
- a cached ``compile`` (a hit) p50 in microseconds;
- per-token mask fill p50/p99 over the valid instances' tokens;
- invalid instances accepted: all, and the *silent* ones (accepted by a grammar that
  claimed to enforce the schema exactly, i.e. with no ``ignored_keywords``). An instance
  is accepted as ``thinkstruct.accepts`` does: the grammar accepts the text and, where
  a strict compile checks keywords no grammar enforces (``compiled.checks``), every
  checked value validates; ``checked`` counts the schemas compiled so.

Instances are serialized compactly (``,``/``:``). Targets: auto strict compiles >= 99 % of MaskBench (checked keywords
included) with 0 invalid instances accepted, auto lenient >= 98 %,
auto's time to first mask p90 <= 10 ms, a cached compile <= 100 us. Nothing here asserts
on time.

    python benchmarks/coverage.py                      # every mode, default sampling
    python benchmarks/coverage.py --modes auto-strict auto-lenient --suites maskbench
    python benchmarks/coverage.py --modes auto-strict --suites maskbench --skip-probes
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MASKBENCH = Path(os.environ.get("THINKSTRUCT_MASKBENCH", "/work/shared/conformance/maskbench"))
#: The suite's ``tests`` directory (the copy kept in the repository unless overridden).
SUITE_TESTS = Path(
    os.environ.get("THINKSTRUCT_JSON_SCHEMA_SUITE")
    or Path(__file__).resolve().parent.parent / "tests" / "data" / "JSON-Schema-Test-Suite" / "tests"
)

#: mode -> (GrammarCompiler backend, strict)
MODES = {
    "llguidance": ("llguidance", False),
    "xgrammar": ("xgrammar", False),
    "outlines": ("outlines", False),
    "auto-strict": ("auto", True),
    "auto-lenient": ("auto", False),
}


@dataclass(frozen=True)
class Case:
    name: str
    schema: Any
    instances: tuple[tuple[str, bool], ...]  # (compact JSON, valid)


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def load_maskbench() -> list[Case]:
    cases = []
    for path in sorted(MASKBENCH.glob("*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        tests = tuple((compact(t["data"]), bool(t["valid"])) for t in doc.get("tests", []))
        cases.append(Case(path.stem, doc["schema"], tests))
    return cases


def load_suite() -> list[Case]:
    cases = []
    for draft in ("draft2020-12", "draft7"):
        for path in sorted((SUITE_TESTS / draft).glob("*.json")):
            for i, group in enumerate(json.loads(path.read_text(encoding="utf-8"))):
                tests = tuple((compact(t["data"]), bool(t["valid"])) for t in group["tests"])
                cases.append(Case(f"{draft}/{path.stem}#{i}", group["schema"], tests))
    return cases


@dataclass
class Tally:
    schemas: int = 0
    compiled: int = 0
    #: Compiled with checked keywords (``compiled.checks``).
    checked: int = 0
    timeouts: int = 0
    compile_s: list[float] = field(default_factory=list)
    first_mask_s: list[float] = field(default_factory=list)
    hit_s: list[float] = field(default_factory=list)
    fill_s: list[float] = field(default_factory=list)
    valid: int = 0
    valid_accepted: int = 0
    invalid: int = 0
    invalid_accepted: int = 0
    silent: int = 0
    silent_schemas: list[str] = field(default_factory=list)
    backends: dict[str, int] = field(default_factory=dict)


def run_mode(mode: str, cases: list[Case], *, timeout_s: float, max_fill_tokens: int) -> Tally:
    from thinkstruct import CompileTimeout, Constraint, InvalidConstraint, Tokenizer
    from thinkstruct.grammar.api import first_rejected
    from thinkstruct.grammar.runtime.bitmask import allocate_bitmask
    from thinkstruct.grammar.service.compiler import CompilerConfig, GrammarCompiler

    tok = Tokenizer.default()
    backend, strict = MODES[mode]
    tally = Tally()
    bitmask = allocate_bitmask(1, tok.vocab_size)
    with GrammarCompiler(
        tok, CompilerConfig(backend=backend, strict=strict, timeout_s=timeout_s, cache_entries=4096)
    ) as service:
        service.warm_up()
        for case in cases:
            tally.schemas += 1
            try:
                constraint = Constraint.json_schema(case.schema)
            except InvalidConstraint:
                continue
            start = time.perf_counter()
            try:
                compiled = service.compile(constraint)
                compiled.matcher().fill_bitmask(bitmask, 0)
            except CompileTimeout:
                tally.timeouts += 1
                continue
            except InvalidConstraint:
                continue
            tally.first_mask_s.append(time.perf_counter() - start)
            tally.compile_s.append(compiled.compile_seconds)
            hit_start = time.perf_counter()
            for _ in range(20):
                service.compile(constraint)
            tally.hit_s.append((time.perf_counter() - hit_start) / 20)
            tally.compiled += 1
            tally.checked += compiled.checks is not None
            tally.backends[compiled.backend] = tally.backends.get(compiled.backend, 0) + 1
            exact = not compiled.ignored_keywords
            budget = max_fill_tokens
            for text, valid in case.instances:
                accepted = first_rejected(compiled, text) is None and _checks_pass(compiled, text)
                if valid:
                    tally.valid += 1
                    tally.valid_accepted += accepted
                    if accepted and budget > 0:
                        budget -= _time_fills(compiled, tok.encode(text)[:budget], bitmask, tally.fill_s)
                else:
                    tally.invalid += 1
                    tally.invalid_accepted += accepted
                    if accepted and exact:
                        tally.silent += 1
                        tally.silent_schemas.append(case.name)
    return tally


def _checks_pass(compiled: Any, text: str) -> bool:
    """Whether ``text`` passes ``compiled``'s checked keywords (a check that cannot run,
    a ``$ref`` the reference validator does not resolve, counts as a failure)."""
    from thinkstruct import InvalidConstraint
    from thinkstruct.grammar.runtime.tag_checks import first_failed_check

    if compiled.checks is None:
        return True
    try:
        return first_failed_check(compiled.checks, text) is None
    except InvalidConstraint:
        return False


def _time_fills(compiled: Any, ids: list[int], bitmask: Any, out: list[float]) -> int:
    g = compiled.matcher()
    clock = time.perf_counter
    for token in ids:
        t0 = clock()
        g.fill_bitmask(bitmask, 0)
        out.append(clock() - t0)
        g.accept_token(token)
    return len(ids)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(suite: str, rows: dict[str, Tally]) -> None:
    print(f"\n## {suite}\n")
    header = (
        "| mode | schemas | compiled | rate | checked | timeouts | compile p50 ms | compile p90 ms "
        "| first mask p50 ms | first mask p90 ms | cached µs | fill p50 µs | fill p99 µs "
        "| valid accepted | invalid accepted | silent violations |"
    )
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for mode, t in rows.items():
        rate = t.compiled / t.schemas if t.schemas else 0.0
        print(
            f"| {mode} | {t.schemas} | {t.compiled} | {rate:.1%} | {t.checked} | {t.timeouts} "
            f"| {_pct(t.compile_s, 0.5) * 1e3:.2f} | {_pct(t.compile_s, 0.9) * 1e3:.2f} "
            f"| {_pct(t.first_mask_s, 0.5) * 1e3:.2f} | {_pct(t.first_mask_s, 0.9) * 1e3:.2f} "
            f"| {_pct(t.hit_s, 0.5) * 1e6:.1f} | {_pct(t.fill_s, 0.5) * 1e6:.1f} | {_pct(t.fill_s, 0.99) * 1e6:.1f} "
            f"| {t.valid_accepted}/{t.valid} | {t.invalid_accepted}/{t.invalid} | {t.silent} |"
        )
    for mode, t in rows.items():
        if t.backends:
            print(f"- {mode}: backends chosen {dict(sorted(t.backends.items()))}")
        if t.silent_schemas:
            print(f"- {mode}: silent violations in {sorted(set(t.silent_schemas))[:10]}")


def skip_probes() -> None:
    """Switch off :func:`thinkstruct.grammar.service.probe.probe` and
    :func:`thinkstruct.grammar.schema.validation.check_instances_exist` in this process."""
    import thinkstruct.grammar.schema.validation as validation
    import thinkstruct.grammar.service.probe as probe

    probe.probe = lambda compiled, *, witness=True: None
    validation.check_instances_exist = lambda schema, **_: None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument(
        "--suites", nargs="+", default=["maskbench", "test-suite"], choices=["maskbench", "test-suite"]
    )
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per compile (default 10)")
    parser.add_argument(
        "--slow-sample",
        type=int,
        default=150,
        help="schemas per suite for xgrammar and outlines, whose compiles take seconds "
        "(seeded sample; 0 = all; default 150)",
    )
    parser.add_argument("--fill-tokens", type=int, default=64, help="timed mask fills per schema")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--skip-probes",
        action="store_true",
        help="measure without the per-compile checks against dead grammars (the probe of each "
        "compiled grammar and the finite-instance check), in this process only (llguidance; "
        "worker processes keep theirs): what those checks cost. Never how a server runs",
    )
    args = parser.parse_args(argv)
    if args.skip_probes:
        skip_probes()
    suites = {"maskbench": load_maskbench, "test-suite": load_suite}
    for suite in args.suites:
        cases = suites[suite]()
        rows: dict[str, Tally] = {}
        for mode in args.modes:
            chosen = cases
            if mode in ("xgrammar", "outlines") and args.slow_sample:
                chosen = random.Random(args.seed).sample(cases, min(args.slow_sample, len(cases)))
            start = time.perf_counter()
            rows[mode] = run_mode(mode, chosen, timeout_s=args.timeout, max_fill_tokens=args.fill_tokens)
            print(
                f"[{suite} {mode}: {len(chosen)} schemas in {time.perf_counter() - start:.0f} s]",
                file=sys.stderr,
            )
        report(suite, rows)
    print(
        "\nxgrammar and outlines rows cover a seeded sample (--slow-sample); compile times are the"
        " library's, first-mask times include the service (cache, worker round trip, first fill)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
