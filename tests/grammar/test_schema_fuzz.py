"""Hypothesis fuzz of ``Constraint.json_schema`` through the compile service: random
(recursive) schemas built from real JSON Schema keywords, with sensible and with wrong
values, compile to a :class:`CompiledGrammar` or raise :class:`InvalidConstraint`
(:class:`CompileTimeout` and :class:`UnsupportedConstraint` included), never another
exception, and never take longer than the compile timeout (a hang check with a generous
bound, three timeouts, not a performance assertion).

The compiler is the service as deployed (``backend="auto"``, killable workers) with a
2 s timeout; an xgrammar worker is started up front (the usual fallback), the others
when first needed (their start counts against a compile's deadline: a timeout, which is
an allowed outcome).
"""

from __future__ import annotations

import string
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from thinkstruct import CompiledGrammar, Constraint, InvalidConstraint, Tokenizer
from thinkstruct.grammar.runtime.bitmask import allocate_bitmask
from thinkstruct.grammar.schema.merges import CAP, merge_combinations
from thinkstruct.grammar.schema.repetition import CAP as REPETITION_CAP
from thinkstruct.grammar.schema.repetition import unrolled_size
from thinkstruct.grammar.service.compiler import CompilerConfig, GrammarCompiler

TIMEOUT_S = 2.0

_TYPES = ["null", "boolean", "integer", "number", "string", "array", "object"]
_NAMES = st.sampled_from(["a", "b", "name", "x y", "a/b", "~0", "", "é", "\x00", "$ref"])
_PATTERNS = st.sampled_from(
    ["^a+$", "[0-9]{2,4}", "(a|b)*c", "(a+)+$", "\\d+", "^$", "a{3,1}", "(", "[z-a]", ".*"]
)
_FORMATS = st.sampled_from(["date", "date-time", "email", "uuid", "ipv4", "uri", "no-such-format"])
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False),
    st.text(string.printable, max_size=6),
)
# Mostly sensible counts, sometimes hostile or ill-typed ones.
_COUNTS = st.one_of(st.integers(0, 5), st.sampled_from([-1, 1.5, "3", True, 10**9]))
_NUMBERS = st.one_of(
    st.integers(-100, 100), st.floats(-100, 100, allow_nan=False), st.sampled_from(["1", None])
)


