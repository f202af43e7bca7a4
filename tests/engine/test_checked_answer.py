"""Checked keywords in the engine: a value that breaks a keyword no grammar enforces is
taken back and drawn again before anyone sees it; out of tries, the request ends with an
error naming the keyword and the JSON pointer."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from thinkstruct import Constraint
from thinkstruct.engine import Engine, EngineConfig, FinishReason, GenerationRequest, SamplingParams
from thinkstruct.grammar.service.compiler import GrammarCompiler

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from checked_cases import UNIQUE as UNIQUE_CASE  # the benchmark's cases
from checked_cases import UNMEETABLE, valid

UNIQUE = UNIQUE_CASE.schema


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf):
    """The embedded model as the server runs it by default (its GGUF's blocks)."""
    return smollm2_gguf


@pytest.fixture(scope="module")
def compiler(smollm2):
    with GrammarCompiler(smollm2.tokenizer) as c:
        yield c


def _run_seeds(
    model, compiler, ids: list[int], seeds: int, *, max_tokens: int, parser=None, **fields
) -> list:
    """``seeds`` requests at temperature 1 (seeds 0..), batched, their whole outputs
    (``parser``: makes each one's reasoning parser)."""
    with Engine(model, config=EngineConfig(max_batch=4), compiler=compiler) as engine:
        handles = [
            engine.submit(
                GenerationRequest(
                    prompt_ids=ids,
                    sampling=SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed),
                    reasoning_parser=None if parser is None else parser(),
                    **fields,
                )
            )
            for seed in range(seeds)
        ]
        return [h.wait() for h in handles]


def test_unique_items_over_a_small_enum_only_valid_answers_come_back(smollm2, compiler) -> None:
    grammar = compiler.compile(Constraint.json_schema(UNIQUE), strict=True)
    assert grammar.checks is not None  # uniqueItems is checked, not held by the grammar
    ids = smollm2.tokenizer.encode(UNIQUE_CASE.prompt)
    rollbacks = 0
    outs = _run_seeds(smollm2, compiler, ids, 6, max_tokens=UNIQUE_CASE.max_tokens, grammar=grammar)
    for out in outs:
        assert out.usage is not None
        rollbacks += out.usage.check_rollbacks
        assert out.finish_reason is FinishReason.STOP, out.error  # never out of tries
        assert valid(UNIQUE, out.content), out.content  # streamed text is the final text
    assert rollbacks > 0


def test_a_keyword_no_answer_can_meet_ends_with_the_keyword_and_pointer(smollm2, compiler) -> None:
    grammar = compiler.compile(Constraint.json_schema(UNMEETABLE.schema), strict=True)
    ids = smollm2.tokenizer.encode(UNMEETABLE.prompt)
    with Engine(smollm2, config=EngineConfig(max_batch=2), compiler=compiler) as engine:
        out = engine.submit(
            GenerationRequest(
                prompt_ids=ids,
                sampling=SamplingParams(max_tokens=UNMEETABLE.max_tokens, seed=1),
                grammar=grammar,
            )
        ).wait()
        unmet = dict(engine.stats.checks_unmet)
    assert out.finish_reason is FinishReason.ERROR
    assert "uniqueItems" in (out.error or "") and "/tags" in (out.error or ""), out.error
    assert out.unmet is not None and (out.unmet.keyword, out.unmet.pointer) == ("uniqueItems", "/tags")
    assert unmet == {"uniqueItems": 1}
    assert '"x"' not in out.content  # the value that failed was never sent


def test_the_thought_is_never_checked_nor_taken_back(smollm2, compiler) -> None:
    """A thought before a checked answer: it streams as it comes (never held), keeps its
    budget's length, and rollbacks stay inside the answer."""
    from thinkstruct.parsers import render_chat

    prompt = render_chat(
        [{"role": "user", "content": "Think, then give JSON. Colors: red, red, red."}],
        family=smollm2.family,
        tokenizer=smollm2.tokenizer,
        chat_template=smollm2.chat_template,
        chat_template_kwargs={"enable_thinking": True},
    )
    assert prompt.reasoning_enabled
    ids = smollm2.tokenizer.hf.encode(prompt.text, add_special_tokens=False)
    grammar = compiler.compile(Constraint.json_schema(UNIQUE), strict=True)
    outs = _run_seeds(
        smollm2,
        compiler,
        ids,
        4,
        max_tokens=120,
        grammar=grammar,
        reasoning=True,
        parser=prompt.reasoning_parser,
        max_reasoning_tokens=10,
    )
    assert sum(o.usage.check_rollbacks for o in outs if o.usage) > 0
    for out in outs:
        assert out.usage is not None and out.reasoning
        assert out.usage.reasoning_tokens >= 10  # the budget, then the end tag: all thought
        if out.finish_reason is FinishReason.STOP:
            assert valid(UNIQUE, out.content), out.content


def test_a_failed_string_is_drawn_again_from_its_first_word_not_its_quote(smollm2, compiler) -> None:
    """``not: {const: "red"}``: the failed value's first drawn token is ``' "'``, which
    every string opens with; banning it would leave only whitespace there and spend the
    tries (seen in tool-call arguments: 5 of 6 seeds ended in the check's error). The
    retry keeps the quote and bans ``red`` after it."""
    from thinkstruct.engine.output.checked_answer import CheckedAnswer
    from thinkstruct.engine.output.detokenizer import TokenTexts

    schema = {"type": "object", "properties": {"colour": {"type": "string", "not": {"const": "red"}}},
              "required": ["colour"], "additionalProperties": False}  # fmt: skip
    grammar = compiler.compile(Constraint.json_schema(schema), strict=True)
    assert grammar.checks is not None
    tokenizer = smollm2.tokenizer
    pieces = ['{"', "colour", '":', ' "', "red", '"}']  # how SmolLM2 wrote it at seed 5
    ids = [tokenizer.encode(p) for p in pieces]
    assert all(len(i) == 1 for i in ids), ids
    answer = CheckedAnswer(
        grammar.checks, texts=TokenTexts(tokenizer), end_tag=None, thinking=False, stop_ids=frozenset()
    )
    settled = [answer.settle(i, forced=0, logprob=None, allowed=10) for i in ids]
    assert all(s.undo is None for s in settled[:-1])
    undo = settled[-1].undo
    assert undo is not None and undo.possible
    assert undo.banned == {tokenizer.encode("red")[0]}  # not a const: no other token fails the same way
    assert undo.tokens == 2  # 'red' and '"}' go; ' "' stays
