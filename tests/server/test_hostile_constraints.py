"""Hostile constraints over HTTP: each is a 400 OpenAI error object naming the problem (a
JSON pointer, a position, a limit), answered by the compile timeout; a constraint that is
legitimately valid gets a valid answer instead; the server stays healthy, a simple request
still succeeds, its compile workers are still there and its memory stays bounded.

The server is ``short_timeout_server`` (the tiny model, a 5 s compile timeout, failures
remembered for 2 s). Every request has a client timeout of three compile timeouts plus a
margin: a hang check, not a performance assertion. The seconds each case took are printed
(``pytest -s``) for the record.
"""

from __future__ import annotations

import ctypes
import gc
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import jsonschema
import openai
import psutil
import pytest
from server_harness import RunningServer

#: The official client's own fields; everything else travels in ``extra_body``.
_OPENAI_FIELDS = {"model", "messages", "max_tokens", "response_format", "temperature", "seed", "stop"}

#: Most the server process's RSS may grow over the whole hostile batch (bytes). The batch
#: parses a 5 MB schema, a 100,000-string enum and a 1 MB grammar (each some tens of MB of
#: Python objects while alive) and caches the grammars of the valid cases; what must not
#: happen is memory held per hostile request (a leaked grammar, a thread or worker per
#: timeout).
RSS_MARGIN = 300 << 20

TIMES: dict[str, float] = {}


@dataclass(frozen=True)
class Refused:
    """A 400 whose error object has ``code`` (one of), names ``words`` in its message, and
    points at ``pointer``/``param`` (when given)."""

    code: str | tuple[str, ...]
    words: tuple[str, ...] = ()
    pointer: str | None = None
    param: str | None = None
    status: int = 400


@dataclass(frozen=True)
class Answered:
    """A 200 whose seeded answer ends with ``finish``; a finished one (``stop``) passes
    ``valid``. (The server's engine computes a row alike in any batch, so the seed fixes
    the ending.)"""

    valid: Callable[[str], bool]
    finish: str


@dataclass(frozen=True)
class Either:
    """A constraint valid but slow to compile: a valid answer where this machine compiles it
    in time, else the 400 given."""

    answered: Answered
    refused: Refused


def _matches(pattern: str) -> Callable[[str], bool]:
    return lambda text: re.fullmatch(pattern, text, re.DOTALL) is not None


def _valid_json(schema: Any) -> Callable[[str], bool]:
    def check(text: str) -> bool:
        try:
            jsonschema.validate(json.loads(text), schema)
        except (ValueError, jsonschema.ValidationError):
            return False
        return True

    return check


def _schema(schema: Any) -> dict[str, Any]:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}