def _keywords(base: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """A schema with a random subset of the keywords in ``base``."""
    return st.fixed_dictionaries({}, optional=base)


_LEAVES = st.one_of(
    st.booleans(),
    st.just({}),
    _keywords(
        {
            "type": st.one_of(
                st.sampled_from(_TYPES), st.lists(st.sampled_from(_TYPES), max_size=3), st.just("strng")
            )
        }
    ),
    _keywords({"const": _SCALARS}),
    _keywords({"enum": st.one_of(st.lists(_SCALARS, max_size=5), st.just("notalist"))}),
    _keywords(
        {
            "type": st.just("string"),
            "minLength": _COUNTS,
            "maxLength": _COUNTS,
            "pattern": _PATTERNS,
            "format": _FORMATS,
        }
    ),
    _keywords(
        {
            "type": st.sampled_from(["integer", "number"]),
            "minimum": _NUMBERS,
            "maximum": _NUMBERS,
            "exclusiveMinimum": _NUMBERS,
            "exclusiveMaximum": _NUMBERS,
            "multipleOf": st.sampled_from([1, 2, 0.5, 0, -1, 0.001]),
        }
    ),
    st.sampled_from([{"$ref": "#"}, {"$ref": "#/$defs/d"}, {"$ref": "#/nowhere"}, {"$ref": "other.json"}]),
)


def _extend(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    children = st.lists(inner, min_size=1, max_size=3)
    return st.one_of(
        _keywords(
            {
                "type": st.just("object"),
                "properties": st.dictionaries(_NAMES, inner, max_size=3),
                "required": st.one_of(st.lists(_NAMES, max_size=3), st.just("a")),
                "additionalProperties": inner,
                "patternProperties": st.dictionaries(_PATTERNS, inner, max_size=2),
                "propertyNames": inner,
                "minProperties": _COUNTS,
                "maxProperties": _COUNTS,
                "dependentRequired": st.dictionaries(_NAMES, st.lists(_NAMES, max_size=2), max_size=2),
            }
        ),
        _keywords(
            {
                "type": st.just("array"),
                "items": inner,
                "prefixItems": children,
                "minItems": _COUNTS,
                "maxItems": _COUNTS,
                "uniqueItems": st.booleans(),
                "contains": inner,
                "minContains": _COUNTS,
            }
        ),
        st.builds(lambda k, v: {k: v}, st.sampled_from(["anyOf", "oneOf", "allOf"]), children),
        st.builds(lambda v: {"not": v}, inner),
        _keywords({"if": inner, "then": inner, "else": inner}),
        st.builds(
            lambda d, rest: {"$defs": {"d": d}, **rest},
            inner,
            _keywords({"$ref": st.just("#/$defs/d"), "type": st.sampled_from(_TYPES)}),
        ),
        st.builds(
            lambda d, extra: {**d, **extra},
            inner.filter(lambda s: isinstance(s, dict)),
            _keywords(
                {"description": st.text(max_size=5), "title": st.text(max_size=5), "default": _SCALARS}
            ),
        ),
    )


SCHEMAS = st.recursive(_LEAVES, _extend, max_leaves=10)


@pytest.fixture(scope="module")
def compiler(tokenizer: Tokenizer) -> Iterator[GrammarCompiler]:
    with GrammarCompiler(tokenizer, CompilerConfig(timeout_s=TIMEOUT_S, failure_ttl_s=0.0)) as c:
        c.warm_up(("xgrammar",), timeout_s=120.0)
        yield c


def _compiles_or_is_refused(compiler: GrammarCompiler, schema: Any, backend: str) -> None:
    start = time.monotonic()
    try:
        compiled = compiler.compile(Constraint.json_schema(schema), backend=backend)
    except InvalidConstraint as e:  # CompileTimeout and UnsupportedConstraint are subclasses
        assert str(e)  # a message, printable
        str(e).encode("utf-8")
    else:
        assert isinstance(compiled, CompiledGrammar)
        matcher = compiled.matcher()
        matcher.fill_bitmask(allocate_bitmask(1, compiler.tokenizer.vocab_size), 0)
    assert time.monotonic() - start < 3 * TIMEOUT_S, "a compile outlived its deadline"


_SETTINGS = settings(
    deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)


@settings(_SETTINGS, max_examples=40)
@given(schema=SCHEMAS)
def test_random_schemas_compile_or_are_refused(compiler: GrammarCompiler, schema: Any) -> None:
    _compiles_or_is_refused(compiler, schema, "auto")


# xgrammar by name: the library most schemas reach only as a fallback under auto, and the
# one whose errors come from C++. (outlines is left out: it needs more than the timeout
# for most schemas, {} included, so each example would only time out and kill a worker.)
@settings(_SETTINGS, max_examples=15)
@given(schema=SCHEMAS)
def test_random_schemas_compile_or_are_refused_by_xgrammar(compiler: GrammarCompiler, schema: Any) -> None:
    _compiles_or_is_refused(compiler, schema, "xgrammar")


@settings(max_examples=200, deadline=None)
@given(schema=SCHEMAS)
def test_merge_estimate_never_fails(schema: Any) -> None:
    # Read by every llguidance compile to decide thread or worker: it must answer for any
    # document, valid or not.
    assert 1 <= merge_combinations(schema) <= CAP


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(st.text(max_size=40), st.text('a(){}[],|\\"0123456789xp', max_size=40)))
def test_unrolled_size_never_fails(text: str) -> None:
    # Read by every llguidance regex/EBNF compile to decide thread or worker.
    assert 1 <= unrolled_size(text) <= REPETITION_CAP


def test_unrolled_size_follows_nesting() -> None:
    assert unrolled_size("a{1000000}") == 1_000_000
    assert unrolled_size("(a{1000}){1000}") == 1_000_000
    assert unrolled_size("\\d{4}-\\d{2}-\\d{2}") == 10  # sequences add
    assert unrolled_size("\\x{41}{3}") == 3  # an escape's braces are not a count


@pytest.mark.parametrize(
    ("constraint", "long"),
    [
        (
            Constraint.json_schema(
                {"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}, {"type": "null"}]}}}
            ),
            False,
        ),
        (Constraint.json_schema({"type": "string", "pattern": "^\\d{4}-\\d{2}-\\d{2}$"}), False),
        (Constraint.regex("[a-z]{1,32}"), False),
        (Constraint.json_schema({"allOf": [{"anyOf": [{"const": i} for i in range(15)]}] * 3}), True),
        (Constraint.json_schema({"type": "string", "pattern": "^a{1000000}$"}), True),
        (Constraint.regex("(a{1000}){1000}"), True),
        (Constraint.ebnf('root ::= "ab"{100000}'), True),
    ],
    ids=[
        "nullable",
        "date pattern",
        "short regex",
        "allOf of anyOf",
        "long pattern",
        "nested counts",
        "ebnf",
    ],
)
def test_llguidance_compiles_short_but_long_constraints_in_a_worker(
    compiler: GrammarCompiler, constraint: Constraint, long: bool
) -> None:
    # A thread cannot be stopped at the deadline; a worker can.
    llguidance = compiler.backend("llguidance", False)
    assert llguidance.runs_long(constraint) is long
    assert (compiler.pool_for(llguidance, constraint) is not None) is long
