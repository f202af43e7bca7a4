from __future__ import annotations

import functools

import pytest

import thinkstruct
from thinkstruct import CompiledGrammar, Constraint, Tokenizer

BACKENDS = ("xgrammar", "llguidance", "outlines")

PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}


@functools.cache
def compiled(backend: str, constraint: Constraint) -> CompiledGrammar:
    """Compile once per test session (compiles over the 129k vocabulary take up to ~1 s)."""
    return thinkstruct.compile(constraint, Tokenizer.default(), backend)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def person(backend: str) -> CompiledGrammar:
    return compiled(backend, Constraint.json_schema(PERSON_SCHEMA))