def _nested(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        node = {"type": "array", "items": node}
    return node


def _bomb(parts: int, width: int) -> dict[str, Any]:
    # llguidance intersects allOf members by distributing their oneOf lists: width**parts
    # intersections (3 x 29: about 8 s on 2 cores; four parts exceed its own limit).
    return {
        "allOf": [
            {"oneOf": [{"type": "string", "pattern": f"^a{{{i}}}$"} for i in range(1, width + 1)]}
            for _ in range(parts)
        ]
    }


_WIDE = {
    "anyOf": [
        {"type": "object", "properties": {f"k{i}": {"type": "integer"}}, "required": [f"k{i}"]}
        for i in range(20)
    ]
}
_PRODUCT = {"type": "object", "properties": {f"f{j}": _WIDE for j in range(20)}, "required": ["f0", "f1"]}
_ITEMS_REF = {"type": "array", "items": {"$ref": "#"}}
_BIG_SCHEMA = {
    "type": "object",
    "properties": {f"p{i}": {"type": "string", "description": "x" * 40} for i in range(80_000)},
}
_TRIGGERED = {"begin": "<a>", "schema": {"type": "integer"}, "end": "</a>"}
_FORMAT_TAG = {
    "type": "structural_tag",
    "format": {
        "type": "triggered_tags",
        "triggers": ["<zz"],
        "tags": [
            {
                "begin": "<a>",
                "content": {"type": "json_schema", "json_schema": {"type": "integer"}},
                "end": "</a>",
            }
        ],
    },
}
_MANY_RULES = "root ::= r0\n" + "\n".join(f'r{i} ::= "x{i}" | "y{i}"' for i in range(40_000))  # 1 MB

CASES: dict[str, tuple[dict[str, Any], Refused | Answered | Either]] = {
    # Deeper than the body's 256 levels: refused while parsing, before any schema work.
    "schema nested 10,000 deep": (
        {"$raw_schema": '{"type":"array","items":' * 10_000 + "{}" + "}" * 10_000},
        Refused("invalid_json", ("256",)),
    ),
    "schema nested 100 deep": (_schema(_nested(100)), Refused("invalid_constraint", ("deeper than 64",))),
    "5 MB schema": (_schema(_BIG_SCHEMA), Refused("invalid_constraint", ("max_constraint_bytes",))),
    "$ref cycle, direct": (
        _schema({"$ref": "#"}),
        Refused("invalid_constraint", ("no finite instance",), pointer=""),
    ),
    "$ref cycle, mutual": (
        _schema({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}),
        Refused("invalid_constraint", ("no finite instance",), pointer="/$defs/a"),
    ),
    "$ref cycle through items, no base case": (
        _schema({"type": "array", "items": {"$ref": "#"}, "minItems": 1}),
        Refused("invalid_constraint", ("no finite instance",)),
    ),
    # Valid: the empty array ends the recursion, so this is a real (recursive) constraint.
    "$ref recursion through items with a base case": (
        _schema(_ITEMS_REF),
        Answered(_valid_json(_ITEMS_REF), "length"),
    ),
    # Valid: 20 properties of 20 alternatives are 20**20 combinations, but a grammar never
    # expands a product, so this compiles in milliseconds.
    "anyOf product": (_schema(_PRODUCT), Answered(_valid_json(_PRODUCT), "length")),
    "minItems 1,000,000,000": (
        _schema({"type": "array", "minItems": 1_000_000_000}),
        Refused("invalid_constraint", ("1,048,576 tokens",), pointer="/minItems"),
    ),
    "minLength above maxLength": (
        _schema({"type": "string", "minLength": 5, "maxLength": 2}),
        Refused("invalid_constraint", ("unsatisfiable",), pointer="/minLength"),
    ),
    # Valid: the backends match with automata, so a pattern catastrophic for a
    # backtracking engine costs nothing.
    "pattern (a+)+$": (
        _schema({"type": "string", "pattern": "(a+)+$"}),
        Answered(_valid_json({"type": "string", "pattern": "(a+)+$"}), "length"),
    ),
    "regex (a|aa)*b": ({"regex": "(a|aa)*b"}, Answered(_matches("(a|aa)*b"), "length")),
    "regex, unclosed group": (
        {"regex": "x(ab"},
        Refused("invalid_constraint", ("unclosed group",), param="regex"),
    ),
    "regex, unclosed class": (
        {"regex": "x[ab"},
        Refused("invalid_constraint", ("unclosed character class",), param="regex"),
    ),
    "regex, unopened group": (
        {"regex": "ab)"},
        Refused("invalid_constraint", ("unopened group",), param="regex"),
    ),
    # Valid: llguidance's Earley parser takes left recursion.
    "EBNF left recursion": ({"ebnf": 'root ::= root "a" | "a"'}, Answered(_matches("a+"), "stop")),
    "EBNF undefined rule": (
        {"ebnf": 'root ::= foo "a"'},
        Refused("invalid_constraint", ("foo",), param="ebnf"),
    ),
    "structural tag whose trigger matches no begin": (
        {"structural_tag": {"structures": [_TRIGGERED], "triggers": ["<zz"]}},
        Refused("invalid_constraint", ("trigger",)),
    ),
    "structural tag (format form) whose trigger matches no begin": (
        {"structural_tag": _FORMAT_TAG},
        Refused("invalid_constraint", ("trigger",)),
    ),
}


#: Cases that need a compile worker and time out there or kill it: run after the others,
#: each tolerant of a worker still restarting from the case before (then the answer is
#: still a 400 by the deadline, "the worker was still starting"), except those that start
#: with every worker ready (:data:`WORKER_CASES`), which show what the worker does.
SLOW_CASES: dict[str, tuple[dict[str, Any], Refused | Answered | Either]] = {
    # 1.3 MB, so llguidance compiles it in a worker, and refuses it there by its lexer
    # limit (named); the fallback, xgrammar, runs out of time.
    "enum of 100,000 strings": (
        _schema({"enum": [f"value-{i}" for i in range(100_000)]}),
        Refused("invalid_constraint", ("too big",)),
    ),
    # Valid but exploding: llguidance intersects allOf's oneOf lists, 8 s on 2 cores, in a
    # killable worker (before the fix: on an in-process thread that nobody could stop).
    "allOf of oneOf, exploding": (
        _schema(_bomb(3, 29)),
        Either(
            Answered(_valid_json(_bomb(3, 29)), "stop"),
            Refused("grammar_compile_timeout", ("longer than",)),
        ),
    ),
    # Valid, with answers of a million characters: llguidance unrolls it for about 1 s (in
    # a killable worker since this fix: on a loaded machine it held a thread over 3 s)
    # and its lexer refuses it (named); the fallback, xgrammar, compiles it in 4-8 s.
    "regex a{1000000}": (
        {"regex": "a{1000000}"},
        # 16 tokens of a million-character answer: cut short.
        Either(
            Answered(_matches("a*"), "length"), Refused(("invalid_constraint", "grammar_compile_timeout"))
        ),
    ),
    # Valid but slow (llguidance: about 15 s on 2 cores): times out, clearly.
    "EBNF of 1 MB": ({"ebnf": _MANY_RULES}, Refused("grammar_compile_timeout")),
}

WORKER_CASES = {"enum of 100,000 strings", "allOf of oneOf, exploding"}


@pytest.fixture(scope="module")
def server(short_timeout_server: RunningServer) -> RunningServer:
    return short_timeout_server


@pytest.fixture(scope="module")
def compile_timeout(server: RunningServer) -> float:
    return float(server.state.engine.compiler.config.timeout_s)


@pytest.fixture(scope="module")
def client(server: RunningServer, compile_timeout: float) -> openai.OpenAI:
    return server.openai(timeout=3 * compile_timeout + 15)


@pytest.fixture(scope="module")
def baseline(server: RunningServer) -> dict[str, Any]:
    """The server's RSS and compile workers before the hostile batch."""
    _simple_request_succeeds(server.openai(), server.state.model_name)
    return {"rss": _rss(), "workers": len(server.state.engine.compiler.worker_pids())}


def _rss() -> int:
    """This process's resident bytes (the server runs in it), after handing freed heap
    back to the system (so what is counted is what is held)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: counted as it is
        pass
    return int(psutil.Process().memory_info().rss)


def _ask(client: openai.OpenAI, model: str, fields: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """``(status, body)``: the completion, or the error object."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 16,
        "seed": 0,
        **fields,
    }
    official = {k: v for k, v in body.items() if k in _OPENAI_FIELDS}
    extra = {k: v for k, v in body.items() if k not in _OPENAI_FIELDS}
    try:
        answer = client.chat.completions.create(**official, extra_body=extra or None)
    except openai.APIStatusError as e:
        assert isinstance(e.body, dict), e
        return e.status_code, e.body
    return 200, answer.model_dump()


