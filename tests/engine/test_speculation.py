"""Speculative decoding from n-gram drafts: the drafter alone (hypothesis), the runner's
logits of several positions a row, and the engine: the same tokens with and without
speculation (greedy, seeded sampling, under a grammar), with drafts accepted."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from thinkstruct import Constraint
from thinkstruct.engine import Engine, EngineConfig, GenerationRequest, SamplingParams, load_model
from thinkstruct.engine.sampling.speculation import (
    DraftRecord,
    NgramDrafter,
    PassCosts,
    SpeculationConfig,
    draft_lengths,
    pass_cost,
)
from thinkstruct.grammar.runtime.matcher import GrammarMatcher

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


def test_the_drafter_grows_with_the_answer_and_learns_its_odds() -> None:
    drafter = NgramDrafter([1, 2, 3, 4, 9], SpeculationConfig(max_draft=2, min_ngram=2))
    assert drafter.propose(8) == []
    drafter.extend([1, 2])
    assert drafter.propose(8) == [3, 4]  # "1 2" was followed by "3 4"
    before = drafter.odds()
    for _ in range(6):
        drafter.propose(8)
        drafter.record(2, 0)  # the first token refused every time
    after = drafter.odds()
    assert after[0] < before[0] / 2 and after[1] == before[1]  # the second was never checked


def test_a_new_request_drafts_by_how_the_engine_s_recent_drafts_fared() -> None:
    """Free rows' one-token matches refused nine times in ten across earlier requests: a
    new request's drafter no longer drafts them (they cost more than they give), while a
    row under a grammar, whose record is its own, still does."""
    config = SpeculationConfig(max_draft=1, min_ngram=1, max_ngram=1, free_positions=1.0, position_cost=0.2)
    shared = DraftRecord(config)

    def one_token_draft(constrained: bool) -> int:
        drafter = NgramDrafter([7, 8, 7], config, shared=shared)
        draft = drafter.propose(4, _Script([None] * 8) if constrained else None)
        assert draft == [8]  # "7" was followed by "8"
        return draft_lengths([drafter.odds()], positions=1, rows=1, config=config)[0]

    assert one_token_draft(False) == 1 and one_token_draft(True) == 1  # the prior: 0.3
    for _ in range(20):  # short requests: ten checked draft tokens each
        earlier = NgramDrafter([7, 8, 7], config, shared=shared)
        for k in range(10):
            earlier.propose(4)
            earlier.record(1, int(k == 0))
    assert one_token_draft(False) == 0
    assert one_token_draft(True) == 1


def test_the_engine_record_follows_the_recent_requests() -> None:
    config = SpeculationConfig()
    record = DraftRecord(config, window=100)
    assert record.odds(0, constrained=False) == pytest.approx(config.prior[0])
    for _ in range(300):
        record.record(0, False, constrained=False)
    assert record.odds(0, constrained=False) < 0.05
    for _ in range(300):  # the workload changed: counts halved past the window
        record.record(0, True, constrained=False)
    assert record.odds(0, constrained=False) > 0.8
    assert record.odds(0, constrained=True) == pytest.approx(config.prior[0])
    with pytest.raises(ValueError, match="window"):
        DraftRecord(config, window=0)


class _Script(GrammarMatcher):
    """A grammar over a script of positions: each allows a set of tokens (``None``: any);
    a position that allows one token forces it."""

    def __init__(self, script: list[set[int] | None]) -> None:
        self.script, self.at = script, 0

    def accept_token(self, token_id: int) -> bool:
        allowed = self.script[self.at] if self.at < len(self.script) else set()
        if allowed is not None and token_id not in allowed:
            return False
        self.at += 1
        return True

    def rollback(self, num_tokens: int) -> None:
        self.at -= num_tokens

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        raise NotImplementedError

    def is_terminated(self) -> bool:
        return False

    def jump_forward(self) -> list[int]:
        forced = []
        for allowed in self.script[self.at :]:
            if allowed is None or len(allowed) != 1:
                break
            forced.append(next(iter(allowed)))
        return forced

    def copy(self) -> GrammarMatcher:
        return _Script(self.script)


def test_a_draft_goes_through_the_grammar() -> None:
    """Cut where the grammar refuses, its forced tokens spliced in (odds 1), the lookup
    going on after them, the matcher left where it was."""
    config = SpeculationConfig(max_draft=8, after_forced=0)
    drafter = NgramDrafter([5, 1, 2, 3, 9, 9, 7, 8, 4, 6, 1, 2], config)
    grammar = _Script([{3, 4}, {7}, {8}, None, None, {0, 99}])
    # "1 2" was followed by "3 9 9 ...": 3 is allowed, then the grammar forces 7 8 (not 9
    # 9), after "7 8" came "4 6", and the grammar refuses the 1 after them.
    assert drafter.propose(8, grammar) == [3, 7, 8, 4, 6]
    odds = drafter.odds()
    assert odds[1:3] == [1.0, 1.0] and all(0 < p < 1 for p in (odds[0], *odds[3:]))
    assert grammar.at == 0
    assert drafter.propose(3, grammar) == [3, 7, 8]
    assert drafter.propose(8, grammar, stop_ids={4}) == [3, 7, 8]


def test_after_a_forced_run_the_draft_takes_what_the_row_took_last_time() -> None:
    """A JSON key is forced, the ``": "`` after it is not: the row's tokens after its last
    forced run are drafted where the lookup has nothing the grammar allows."""
    drafter = NgramDrafter([50, 51], SpeculationConfig(max_draft=8))
    drafter.extend([10, 11, 12], forced=2)  # sampled 10, then the grammar forced 11 12
    drafter.extend([20])
    drafter.extend([21])  # after the forced run: 20 21
    drafter.extend([30])
    drafter.extend([10])
    grammar = _Script([{11, 13}, {14}, {15}, {20, 22}, {21, 23}, None, None, None])
    # "10" was followed by "11 12"; the grammar takes 11 but forces 14 15 after it;
    # nothing followed "15", so 20 21 (what followed the last forced run), then the lookup
    # reads on after "20 21".
    assert drafter.propose(8, grammar) == [11, 14, 15, 20, 21, 30, 10]
    assert grammar.at == 0


def test_drafts_are_cut_where_they_pay_most() -> None:
    config = SpeculationConfig(free_positions=1.5, position_cost=0.14)
    assert pass_cost(1, config) == 1.0 and pass_cost(4, config) == pytest.approx(1.35)
    assert draft_lengths([[0.05] * 8], positions=1, rows=1, config=config) == [0]
    assert draft_lengths([[1.0] * 8], positions=1, rows=1, config=config) == [8]
    short, long = draft_lengths([[0.6] * 8, [0.95] * 8], positions=2, rows=2, config=config)
    assert 0 < short < long
    # Forced tokens (odds 1) after a likely first token are worth their positions.
    assert draft_lengths([[0.9, 1.0, 1.0, 1.0, 0.1]], positions=1, rows=1, config=config) == [4]


def test_measured_costs_replace_the_model_size_by_size() -> None:
    config = SpeculationConfig(free_positions=1.5, position_cost=0.14)
    costs = PassCosts(config, samples=2)
    assert [costs.cost(m) for m in range(1, 14)] == [pass_cost(m, config) for m in range(1, 14)]
    # A machine where every position past the first costs 0.3 of a pass (steeper than modelled).
    for _ in range(3):
        for m in range(1, 9):
            costs.observe(m, 0.004 * (1 + 0.3 * (m - 1)))
    assert [costs.cost(m) for m in range(1, 9)] == pytest.approx([1 + 0.3 * (m - 1) for m in range(1, 9)])
    # Unmeasured sizes: the model in the measured unit, never below the largest measured.
    assert costs.cost(9) == pytest.approx(max(3.1, pass_cost(9, config)))
    assert costs.cost(1000) >= costs.cost(8)
    # A size seen once (fewer than ``samples``) still counts as the model.
    costs.observe(12, 1.0)
    assert costs.cost(12) == pytest.approx(max(3.1, pass_cost(12, config)))
    # Drafts are cut shorter where passes cost more than the model says.
    odds = [[0.7] * 8]
    modelled = draft_lengths(odds, positions=1, rows=1, config=config)
    measured = draft_lengths(odds, positions=1, rows=1, config=config, costs=costs)
    assert 0 < measured[0] < modelled[0]


def test_measured_costs_follow_the_machine_and_drop_bad_input() -> None:
    config = SpeculationConfig()
    costs = PassCosts(config, samples=1, weight=0.5)
    costs.observe(1, 0.01)
    costs.observe(4, 0.02)
    assert costs.cost(4) == pytest.approx(2.0)
    costs.observe(4, 0.04)  # the moving average: halfway to the newest
    assert costs.cost(4) == pytest.approx(3.0)
    bad = ((0, 0.1), (-3, 0.1), (10_000, 0.1), (2, 0.0), (2, -1.0), (2, 5e-324), (2, float("nan")))
    for positions, seconds in bad:
        costs.observe(positions, seconds)
    costs.observe(2, 0.5, rows=config.max_batch + 1)  # a batch too large to draft: not its cost
    assert costs.cost(2) == pytest.approx(pass_cost(2, config))
    with pytest.raises(ValueError):
        PassCosts(config, weight=0.0)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(-2, 80), st.floats(-1.0, 1.0)), max_size=60))
def test_measured_costs_never_fall_as_positions_grow(seen: list[tuple[int, float]]) -> None:
    costs = PassCosts(SpeculationConfig(), samples=1)
    for positions, seconds in seen:
        costs.observe(positions, seconds)
    table = [costs.cost(m) for m in range(1, 90)]
    assert all(c > 0 for c in table)
    assert all(a <= b for a, b in itertools.pairwise(table))


# ---- the runner: logits of a row's last tokens -----------------------------------------


@pytest.fixture(scope="module")
def int8w(tiny_model_dir: Any) -> Any:
    return load_model(tiny_model_dir, quantize="int8-weights", progress=False)


def test_tail_logits_are_the_bits_of_feeding_one_token_at_a_time(int8w: Any) -> None:
    from thinkstruct.engine.runners.decoder_runner import default_runner

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
    compiler = Engine(int8w).compiler
    grammar = compiler.compile(Constraint.regex("[a-z ]{20,60}"))
    # Forced keys: drafts splice them in and the rows keep them with the draft.
    props = {name: {"type": "string", "maxLength": 12} for name in ("alpha", "beta", "gamma", "delta")}
    schema = compiler.compile(
        Constraint.json_schema(
            {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}
        )
    )
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
        GenerationRequest(
            prompt_ids=ids, sampling=SamplingParams(max_tokens=80, temperature=0.0), grammar=schema
        ),
        *(
            GenerationRequest(
                prompt_ids=ids,
                sampling=SamplingParams(max_tokens=80, temperature=1.0, seed=seed),
                grammar=schema,
            )
            for seed in range(2)
        ),
    ]
    plain, _ = _answers(int8w, requests, speculate=False)
    drafted, stats = _answers(int8w, requests, speculate=True)
    assert drafted == plain
    assert stats.draft_tokens > 0 and stats.accepted_draft_tokens > 0
    assert stats.steps < sum(len(t) for t in plain)  # some steps kept several tokens
