"""Each checked keyword on the embedded model at temperature 1: a schema and prompt where
sampling held only by the grammar is likely to break the keyword, six seeds. Every answer
that finishes is valid, the keyword was checked (not the grammar's), and values were
taken back (rollbacks > 0); an answer out of tries ends with an error naming the keyword.
Where ``auto``'s backend enforces a keyword exactly, the backend that does not (xgrammar,
asked for by name) is the one under test."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from thinkstruct import Constraint
from thinkstruct.engine import Engine, EngineConfig, FinishReason, GenerationRequest, SamplingParams
from thinkstruct.grammar.service.compiler import GrammarCompiler


def _object(properties: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties),
            "additionalProperties": False, **more}  # fmt: skip


# keyword: (schema, prompt, backend)
CASES: dict[str, tuple[dict[str, Any], str, str]] = {
    "not": (
        _object({"colour": {"type": "string", "maxLength": 8, "not": {"enum": ["red", "Red", "RED"]}}}),
        "Give JSON. The colour is red.",
        "auto",
    ),
    "oneOf": (
        _object(
            {
                "x": {
                    "oneOf": [
                        {"type": "integer", "minimum": 0, "maximum": 50},
                        {"type": "integer", "minimum": 10, "maximum": 99},
                    ]
                }
            }
        ),
        "Give JSON. x is 20.",
        "auto",
    ),
    "if": (
        _object(
            {"kind": {"enum": ["cat", "dog"]}, "legs": {"type": "integer", "minimum": 0, "maximum": 9}},
            **{
                "if": {"properties": {"kind": {"const": "cat"}}},
                "then": {"properties": {"legs": {"const": 3}}},
            },
        ),
        "Give JSON: a cat with 4 legs.",
        "auto",
    ),
    "minContains": (
        {
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": 9},
            "minItems": 3,
            "maxItems": 3,
            "contains": {"const": 5},
            "minContains": 2,
        },
        "Give a JSON array of 3 digits: 1, 2, 3.",
        "auto",
    ),
    "propertyNames": (
        {
            "type": "object",
            "additionalProperties": {"type": "integer"},
            "propertyNames": {"pattern": "^[a-z]+$"},
            "minProperties": 1,
            "maxProperties": 2,
        },
        "Give JSON: Apples 3, Pears 4.",
        "auto",
    ),
    "unevaluatedProperties": (
        {
            "type": "object",
            "allOf": [{"properties": {"a": {"type": "integer"}}}],
            "unevaluatedProperties": False,
            "required": ["a"],
        },
        "Give JSON with a=1 and b=2.",
        "auto",
    ),
    "multipleOf": (
        _object({"price": {"type": "number", "multipleOf": 0.25, "minimum": 0, "maximum": 10}}),
        "Give JSON. The price is 3.14.",
        "xgrammar",
    ),
    "format": (
        _object({"day": {"type": "string", "format": "date"}}),
        "Give JSON. The day is 2024-02-31, the 31st of February.",
        "xgrammar",
    ),
}


@pytest.fixture(scope="module")
def compiler(smollm2):
    with GrammarCompiler(smollm2.tokenizer) as c:
        yield c


@pytest.fixture(scope="module")
def engine(smollm2, compiler):
    with Engine(smollm2, config=EngineConfig(max_batch=6), compiler=compiler) as e:
        yield e


@pytest.mark.parametrize("keyword", list(CASES))
def test_only_valid_answers_and_values_were_taken_back(keyword: str, smollm2, compiler, engine) -> None:
    schema, prompt, backend = CASES[keyword]
    grammar = compiler.compile(Constraint.json_schema(schema), backend=backend, strict=True)
    assert keyword in {e.keyword for e in grammar.enforcement() if e.enforcement == "checked"}
    ids = smollm2.tokenizer.encode(prompt)
    handles = [
        engine.submit(
            GenerationRequest(
                prompt_ids=ids,
                sampling=SamplingParams(max_tokens=48, temperature=1.0, seed=seed),
                grammar=grammar,
            )
        )
        for seed in range(6)
    ]
    outs = [h.wait() for h in handles]
    for out in outs:
        if out.finish_reason is FinishReason.STOP:
            jsonschema.validate(json.loads(out.content), schema, format_checker=jsonschema.FormatChecker())
        elif out.finish_reason is FinishReason.ERROR:
            assert "(schema /" in (out.error or ""), out.error  # names the keyword's place
    assert sum(o.usage.check_rollbacks for o in outs if o.usage is not None) > 0
    assert any(o.finish_reason is FinishReason.STOP for o in outs)