def _ask_raw(server: RunningServer, body: bytes, timeout: float) -> tuple[int, dict[str, Any]]:
    with httpx.Client(base_url=server.url, timeout=timeout) as http:
        response = http.post(
            "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
        )
    assert "Traceback" not in response.text
    payload = response.json()
    return response.status_code, payload.get("error", payload)


def _check(status: int, body: dict[str, Any], expected: Refused | Answered | Either) -> None:
    if isinstance(expected, Either):
        _check(status, body, expected.answered if status == 200 else expected.refused)
        return
    if isinstance(expected, Answered):
        assert status == 200, body
        choice = body["choices"][0]
        assert choice["finish_reason"] == expected.finish, choice
        if choice["finish_reason"] == "stop":
            assert expected.valid(choice["message"]["content"]), choice["message"]["content"]
        return
    assert status == expected.status, (status, body)
    assert {"message", "type", "param", "code"} <= set(body), body
    codes = (expected.code,) if isinstance(expected.code, str) else expected.code
    assert body["code"] in codes, body
    for word in expected.words:
        assert word in body["message"], body["message"]
    if expected.pointer is not None:
        assert body.get("pointer") == expected.pointer, body
    if expected.param is not None:
        assert body["param"] == expected.param, body


def _simple_request_succeeds(client: openai.OpenAI, model: str) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    status, body = _ask(client, model, _schema(schema))
    _check(status, body, Answered(_valid_json(schema), "length"))


