"""The engine on the real embedded model as ``thinkstruct serve`` loads it (int8 weights):
what a user sees first."""

from __future__ import annotations

import json

import jsonschema
import pytest

from thinkstruct import Constraint
from thinkstruct.engine import Engine, EngineConfig, FinishReason, GenerationRequest, SamplingParams
from thinkstruct.parsers import render_chat

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 30},
        "country": {"type": "string", "maxLength": 30},
    },
    "required": ["city", "country"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def smollm2(smollm2_int8_weights):
    return smollm2_int8_weights


@pytest.fixture(scope="module")
def engine(smollm2):
    with Engine(smollm2, config=EngineConfig(max_batch=4)) as e:
        yield e


def chat(model, text: str, *, thinking: bool = False):
    prompt = render_chat(
        [{"role": "user", "content": text}],
        family=model.family,
        tokenizer=model.tokenizer,
        chat_template=model.chat_template,
        chat_template_kwargs={"enable_thinking": thinking},
    )
    return model.tokenizer.hf.encode(prompt.text, add_special_tokens=False), prompt


def test_greedy_answers_the_question(engine, smollm2) -> None:
    ids, _ = chat(smollm2, "What is the capital of France?")
    out = engine.submit(
        GenerationRequest(prompt_ids=ids, sampling=SamplingParams(max_tokens=30, temperature=0))
    ).wait()
    assert out.finish_reason is FinishReason.STOP
    assert "Paris" in out.content


def test_reasoning_then_a_valid_answer(engine, smollm2) -> None:
    ids, prompt = chat(smollm2, "Which city is the capital of Italy? Answer in JSON.", thinking=True)
    grammar = engine.compiler.compile(Constraint.json_schema(SCHEMA))
    out = engine.submit(
        GenerationRequest(
            prompt_ids=ids,
            sampling=SamplingParams(max_tokens=120, temperature=0.6, seed=3),
            grammar=grammar,
            reasoning=prompt.reasoning_enabled,
            reasoning_parser=prompt.reasoning_parser(),
            max_reasoning_tokens=40,
        )
    ).wait()
    assert out.finish_reason is FinishReason.STOP, out
    jsonschema.validate(json.loads(out.content), SCHEMA)
    assert out.reasoning and "<think>" not in out.content and "</think>" not in out.content
    assert 0 < out.usage.reasoning_tokens <= 40 + 3  # the budget, then the end tag's tokens


def test_a_seed_gives_the_same_answer_in_any_batch(engine, smollm2) -> None:
    """With int8 weights on the compiled kernels every token is computed from its own
    row alone, and the engine cuts every prompt at the same places whatever else is
    prefilling, so a request's tokens depend on its own prompt and seed only. (Not so
    in bfloat16 or float32 through torch: their matrix multiplies pick kernels by shape,
    measured on an AVX-512 CPU.)"""
    ids, _ = chat(smollm2, "Tell me a fact about the moon.")
    params = SamplingParams(max_tokens=40, temperature=0.8, top_p=0.95, seed=77)
    alone = engine.submit(GenerationRequest(prompt_ids=ids, sampling=params)).wait()
    others = [
        engine.submit(
            GenerationRequest(prompt_ids=chat(smollm2, q)[0], sampling=SamplingParams(max_tokens=60, seed=i))
        )
        for i, q in enumerate(["Write a haiku about rain.", "List three fruits.", "Explain gravity briefly."])
    ]
    together = engine.submit(GenerationRequest(prompt_ids=ids, sampling=params)).wait()
    for h in others:
        h.wait()
    assert smollm2.quantize == "int8-weights"
    assert together.token_ids == alone.token_ids
