"""Each checked keyword on the embedded model at temperature 1: a schema and prompt where
sampling held only by the grammar is likely to break the keyword, six seeds (the cases
of ``benchmarks/checked_cases.py``, whose sweep runs 30). Every answer that finishes is
valid, none runs out of tries, the keyword was checked (not the grammar's), and values
were taken back (rollbacks > 0).
Where ``auto``'s backend enforces a keyword exactly, the backend that does not (xgrammar,
asked for by name) is the one under test."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from thinkstruct import Constraint
from thinkstruct.engine import Engine, EngineConfig, FinishReason, GenerationRequest, SamplingParams
from thinkstruct.grammar.service.compiler import GrammarCompiler

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from checked_cases import KEYWORD_CASES, SEVENS, schema_question, valid  # the benchmark's cases


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf):
    """The embedded model as the server runs it by default (its GGUF's blocks)."""
    return smollm2_gguf


@pytest.fixture(scope="module")
def compiler(smollm2):
    with GrammarCompiler(smollm2.tokenizer) as c:
        yield c


@pytest.fixture(scope="module")
def engine(smollm2, compiler):
    with Engine(smollm2, config=EngineConfig(max_batch=6), compiler=compiler) as e:
        yield e


def _outs(engine, grammar, ids: list[int], seeds: range, *, max_tokens: int) -> list:
    handles = [
        engine.submit(
            GenerationRequest(
                prompt_ids=ids,
                sampling=SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed),
                grammar=grammar,
            )
        )
        for seed in seeds
    ]
    return [h.wait() for h in handles]


@pytest.mark.parametrize("keyword", list(KEYWORD_CASES))
def test_only_valid_answers_and_values_were_taken_back(keyword: str, smollm2, compiler, engine) -> None:
    case = KEYWORD_CASES[keyword]
    grammar = compiler.compile(Constraint.json_schema(case.schema), backend=case.backend, strict=True)
    assert keyword in {e.keyword for e in grammar.enforcement() if e.enforcement == "checked"}
    outs = _outs(engine, grammar, smollm2.tokenizer.encode(case.prompt), range(6), max_tokens=case.max_tokens)
    for out in outs:
        assert out.finish_reason is not FinishReason.ERROR, out.error  # never out of tries
        if out.finish_reason is FinishReason.STOP:
            assert valid(case.schema, out.content), out.content
    assert sum(o.usage.check_rollbacks for o in outs if o.usage is not None) > 0
    assert any(o.finish_reason is FinishReason.STOP for o in outs)


def test_at_least_two_sevens_asked_through_the_chat_template(smollm2, compiler, engine) -> None:
    """Two to four digits, at least two of them 7, the schema in the question, thinking
    off: an array that cannot make up its 7s in the items left is mended at the item (only
    a 7 may be drawn there), and one closed too early at its bracket."""
    from thinkstruct.parsers import render_chat

    grammar = compiler.compile(Constraint.json_schema(SEVENS), strict=True)
    prompt = render_chat(
        [{"role": "user", "content": schema_question(SEVENS)}],
        family=smollm2.family,
        tokenizer=smollm2.tokenizer,
        chat_template=smollm2.chat_template,
        chat_template_kwargs={"enable_thinking": False},
    )
    ids = smollm2.tokenizer.hf.encode(prompt.text, add_special_tokens=False)
    outs = _outs(engine, grammar, ids, range(4), max_tokens=200)
    assert [o.finish_reason for o in outs] == [FinishReason.STOP] * 4
    assert all(valid(SEVENS, o.content) for o in outs), [o.content for o in outs]
    assert sum(o.usage.check_rollbacks for o in outs if o.usage is not None) > 0