def _workers_ready(server: RunningServer) -> None:
    """Wait until the llguidance and xgrammar workers run (at once when they do) and the
    compiler's in-process threads are free: a worker that a case before killed at its
    deadline takes seconds to start again on a loaded machine, and a case's checks of a
    megabyte constraint may still hold the thread for large ones; a compile that meets
    either waits in a queue, which is load, whatever its constraint."""
    compiler = server.state.engine.compiler
    compiler.warm_up(("llguidance", "xgrammar"), timeout_s=120.0)
    for large in (False, True):
        free = threading.Event()
        compiler.run_inline(free.set, large=large)
        assert free.wait(120.0), "the compiler's threads stayed busy for two minutes"


def _run_case(
    server: RunningServer, client: openai.OpenAI, timeout: float, case: str, fields: dict[str, Any]
) -> tuple[int, dict[str, Any]]:
    model = server.state.model_name
    start = time.perf_counter()
    if "$raw_schema" in fields:
        text = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], **_schema("$S")})
        raw = text.replace('"$S"', fields["$raw_schema"]).encode()
        status, body = _ask_raw(server, raw, 3 * timeout + 15)
    else:
        status, body = _ask(client, model, fields)
    TIMES[case] = time.perf_counter() - start
    print(f"\n{case}: {status} {body.get('code', '')} in {TIMES[case]:.2f} s")
    return status, body


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_hostile_constraint(
    server: RunningServer, client: openai.OpenAI, compile_timeout: float, baseline: dict[str, Any], case: str
) -> None:
    fields, expected = CASES[case]
    _workers_ready(server)
    _check(*_run_case(server, client, compile_timeout, case, fields), expected)


# ---- lone surrogates, NUL and control characters in every string field ---------------

_FIELDS_WITH_TEXT = {
    "schema key": lambda t: _schema(
        {"type": "object", "properties": {f"a{t}": {"type": "integer"}}, "required": [f"a{t}"]}
    ),
    "schema pattern": lambda t: _schema({"type": "string", "pattern": f"^a{t}b$"}),
    "schema enum": lambda t: _schema({"enum": [f"a{t}", "b"]}),
    "schema name": lambda t: {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": f"n{t}", "schema": {"type": "integer"}},
        }
    },
    "regex": lambda t: {"regex": f"a{t}b"},
    "ebnf string literal": lambda t: {"ebnf": f'root ::= "a{t}b"'},
    "ebnf character class": lambda t: {"ebnf": f'root ::= "a" [^{t}] "b"'},
    "ebnf between rules": lambda t: {"ebnf": f'root ::= "a" "b"{t} "c"'},
    "choice": lambda t: {"choice": [f"a{t}", "b"]},
    # llguidance by name: auto picks xgrammar for structural tags, seconds to compile and
    # load over the 129k vocabulary on a loaded machine; what matters here is the character.
    "structural tag begin": lambda t: {
        "backend": "llguidance",
        "structural_tag": {
            "structures": [{"begin": f"<a{t}>", "schema": {"type": "integer"}, "end": "</a>"}],
            "triggers": ["<a"],
        },
    },
    "stop": lambda t: {"stop": [f"x{t}"]},
    "message": lambda t: {"messages": [{"role": "user", "content": f"h{t}i"}]},
}


