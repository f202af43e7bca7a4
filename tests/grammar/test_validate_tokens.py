"""validate_tokens(ids) answers what accept_tokens would, and changes nothing (hypothesis)."""

from __future__ import annotations

import json

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from thinkstruct import Constraint, Tokenizer
from thinkstruct.grammar.runtime.bitmask import allocate_bitmask

from .conftest import BACKENDS, PERSON_SCHEMA, compiled

ANSWER = {"name": "Ada </think>", "age": 36, "tags": ["math", "a b"]}


def _mask(g, vocab_size: int) -> torch.Tensor:
    bm = allocate_bitmask(1, vocab_size)
    g.fill_bitmask(bm, 0)
    return bm


def _script(tok: Tokenizer, reasoning: bool) -> list[int]:
    answer = tok.encode(json.dumps(ANSWER, separators=(",", ":"))) + [tok.eos_token_ids[0]]
    if not reasoning:
        return answer
    return tok.encode("<think>hm, </thi no") + tok.encode(tok.think_end_text) + answer


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    backend=st.sampled_from(BACKENDS),
    reasoning=st.booleans(),
    budget=st.sampled_from([None, 3]),
    data=st.data(),
)
def test_validate_matches_accept_and_rollback(
    tokenizer: Tokenizer, backend: str, reasoning: bool, budget: int | None, data: st.DataObject
) -> None:
    cg = compiled(backend, Constraint.json_schema(PERSON_SCHEMA))
    script = _script(tokenizer, reasoning)
    prefix = data.draw(st.integers(0, len(script) - 1), label="prefix")
    # A draft: the script's continuation, cut short and with one token replaced by any
    # id (a stop token, a special token, a random one) somewhere.
    draft = list(script[prefix : prefix + data.draw(st.integers(0, 40), label="length")])
    if draft and data.draw(st.booleans(), label="perturb"):
        where = data.draw(st.integers(0, len(draft) - 1), label="where")
        draft[where] = data.draw(
            st.one_of(
                st.sampled_from([*tokenizer.eos_token_ids, *tokenizer.think_end_ids, 0]),
                st.integers(0, tokenizer.vocab_size - 1),
            ),
            label="token",
        )

    def fresh():
        g = cg.matcher(reasoning=reasoning, max_reasoning_tokens=budget)
        accepted = g.accept_tokens(script[:prefix])
        return g, accepted

    g, accepted = fresh()
    reference, same = fresh()
    assert accepted == same
    before = _mask(g, tokenizer.vocab_size)
    n = g.validate_tokens(draft)
    assert n == reference.accept_tokens(draft)
    # Nothing changed: the same mask, and the draft is accepted as far as validated.
    assert torch.equal(_mask(g, tokenizer.vocab_size), before)
    assert not g.is_terminated() or accepted == len(script)
    assert g.accept_tokens(draft) == n


def test_validate_after_the_stop_token_accepts_nothing(tokenizer: Tokenizer, backend: str) -> None:
    cg = compiled(backend, Constraint.regex("(yes|no)"))
    g = cg.matcher()
    ids = tokenizer.encode("yes")
    eos = tokenizer.eos_token_ids[0]
    assert g.validate_tokens([*ids, eos, ids[0]]) == len(ids) + 1
    assert g.validate_tokens([eos]) == 0  # not before the answer is complete
    assert g.accept_tokens([*ids, eos]) == len(ids) + 1
    assert g.validate_tokens(ids) == 0
