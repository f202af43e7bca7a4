from __future__ import annotations

import functools

import pytest
import torch

from thinkstruct import CompiledGrammar, Constraint, InvalidGrammar, Tokenizer
from thinkstruct.grammar.api import get_backend
from thinkstruct.grammar.runtime.bitmask import allocate_bitmask
from thinkstruct.grammar.runtime.matcher import GrammarMatcher

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
    """Compile once per test session (compiles over the 129k vocabulary take up to ~1 s),
    with the backend itself in this process: no time limit (outlines-core needs tens of
    seconds for ``json_object``) and no worker processes."""
    result = get_backend(Tokenizer.default(), backend).compile(constraint)
    if isinstance(result, InvalidGrammar):
        raise result.error
    return result


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def person(backend: str) -> CompiledGrammar:
    return compiled(backend, Constraint.json_schema(PERSON_SCHEMA))


def mask_of(matcher: GrammarMatcher, vocab_size: int) -> torch.Tensor:
    """A fresh one-row bitmask filled by ``matcher``."""
    bm = allocate_bitmask(1, vocab_size)
    matcher.fill_bitmask(bm, 0)
    return bm