#: How each field's seeded answer ends: free text and an integer's digits run to
#: max_tokens, the short constrained answers finish.
_TEXT_FIELD_FINISH = {
    "schema key": "length",
    "schema pattern": "stop",
    "schema enum": "stop",
    "schema name": "length",
    "regex": "stop",
    "ebnf string literal": "stop",
    "ebnf character class": "stop",
    "ebnf between rules": "stop",
    "choice": "stop",
    "structural tag begin": "length",
    "stop": "length",
    "message": "length",
}


@pytest.mark.parametrize("char", ["\x00", "\x01\x1b\x7f"], ids=["NUL", "SOH-ESC-DEL"])
def test_control_characters_in_every_string_field(
    server: RunningServer, client: openai.OpenAI, baseline: dict[str, Any], char: str
) -> None:
    """NUL and control characters are text: where a backend can represent them the
    constraint is enforced (the answer matches it exactly), and where none can (a raw NUL
    inside an EBNF grammar: xgrammar reads C text, llguidance's lexer refuses it) the
    answer is a 400 naming the backends; never a 5xx, never a grammar that silently
    means less than was written."""
    model = server.state.model_name
    validators: dict[str, Callable[[str], bool]] = {
        "schema key": _valid_json(
            {"type": "object", "properties": {f"a{char}": {"type": "integer"}}, "required": [f"a{char}"]}
        ),
        "schema pattern": _valid_json({"type": "string", "pattern": f"^a{char}b$"}),
        "schema enum": lambda text: json.loads(text) in (f"a{char}", "b"),
        "schema name": _valid_json({"type": "integer"}),
        "regex": lambda text: text == f"a{char}b",
        "ebnf string literal": lambda text: text == f"a{char}b",
        "ebnf character class": lambda text: (
            len(text) == 3 and text[0] == "a" and text[2] == "b" and text[1] not in char
        ),
        # Never "ab": xgrammar read grammars up to a raw NUL and dropped the rest.
        "ebnf between rules": lambda text: text == "abc",
        "choice": lambda text: text in (f"a{char}", "b"),
        "structural tag begin": lambda text: True,
        "stop": lambda text: f"x{char}" not in text,
        "message": lambda text: True,
    }
    refused = []
    for name, make in _FIELDS_WITH_TEXT.items():
        _workers_ready(server)
        status, body = _ask(client, model, make(char))
        assert status < 500, (name, body)
        if status == 200:
            _check(status, body, Answered(validators[name], _TEXT_FIELD_FINISH[name]))
        else:
            _check(status, body, Refused(("invalid_constraint", "unsupported_constraint")))
            refused.append(name)
    # What is refused, and only that: a raw NUL in grammar text (xgrammar reads C text,
    # llguidance's lexer refuses one in a literal); control characters between EBNF rules
    # are not grammar syntax at all. Every other field takes every character.
    expected = {"ebnf between rules"} | ({"ebnf string literal"} if char == "\x00" else set())
    assert set(refused) == expected, refused


_SURROGATE_FIELDS = {
    "schema key": (
        b'"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"properties": {"\\ud800": {}}}}}',
        "response_format.json_schema.schema.properties",
    ),
    "schema pattern": (
        b'"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"pattern": "a\\udfff"}}}',
        "response_format.json_schema.schema.pattern",
    ),
    "schema enum": (
        b'"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"enum": ["ok", "\\ud800"]}}}',
        "response_format.json_schema.schema.enum[1]",
    ),
    "regex": (b'"regex": "a\\ud800"', "regex"),
    "ebnf": (b'"ebnf": "root ::= \\"\\ud800\\""', "ebnf"),
    "choice": (b'"choice": ["a", "\\udbff"]', "choice[1]"),
    "message": (b'"messages": [{"role": "user", "content": "h\\ud800i"}]', "messages[0].content"),
}


