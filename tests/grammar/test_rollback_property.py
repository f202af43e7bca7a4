"""rollback(k) undoes exactly k accepts, for every backend (hypothesis)."""

from __future__ import annotations

import json

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from thinkstruct import Constraint, Tokenizer

from .conftest import BACKENDS, PERSON_SCHEMA, compiled, mask_of

ANSWERS = [
    {"name": "Ada", "age": 36, "tags": ["math", "poetry"]},
    {"name": "Grace Hopper", "age": 85, "tags": []},
    {"name": "</think> <｜end▁of▁sentence｜>", "age": -1, "tags": ["a b", "c\nd"]},
]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    backend=st.sampled_from(BACKENDS),
    answer=st.sampled_from(ANSWERS),
    spaced=st.booleans(),
    data=st.data(),
)
def test_rollback_restores_mask_and_acceptance(
    tokenizer: Tokenizer, backend: str, answer: dict, spaced: bool, data: st.DataObject
) -> None:
    text = json.dumps(answer, ensure_ascii=False, separators=(", ", ": ") if spaced else (",", ":"))
    ids = tokenizer.encode(text) + [tokenizer.eos_token_ids[0]]
    cg = compiled(backend, Constraint.json_schema(PERSON_SCHEMA))
    prefix = data.draw(st.integers(0, len(ids) - 1), label="prefix")
    k = data.draw(st.integers(0, len(ids) - prefix), label="k")

    g = cg.matcher()
    assert g.accept_tokens(ids[:prefix]) == prefix
    before = mask_of(g, tokenizer.vocab_size)
    assert g.accept_tokens(ids[prefix : prefix + k]) == k
    g.rollback(k)
    assert not g.is_terminated()
    assert g.at_answer_start() == (prefix == 0)
    assert torch.equal(mask_of(g, tokenizer.vocab_size), before)
    # The rest is accepted exactly as by a matcher that never rolled back.
    assert g.accept_tokens(ids[prefix:]) == len(ids) - prefix
    assert g.is_terminated()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(backend=st.sampled_from(BACKENDS), steps=st.lists(st.integers(0, 6), min_size=1, max_size=8))
def test_interleaved_accepts_and_rollbacks_match_a_fresh_walk(
    tokenizer: Tokenizer, backend: str, steps: list[int]
) -> None:
    ids = tokenizer.encode(json.dumps(ANSWERS[0], separators=(",", ":")))
    cg = compiled(backend, Constraint.json_schema(PERSON_SCHEMA))
    g = cg.matcher()
    position = 0
    for i, n in enumerate(steps):
        if i % 2 == 0:  # accept up to n tokens
            n = min(n, len(ids) - position)
            assert g.accept_tokens(ids[position : position + n]) == n
            position += n
        else:  # roll back up to n tokens
            n = min(n, position)
            g.rollback(n)
            position -= n
    reference = cg.matcher()
    reference.accept_tokens(ids[:position])
    assert torch.equal(mask_of(g, tokenizer.vocab_size), mask_of(reference, tokenizer.vocab_size))
