"""Speculative decoding from n-gram drafts: the drafter alone (hypothesis), the runner's
logits of several positions a row, and the engine: the same tokens with and without
speculation (greedy, seeded sampling, under a grammar), with drafts accepted."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from thinkstruct import Constraint
from thinkstruct.engine import Engine, EngineConfig, GenerationRequest, SamplingParams, load_model
from thinkstruct.engine.speculation import NgramDrafter, SpeculationConfig

CONFIG = SpeculationConfig(max_draft=5, min_ngram=2, max_ngram=3)


@given(context=st.lists(st.integers(0, 3), max_size=40), limit=st.integers(0, 8))
@settings(max_examples=200, deadline=None)
def test_a_draft_is_what_followed_the_suffix_the_last_time(context: list[int], limit: int) -> None:
    draft = NgramDrafter(context, CONFIG).propose(limit)
    assert len(draft) <= min(limit, CONFIG.max_draft)
    if not draft:
        return
    # Some n-gram suffix occurred earlier, ending at e, and the draft is what came after it.
    matches = [
        e
        for n in range(CONFIG.max_ngram, CONFIG.min_ngram - 1, -1)
        for e in range(n, len(context))
        if context[e - n : e] == context[len(context) - n :]
    ]
    assert any(context[e : e + len(draft)] == draft for e in matches)


def test_the_drafter_grows_with_the_answer_and_backs_off_when_refused() -> None:
    drafter = NgramDrafter(
        [1, 2, 3, 4, 9], SpeculationConfig(max_draft=2, min_acceptance=0.5, backoff_steps=3)
    )
    assert drafter.propose(8) == []
    drafter.extend([1, 2])
    assert drafter.propose(8) == [3, 4]  # "1 2" was followed by "3 4"
    for _ in range(4):
        drafter.record(2, 0)  # nothing kept: poor acceptance
    assert [drafter.propose(8) for _ in range(4)] == [[], [], [], [3, 4]]


# ---- the runner: logits of a row's last tokens -----------------------------------------


@pytest.fixture(scope="module")
def int8w(tiny_model_dir: Any) -> Any:
    return load_model(tiny_model_dir, quantize="int8-weights", progress=False)


def test_tail_logits_are_the_bits_of_feeding_one_token_at_a_time(int8w: Any) -> None:
    from thinkstruct.engine.engine import default_runner

    def runner() -> Any:
        r = default_runner(int8w.model, slots=2, context_length=256, vocab_size=int8w.tokenizer.vocab_size)
        assert r.batch_invariant
        return r

    prompt, more = [5, 6, 7, 8, 9, 10], [11, 12, 13, 14]
    together = runner()
    together.forward(0, [prompt, [3, 4]], [0, 0])
    tails = together.forward(0, [more, [2]], [len(prompt), 2], tail=[4, 1])
    alone = runner()
    alone.forward(0, [prompt], [0])
    steps = [alone.forward(0, [[t]], [len(prompt) + k]) for k, t in enumerate(more)]
    assert tails.shape[0] == 5
    assert torch.equal(tails[:4], torch.cat(steps))
    with pytest.raises(ValueError, match="tail"):
        together.forward(0, [[1], [2]], [20, 3], tail=[2, 1])


# ---- the engine -------------------------------------------------------------------------


def _answers(
    model: Any, requests: list[GenerationRequest], *, speculate: bool
) -> tuple[list[list[int]], Any]:
    config = EngineConfig(
        max_batch=4, speculation=SpeculationConfig() if speculate else None, prefix_cache_bytes=0
    )
    with Engine(model, config=config) as e:
        outs = [e.submit(r).wait() for r in requests]
        return [o.token_ids for o in outs], e.stats


def test_the_same_tokens_with_and_without_speculation(int8w: Any) -> None:
    """A random tiny model repeats itself, so n-gram drafts are often right: greedy, seeded
    sampling and a grammar give the very tokens they give without drafts."""
    ids = list(int8w.tokenizer.encode("copy this: alpha beta gamma delta, alpha beta gamma delta"))
    grammar = Engine(int8w).compiler.compile(Constraint.regex("[a-z ]{20,60}"))
    requests = [
        GenerationRequest(prompt_ids=ids, sampling=SamplingParams(max_tokens=48, temperature=0.0)),
        *(
            GenerationRequest(
                prompt_ids=ids, sampling=SamplingParams(max_tokens=40, temperature=1.0, seed=seed)
            )
            for seed in range(3)
        ),
        GenerationRequest(
            prompt_ids=ids, sampling=SamplingParams(max_tokens=40, temperature=0.0), grammar=grammar
        ),
    ]
    plain, _ = _answers(int8w, requests, speculate=False)
    drafted, stats = _answers(int8w, requests, speculate=True)
    assert drafted == plain
    assert stats.draft_tokens > 0 and stats.accepted_draft_tokens > 0
    assert stats.steps < sum(len(t) for t in plain)  # some steps kept several tokens
