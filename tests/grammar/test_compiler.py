"""The compile service: cache, shared cold compiles, timeouts, backend choice."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest

from polling import wait_until
from thinkstruct import CompileTimeout, Constraint, InvalidConstraint, Tokenizer
from thinkstruct.grammar.api import first_rejected
from thinkstruct.grammar.runtime.tag_checks import first_failed_check
from thinkstruct.grammar.service.compiler import CompilerConfig, GrammarCompiler

# outlines-core needs about 40 s for this (free-form values under a 129k vocabulary; each
# value and array adds about 3 s).
PATHOLOGICAL = {
    "type": "object",
    "properties": {
        f"{name}{i}": ({} if name == "x" else {"type": "array"}) for i in range(6) for name in "xy"
    },
    "required": [f"{name}{i}" for i in range(6) for name in "xy"],
}


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _schema(n: int) -> Constraint:
    return Constraint.json_schema(
        {"type": "object", "properties": {f"k{n}": {"type": "integer"}}, "required": [f"k{n}"]}
    )


@pytest.fixture
def compiler(tokenizer: Tokenizer):
    with GrammarCompiler(tokenizer, CompilerConfig(worker_processes=0)) as c:
        yield c


def test_sixteen_threads_one_cold_key_one_compile(compiler: GrammarCompiler) -> None:
    constraint = _schema(1)
    barrier = threading.Barrier(16)
    results: list[object] = []

    def ask() -> None:
        barrier.wait()
        results.append(compiler.compile(constraint))

    threads = [threading.Thread(target=ask) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 16 and all(r is results[0] for r in results)
    assert compiler.stats.compiles == 1
    assert compiler.stats.misses == 1
    assert compiler.stats.hits == 15


def test_async_callers_share_one_compile(compiler: GrammarCompiler) -> None:
    constraint = _schema(2)

    async def main() -> list[object]:
        return await asyncio.gather(*(compiler.compile_async(constraint) for _ in range(8)))

    results = asyncio.run(main())
    assert all(r is results[0] for r in results)
    assert compiler.stats.compiles == 1


def test_lru_by_entries_and_bytes(tokenizer: Tokenizer) -> None:
    with GrammarCompiler(tokenizer, CompilerConfig(cache_entries=2, worker_processes=0)) as c:
        first = c.compile(_schema(1))
        c.compile(_schema(2))
        assert c.compile(_schema(1)) is first  # a hit makes it recent
        c.compile(_schema(3))  # evicts 2, the least recently used
        assert c.stats.entries == 2 and c.stats.evictions == 1
        assert c.compile(_schema(1)) is first
        compiles = c.stats.compiles
        c.compile(_schema(2))
        assert c.stats.compiles == compiles + 1
    with GrammarCompiler(tokenizer, CompilerConfig(cache_bytes=1, worker_processes=0)) as c:
        c.compile(_schema(1))
        c.compile(_schema(2))
        assert c.stats.entries == 1  # never below one entry, never above the byte bound otherwise


def test_invalid_constraint_is_reported_and_remembered_briefly(tokenizer: Tokenizer) -> None:
    bad = Constraint.json_schema({"type": "array", "items": {"$ref": "#/nowhere"}})
    now = [0.0]  # the failure memory's clock, moved by hand: no race with the machine's load
    config = CompilerConfig(worker_processes=0, failure_ttl_s=30.0)
    with GrammarCompiler(tokenizer, config, clock=lambda: now[0]) as c:
        with pytest.raises(InvalidConstraint, match="/items/\\$ref"):
            c.compile(bad)
        now[0] += 29.9
        with pytest.raises(InvalidConstraint):
            c.compile(bad)
        assert c.stats.invalid == 1  # the second answer came from memory
        now[0] += 0.1
        with pytest.raises(InvalidConstraint):
            c.compile(bad)
        assert c.stats.invalid == 2  # not cached forever


def test_timeout_stops_the_work_and_the_compiler_carries_on(tokenizer: Tokenizer) -> None:
    # 16 s: a timeout is remembered only when queues took under half of it (else it was
    # load); with 8 s a loaded machine once queued the compile over 4 s (two timeouts).
    with GrammarCompiler(
        tokenizer, CompilerConfig(backend="outlines", timeout_s=16.0, failure_ttl_s=120)
    ) as c:
        c.warm_up()
        c.compile(Constraint.regex("warm"))  # the service's own idle thread exists now
        [worker] = c.worker_pids()
        threads_before = threading.active_count()
        start = time.monotonic()
        with pytest.raises(CompileTimeout) as info:
            c.compile(Constraint.json_schema(PATHOLOGICAL))
        assert time.monotonic() - start < 60
        assert "longer than 16 s" in str(info.value) and info.value.backend == "outlines"
        # The worker running the compile was killed (and is reaped within moments): no
        # core stays pinned.
        wait_until(lambda: not _exists(worker), "the timed-out worker is gone")
        # The caller hears of the timeout first, then the pool drops the worker: wait for
        # that rather than race it (a replacement may be starting already).
        wait_until(lambda: worker not in c.worker_pids(), "the pool dropped the worker")
        cpu = time.process_time()
        time.sleep(1.0)
        assert time.process_time() - cpu < 0.5  # and this process is idle too
        assert threading.active_count() <= threads_before
        # A later good compile works, in the fresh worker started at once ...
        c.warm_up()
        good = c.compile(Constraint.regex("[a-z]+@[a-z]+"))
        assert good.backend == "outlines" and first_rejected(good, "ab@cd") is None
        # ... and the timed-out key is answered from memory without compiling again.
        with pytest.raises(CompileTimeout):
            c.compile(Constraint.json_schema(PATHOLOGICAL))
        assert c.stats.timeouts == 1


def test_xgrammar_compiles_in_a_worker_and_matches_in_process(tokenizer: Tokenizer) -> None:
    with GrammarCompiler(tokenizer, CompilerConfig(backend="xgrammar")) as c:
        compiled = c.compile(_schema(7))
        assert c.worker_pids()  # compiled out of process ...
        assert compiled.backend == "xgrammar"
        assert first_rejected(compiled, '{"k7":3}') is None  # ... and used here
        assert first_rejected(compiled, '{"k7":"x"}') is not None


# ---- backend choice -------------------------------------------------------------------


def test_auto_prefers_llguidance_and_names_the_backend(compiler: GrammarCompiler) -> None:
    assert compiler.compile(_schema(3)).backend == "llguidance"
    assert compiler.compile(Constraint.regex("a+")).backend == "llguidance"


def test_auto_uses_xgrammar_where_llguidance_cannot(compiler: GrammarCompiler) -> None:
    tag = {"type": "structural_tag", "format": {"type": "const_string", "value": "ok"}}
    assert compiler.compile(Constraint.structural_tag(tag)).backend == "xgrammar"


UNENFORCEABLE = {
    "type": "object",
    "properties": {
        "ids": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
        "kind": {"type": "string", "not": {"const": "x"}},
    },
}


def test_strict_checks_what_no_grammar_enforces(tokenizer: Tokenizer) -> None:
    with GrammarCompiler(tokenizer, CompilerConfig(strict=True, worker_processes=0)) as c:
        compiled = c.compile(Constraint.json_schema(UNENFORCEABLE))
    assert compiled.backend == "llguidance" and compiled.ignored_keywords == ()
    assert compiled.checks is not None
    checked = {
        (e.keyword, e.pointer, e.location) for e in compiled.enforcement() if e.enforcement == "checked"
    }
    assert checked == {
        ("uniqueItems", "/properties/ids/uniqueItems", "/ids"),
        ("not", "/properties/kind/not", "/kind"),
    }
    # The grammar lets both through; the checks do not.
    assert first_rejected(compiled, '{"ids":[1,1],"kind":"x"}') is None
    failure = first_failed_check(compiled.checks, '{"ids":[1,1],"kind":"x"}')
    assert failure is not None and (failure.keyword, failure.pointer, failure.start) == (
        "uniqueItems",
        "/ids",
        10,  # the repeated item, not the array
    )
    assert first_failed_check(compiled.checks, '{"ids":[1,2],"kind":"y"}') is None


def test_lenient_falls_back_and_says_what_it_ignores(compiler: GrammarCompiler) -> None:
    compiled = compiler.compile(Constraint.json_schema(UNENFORCEABLE))
    assert set(compiled.ignored_keywords) == {"/properties/ids/uniqueItems", "/properties/kind/not"}
    assert compiler.stats.fallbacks == 0  # planned, not a failed attempt
    assert first_rejected(compiled, '{"ids":[1,2],"kind":"y"}') is None


def test_strict_compiles_disjoint_one_of_exactly(tokenizer: Tokenizer) -> None:
    schema = {
        "oneOf": [
            {
                "type": "object",
                "properties": {"kind": {"const": "circle"}, "r": {"type": "number"}},
                "required": ["kind", "r"],
            },
            {
                "type": "object",
                "properties": {"kind": {"const": "square"}, "side": {"type": "number"}},
                "required": ["kind", "side"],
            },
        ]
    }
    with GrammarCompiler(tokenizer, CompilerConfig(strict=True, worker_processes=0)) as c:
        compiled = c.compile(Constraint.json_schema(schema))
    assert compiled.ignored_keywords == ()
    assert first_rejected(compiled, '{"kind":"circle","r":1}') is None
    assert first_rejected(compiled, '{"kind":"circle","side":1}') is not None


def test_strict_checks_overlapping_one_of(tokenizer: Tokenizer) -> None:
    schema = {"oneOf": [{"type": "integer"}, {"minimum": 2}]}
    with GrammarCompiler(tokenizer, CompilerConfig(strict=True, worker_processes=0)) as c:
        compiled = c.compile(Constraint.json_schema(schema))
    assert [(e.keyword, e.location) for e in compiled.enforcement() if e.enforcement == "checked"] == [
        ("oneOf", "")
    ]
    assert compiled.checks is not None
    assert first_failed_check(compiled.checks, "5") is not None  # both branches match
    assert first_failed_check(compiled.checks, "1") is None


def test_unknown_format_is_an_annotation(compiler: GrammarCompiler) -> None:
    compiled = compiler.compile(Constraint.json_schema({"type": "string", "format": "uri-reference"}))
    assert compiled.backend == "llguidance" and compiled.ignored_keywords == ()
    assert first_rejected(compiled, '"../x"') is None


def test_fallback_after_a_refusal_is_counted(compiler: GrammarCompiler) -> None:
    # llguidance's GBNF conversion refuses this grammar's syntax; xgrammar takes it.
    grammar = 'root ::= [a-z]+ "=" [0-9]+'
    compiled = compiler.compile(Constraint.ebnf(grammar))
    assert first_rejected(compiled, "abc=12") is None
    assert compiled.backend in ("llguidance", "xgrammar")
    assert compiler.stats.fallbacks == (1 if compiled.backend == "xgrammar" else 0)


def test_dynamic_anchor_without_dynamic_ref_is_a_plain_anchor(tokenizer: Tokenizer) -> None:
    schema = {
        "$id": "https://example.com/root",
        "type": "array",
        "items": {"$ref": "#items"},
        "$defs": {"foo": {"$dynamicAnchor": "items", "type": "string"}},
    }
    with GrammarCompiler(tokenizer, CompilerConfig(strict=True, worker_processes=0)) as c:
        compiled = c.compile(Constraint.json_schema(schema))
    # llguidance refuses $dynamicAnchor and xgrammar would let '42' through the anchor ref;
    # rewritten to $anchor, llguidance enforces it exactly.
    assert compiled.backend == "llguidance"
    assert first_rejected(compiled, '["foo","bar"]') is None
    assert first_rejected(compiled, '["foo",42]') is not None


# ---- configuration and the one-call API ------------------------------------------------


def test_per_call_backend_and_strict_are_part_of_the_key(compiler: GrammarCompiler) -> None:
    constraint = Constraint.json_schema(UNENFORCEABLE)
    lenient = compiler.compile(constraint)
    assert lenient.ignored_keywords  # the config's lenient auto
    strict = compiler.compile(constraint, strict=True)  # not answered by the lenient entry
    assert strict.checks is not None and not strict.ignored_keywords
    assert compiler.compile(constraint) is lenient
    regex = Constraint.regex("[a-c]+")
    assert compiler.compile(regex).backend == "llguidance"
    assert compiler.compile(regex, backend="xgrammar").backend == "xgrammar"
    future = compiler.submit(regex, backend="xgrammar")
    assert future.result().backend == "xgrammar"
    with pytest.raises(ValueError, match="known backends: auto, xgrammar"):
        compiler.compile(regex, backend="nope")


def test_config_is_frozen_and_checked() -> None:
    config = CompilerConfig()
    assert (config.backend, config.strict, config.cache_entries, config.timeout_s) == (
        "auto",
        False,
        1024,
        30.0,
    )
    with pytest.raises(AttributeError):
        config.timeout_s = 1.0  # type: ignore[misc]
    for bad in ({"backend": "nope"}, {"timeout_s": 0}, {"cache_entries": 0}, {"threads": 0}):
        with pytest.raises(ValueError):
            CompilerConfig(**bad)  # type: ignore[arg-type]


def test_one_call_api_defaults_to_auto_through_one_shared_compiler(tokenizer: Tokenizer) -> None:
    import thinkstruct
    from thinkstruct.grammar.api import default_compiler

    constraint = Constraint.json_schema({"type": "object", "properties": {"x": {"type": "integer"}}})
    assert thinkstruct.accepts(constraint, '{"x":1}')
    assert thinkstruct.accepts(constraint, '{"x":1}', backend="auto")
    assert not thinkstruct.accepts(constraint, '{"x":"1"}', backend="auto")
    first = thinkstruct.compile(constraint)
    assert first.backend == "llguidance"  # auto's first choice
    assert thinkstruct.compile(constraint, tokenizer) is first  # the shared compiler's cache
    assert default_compiler(tokenizer).stats.hits >= 1
    assert default_compiler(tokenizer) is default_compiler(tokenizer)
