"""What travels to a replica lets it compile the same grammar: a grammar from ``auto``'s
fallbacks (checked or ignored keywords) travels as ``auto`` with its strictness."""

from __future__ import annotations

import pytest

from thinkstruct import Constraint, Tokenizer
from thinkstruct.engine import GenerationRequest
from thinkstruct.grammar.service.compiler import CompilerConfig, GrammarCompiler
from thinkstruct.server.cluster.wire import WireRequest

UNIQUE = Constraint.json_schema(
    {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
    }
)
PLAIN = Constraint.json_schema({"type": "object", "properties": {"a": {"type": "integer"}}})


@pytest.mark.parametrize(("constraint", "strict"), [(UNIQUE, True), (UNIQUE, False), (PLAIN, True)])
def test_a_replica_compiles_the_ingress_grammar_again(constraint: Constraint, strict: bool) -> None:
    with GrammarCompiler(Tokenizer.default(), CompilerConfig(worker_processes=0)) as compiler:
        ingress = compiler.compile(constraint, strict=strict)
        spec = WireRequest.of(GenerationRequest(prompt_ids=[1]), ingress).grammar
        assert spec is not None
        replica = compiler.compile(spec.constraint, backend=spec.backend, strict=spec.strict)
    assert replica.backend == ingress.backend
    assert replica.ignored_keywords == ingress.ignored_keywords
    assert (replica.checks is None) == (ingress.checks is None)
    assert replica.enforcement() == ingress.enforcement()


def test_a_named_backends_checked_grammar_travels_under_its_name() -> None:
    schema = {"type": "object", "properties": {"price": {"type": "number", "multipleOf": 0.25}}}
    with GrammarCompiler(Tokenizer.default(), CompilerConfig(worker_processes=0)) as compiler:
        ingress = compiler.compile(Constraint.json_schema(schema), backend="xgrammar", strict=True)
        spec = WireRequest.of(GenerationRequest(prompt_ids=[1]), ingress).grammar
        assert spec is not None and spec.backend == "xgrammar"
        replica = compiler.compile(spec.constraint, backend=spec.backend, strict=spec.strict)
    assert replica.backend == "xgrammar" and replica.checks is not None
    assert replica.enforcement() == ingress.enforcement()