@pytest.mark.parametrize("field", _SURROGATE_FIELDS, ids=list(_SURROGATE_FIELDS))
def test_lone_surrogates_are_400_naming_the_field(
    server: RunningServer, baseline: dict[str, Any], field: str
) -> None:
    fragment, param = _SURROGATE_FIELDS[field]
    body = b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], %s}' % (
        server.state.model_name.encode(),
        fragment,
    )
    if field == "message":
        body = b'{"model": "%s", %s}' % (server.state.model_name.encode(), fragment)
    status, error = _ask_raw(server, body, 30)
    _check(status, error, Refused("invalid_json", ("lone surrogate",), param=param))


# ---- constraints that need a worker ----------------------------------------------------


@pytest.mark.parametrize("case", SLOW_CASES, ids=list(SLOW_CASES))
def test_hostile_constraint_needing_a_worker(
    server: RunningServer, client: openai.OpenAI, compile_timeout: float, baseline: dict[str, Any], case: str
) -> None:
    fields, expected = SLOW_CASES[case]
    if case in WORKER_CASES:
        _workers_ready(server)
    _check(*_run_case(server, client, compile_timeout, case, fields), expected)


# ---- a valid but slow constraint: a timeout, remembered briefly ------------------------


def test_slow_constraint_times_out_and_is_remembered_only_briefly(
    server: RunningServer, client: openai.OpenAI, compile_timeout: float, baseline: dict[str, Any]
) -> None:
    compiler = server.state.engine.compiler
    clock = compiler.clock  # a ManualClock: the memory expires when this test says
    _workers_ready(server)  # the compile must run, not wait for a worker
    ttl = compiler.config.failure_ttl_s
    # Valid, and slow for xgrammar (over a minute); with the backend named there is no
    # fallback. 1.1 MB: its checks and its transfer to the worker take a while on a
    # loaded machine, and still count as the constraint's own time (only queue waits
    # are load).
    fields = {"backend": "xgrammar", **_schema({"enum": [f"slow-{i}" for i in range(100_000)]})}
    model = server.state.model_name
    status, first = _ask(client, model, fields)
    _check(status, first, Refused("grammar_compile_timeout", (f"longer than {compile_timeout:g} s",)))
    assert first["backend"] == "xgrammar"
    misses = compiler.stats.misses
    clock.advance(ttl * 0.99)
    start = time.perf_counter()
    status, again = _ask(client, model, fields)  # within failure_ttl_s: from memory
    TIMES["slow constraint, repeated"] = time.perf_counter() - start
    assert (status, again) == (400, first)
    assert compiler.stats.misses == misses
    clock.advance(ttl * 0.02)
    status, later = _ask(client, model, fields)  # forgotten: compiled (and timed out) again
    _check(status, later, Refused("grammar_compile_timeout"))
    assert compiler.stats.misses == misses + 1


# ---- afterwards -----------------------------------------------------------------------


def test_healthy_bounded_and_answering_after_the_batch(
    server: RunningServer, baseline: dict[str, Any]
) -> None:
    with server.http() as http:
        assert http.get("/health").status_code == 200
        metrics = http.get("/metrics").text
    assert 'status="500"' not in metrics
    _simple_request_succeeds(server.openai(), server.state.model_name)
    compiler = server.state.engine.compiler
    assert compiler.stats.internal_errors == 0
    # Timed-out workers were replaced, never multiplied (one per backend).
    assert len(compiler.worker_pids()) <= max(baseline["workers"], 3)
    grown = _rss() - baseline["rss"]
    print(
        f"\nRSS grew {grown / 2**20:.0f} MiB over the hostile batch; seconds per case: {json.dumps(TIMES, indent=1)}"
    )
    assert grown < RSS_MARGIN, f"RSS grew {grown / 2**20:.0f} MiB"
