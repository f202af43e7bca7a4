"""logit_bias, presence / frequency / repetition penalties, min_p and log-probabilities:
the math on random logits (both sampling paths), then through the engine on the tiny model."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from thinkstruct import Constraint
from thinkstruct.engine import Engine, EngineConfig, FinishReason, GenerationRequest, SamplingParams
from thinkstruct.engine.request import InvalidSamplingParam
from thinkstruct.engine.sampling import sampler as sampler_module
from thinkstruct.engine.sampling.logit_adjustments import LogitAdjustments, adjust_logits
from thinkstruct.engine.sampling.logprobs import LogprobTable
from thinkstruct.engine.sampling.sampler import apply_min_p, new_generator, sample
from thinkstruct.grammar.runtime.bitmask import (
    allocate_bitmask,
    allow_only,
    apply_bitmask_inplace,
    is_allowed,
)
from thinkstruct.grammar.service.compiler import CompilerConfig, GrammarCompiler

VOCAB = 2048
#: The sampling-path fixture patches the module once per test, the same for every example.
ON_BOTH_PATHS = [HealthCheck.function_scoped_fixture]


@pytest.fixture(params=["kernels", "torch"])
def sampling_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The compiled kernels' sampling, and the torch operations used where they do not build."""
    if request.param == "torch":
        monkeypatch.setattr(sampler_module, "cpu_kernels", lambda: None)
    else:
        assert sampler_module.cpu_kernels() is not None
    return str(request.param)


def _logits(seed: int, rows: int = 1, scale: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, VOCAB, generator=g) * scale


def _masked(logits: torch.Tensor, seed: int, share: float = 0.3) -> tuple[torch.Tensor, torch.Tensor]:
    """``logits`` under a random grammar-style bitmask allowing about ``share`` of the
    tokens (at least one); returns the masked copy and the allowed ids of row 0."""
    g = torch.Generator().manual_seed(seed)
    allowed = torch.nonzero(torch.rand(VOCAB, generator=g) < share)[:, 0]
    if not allowed.numel():
        allowed = torch.tensor([seed % VOCAB])
    bitmask = allocate_bitmask(logits.shape[0], VOCAB)
    for row in range(logits.shape[0]):
        allow_only(bitmask, row, allowed.tolist())
    out = logits.clone()
    apply_bitmask_inplace(out, bitmask)
    return out, allowed


def _adjusted(
    logits: torch.Tensor, params: SamplingParams, prompt: list[int], output: list[int]
) -> torch.Tensor:
    state = LogitAdjustments(params, prompt)
    state.add(output)
    out = logits.clone()
    adjust_logits(out, [params], [state])
    return out


# ---- the math ----------------------------------------------------------------------------


@settings(max_examples=30, deadline=None, suppress_health_check=ON_BOTH_PATHS)
@given(seed=st.integers(0, 10_000), pick=st.integers(0, 10_000))
def test_a_bias_of_100_on_an_allowed_token_makes_greedy_pick_it(
    sampling_path: str, seed: int, pick: int
) -> None:
    masked, allowed = _masked(_logits(seed), seed)
    target = int(allowed[pick % allowed.numel()])
    params = SamplingParams(temperature=0, logit_bias=((target, 100.0),))
    biased = _adjusted(masked, params, [], [])
    assert sample(biased, [params], [new_generator(0)]) == [target]


@settings(max_examples=30, deadline=None, suppress_health_check=ON_BOTH_PATHS)
@given(seed=st.integers(0, 10_000))
def test_a_forbidden_token_stays_forbidden_whatever_its_bias(sampling_path: str, seed: int) -> None:
    masked, allowed = _masked(_logits(seed), seed)
    forbidden = next(t for t in range(VOCAB) if t not in set(allowed.tolist()))
    params = SamplingParams(temperature=0, logit_bias=((forbidden, 100.0),), repetition_penalty=0.5)
    biased = _adjusted(masked, params, [forbidden], [forbidden])
    assert biased[0, forbidden] == -math.inf
    assert sample(biased, [params], [new_generator(0)])[0] in set(allowed.tolist())


@settings(max_examples=30, deadline=None, suppress_health_check=ON_BOTH_PATHS)
@given(seed=st.integers(0, 10_000))
def test_a_bias_of_minus_100_on_the_greedy_token_changes_the_pick(sampling_path: str, seed: int) -> None:
    logits = _logits(seed)
    best = int(logits.argmax())
    params = SamplingParams(temperature=0, logit_bias=((best, -100.0),))
    biased = _adjusted(logits, params, [], [])
    picked = sample(biased, [params], [new_generator(0)])[0]
    assert picked != best
    without_best = logits.clone()
    without_best[0, best] = -math.inf
    assert picked == int(without_best.argmax())


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    prompt=st.lists(st.integers(0, VOCAB - 1), max_size=30),
    output=st.lists(st.integers(0, 40), max_size=30),
    repetition=st.sampled_from([1.0, 0.7, 1.3, 2.0]),
    presence=st.sampled_from([0.0, -1.5, 0.5, 2.0]),
    frequency=st.sampled_from([0.0, -0.25, 1.0, 2.0]),
)
def test_penalties_follow_vllm(
    seed: int, prompt: list[int], output: list[int], repetition: float, presence: float, frequency: float
) -> None:
    logits = _logits(seed)
    params = SamplingParams(
        repetition_penalty=repetition, presence_penalty=presence, frequency_penalty=frequency
    )
    got = _adjusted(logits, params, prompt, output) if params.adjusts_logits else logits
    # Dense reference: repetition over prompt + output, then frequency and presence over output.
    expected = logits[0].double().clone()
    seen = torch.zeros(VOCAB, dtype=torch.bool)
    seen[prompt + output] = True
    penalised = torch.where(expected > 0, expected / repetition, expected * repetition)
    expected = torch.where(seen, penalised, expected)
    counts = torch.bincount(torch.tensor(output, dtype=torch.int64), minlength=VOCAB).double()
    expected -= frequency * counts + presence * (counts > 0).double()
    torch.testing.assert_close(got[0].double(), expected, rtol=1e-6, atol=1e-5)


def test_rows_without_options_are_left_alone() -> None:
    logits = _logits(1, rows=3)
    params = [SamplingParams(), SamplingParams(presence_penalty=1.0), SamplingParams()]
    state = LogitAdjustments(params[1], [])
    state.add([5, 5, 9])
    out = logits.clone()
    adjust_logits(out, params, [None, state, None])
    assert torch.equal(out[0], logits[0]) and torch.equal(out[2], logits[2])
    assert out[1, 5] == logits[1, 5] - 1.0 and out[1, 9] == logits[1, 9] - 1.0


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(0, 20), share=st.sampled_from([0.002, 0.05, 0.5]))
def test_logprobs_are_the_allowed_distribution(seed: int, k: int, share: float) -> None:
    masked, allowed = _masked(_logits(seed), seed, share)
    params = [SamplingParams(logprobs=k)]
    table = LogprobTable(masked, params)
    allowed_ids = set(allowed.tolist())
    token = int(allowed[seed % allowed.numel()])
    entry = table.entry(0, token)
    assert entry is not None
    logprob, top = entry
    # Probabilities over the allowed set sum to 1; the token's is the log-softmax of what was allowed.
    total = sum(math.exp(table.entry(0, t)[0]) for t in allowed_ids)
    assert total == pytest.approx(1.0, abs=1e-4)
    reference = torch.log_softmax(masked[0].double(), -1)
    assert logprob == pytest.approx(float(reference[token]), abs=1e-5)
    # The top list: only allowed tokens, most likely first, as many as asked (or allowed).
    assert len(top) == min(k, len(allowed_ids))
    assert all(t in allowed_ids for t, _ in top)
    assert [v for _, v in top] == sorted((v for _, v in top), reverse=True)
    if top:
        assert top[0][0] == int(masked[0].argmax())


def test_logprobs_only_for_the_rows_that_ask() -> None:
    logits = _logits(2, rows=2)
    table = LogprobTable(logits, [SamplingParams(), SamplingParams(logprobs=2)])
    assert table.entry(0, 3) is None
    assert table.entry(1, 3) is not None


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    min_p=st.floats(0.001, 1.0),
    temperature=st.sampled_from([0.5, 1.0, 1.7]),
)
def test_min_p_removes_exactly_the_tokens_below_p_times_max(
    seed: int, min_p: float, temperature: float
) -> None:
    logits = _logits(seed)
    params = [SamplingParams(min_p=min_p, temperature=temperature)]
    pruned = logits.clone()
    apply_min_p(pruned, [0], params)
    probs = torch.softmax(logits[0].double() / temperature, -1)
    ratio = probs / probs.max()
    kept = torch.isfinite(pruned[0])
    clear = (ratio - min_p).abs() > 1e-4 * min_p  # float32 rounding only matters at the line
    assert torch.equal(kept[clear], (ratio >= min_p)[clear])
    assert torch.equal(pruned[0][kept], logits[0][kept])  # the rest untouched
    again = pruned.clone()
    apply_min_p(again, [0], params)
    assert torch.equal(again, pruned)  # idempotent: a re-draw after a failed batch is the same


def test_min_p_rows_are_pruned_each_by_its_own_parameters() -> None:
    logits = _logits(3, rows=3, scale=1.0)
    params = [
        SamplingParams(min_p=0.5, temperature=0.5),
        SamplingParams(min_p=0.05, temperature=1.0),
        SamplingParams(min_p=0.2, temperature=2.0),
    ]
    alone = []
    for r in range(3):
        row = logits[r : r + 1].clone()
        apply_min_p(row, [0], [params[r]])
        alone.append(row[0])
    every = logits.clone()
    apply_min_p(every, [0, 1, 2], params)  # all rows: pruned in place
    some = logits.clone()
    apply_min_p(some, [0, 2], params)  # a subset: copied out and back
    for r in range(3):
        assert torch.equal(every[r], alone[r])
    assert torch.equal(some[0], alone[0]) and torch.equal(some[2], alone[2])
    assert torch.equal(some[1], logits[1])


@settings(max_examples=20, deadline=None, suppress_health_check=ON_BOTH_PATHS)
@given(seed=st.integers(0, 10_000), draw=st.integers(0, 2**40), min_p=st.sampled_from([0.05, 0.3, 0.9]))
def test_min_p_draws_stay_above_the_threshold(sampling_path: str, seed: int, draw: int, min_p: float) -> None:
    logits = _logits(seed, scale=1.0)  # flat enough that min_p leaves several tokens
    params = SamplingParams(min_p=min_p, temperature=1.0)
    token = sample(logits.clone(), [params], [new_generator(draw)])[0]
    probs = torch.softmax(logits[0].double(), -1)
    assert probs[token] >= min_p * probs.max() * (1 - 1e-4)


def test_out_of_range_options_name_the_field() -> None:
    cases = {
        "logprobs": {"logprobs": 21},
        "logit_bias.7": {"logit_bias": ((7, 100.5),)},
        "presence_penalty": {"presence_penalty": 2.5},
        "frequency_penalty": {"frequency_penalty": -3.0},
        "repetition_penalty": {"repetition_penalty": 0.0},
        "min_p": {"min_p": 1.5},
    }
    for field, kwargs in cases.items():
        with pytest.raises(InvalidSamplingParam) as caught:
            SamplingParams(**kwargs)
        assert caught.value.field == field


# ---- through the engine --------------------------------------------------------------------


@pytest.fixture(scope="module")
def compiler(tiny_model):
    with GrammarCompiler(tiny_model.tokenizer, CompilerConfig(timeout_s=60)) as c:
        yield c


@pytest.fixture(scope="module")
def engine(tiny_model, compiler):
    with Engine(tiny_model, config=EngineConfig(max_batch=4), compiler=compiler) as e:
        yield e


PROMPT = [0, 100, 200, 300, 400, 500]


def _run(engine: Engine, **kwargs: object):
    return engine.submit(GenerationRequest(prompt_ids=PROMPT, **kwargs)).wait()


def test_engine_logit_bias_steers_greedy_decoding(engine) -> None:
    out = _run(engine, sampling=SamplingParams(max_tokens=6, temperature=0, logit_bias=((4242, 100.0),)))
    assert out.token_ids == (4242,) * 6


def test_engine_refuses_a_bias_outside_the_vocabulary(engine, tiny_model) -> None:
    vocab = tiny_model.tokenizer.vocab_size
    with pytest.raises(InvalidSamplingParam) as caught:
        _run(engine, sampling=SamplingParams(logit_bias=((vocab, 1.0),)))
    assert caught.value.field == f"logit_bias.{vocab}"


def test_engine_penalties_change_what_repeats(engine) -> None:
    # The tiny model's logits are small (random weights), so a penalty of 2 dominates them.
    fresh = _run(engine, sampling=SamplingParams(max_tokens=12, temperature=0, presence_penalty=2.0))
    assert len(set(fresh.token_ids)) == len(fresh.token_ids)
    stuck = _run(engine, sampling=SamplingParams(max_tokens=12, temperature=0, frequency_penalty=-2.0))
    assert len(set(stuck.token_ids)) == 1
    novel = _run(engine, sampling=SamplingParams(max_tokens=12, temperature=0, repetition_penalty=1e6))
    assert len(set(novel.token_ids)) == len(novel.token_ids)
    assert not set(novel.token_ids) & set(PROMPT)


def test_engine_min_p_of_1_is_greedy(engine) -> None:
    greedy = _run(engine, sampling=SamplingParams(max_tokens=8, temperature=0))
    kept = _run(engine, sampling=SamplingParams(max_tokens=8, temperature=1.5, min_p=1.0, seed=9))
    assert kept.token_ids == greedy.token_ids


def test_engine_logprobs_line_up_with_the_tokens(engine) -> None:
    out = _run(engine, sampling=SamplingParams(max_tokens=8, temperature=0, logprobs=3))
    assert [lp.token_id for lp in out.logprobs] == list(out.token_ids)
    for lp in out.logprobs:
        assert len(lp.top) == 3
        assert lp.top[0][0] == lp.token_id  # greedy took the most likely
        assert lp.logprob == pytest.approx(lp.top[0][1])
    plain = _run(engine, sampling=SamplingParams(max_tokens=8, temperature=0))
    assert plain.logprobs == () and plain.token_ids == out.token_ids


def test_engine_logprobs_list_only_what_the_grammar_allowed(engine, compiler, tiny_model) -> None:
    grammar = compiler.compile(Constraint.choice(["alpha", "beta", "gamma delta"]))
    out = _run(engine, sampling=SamplingParams(max_tokens=20, seed=4, logprobs=20), grammar=grammar)
    assert out.finish_reason is FinishReason.STOP
    assert out.content in ("alpha", "beta", "gamma delta")
    matcher = grammar.matcher()
    bitmask = allocate_bitmask(1, tiny_model.tokenizer.vocab_size)
    for lp in out.logprobs:
        matcher.fill_bitmask(bitmask, 0)
        assert lp.top, "an allowed token is always listed"
        assert all(is_allowed(bitmask, 0, t) for t, _ in lp.top)
        assert math.fsum(math.exp(v) for _, v in lp.top) <= 1.0 + 1e-5
        assert matcher.accept_token(lp.token_id)


def test_engine_marks_the_thought_tokens(engine, compiler, tiny_model) -> None:
    from thinkstruct.parsers import render_chat

    prompt = render_chat(
        [{"role": "user", "content": "think"}],
        family=tiny_model.family,
        tokenizer=tiny_model.tokenizer,
        chat_template=tiny_model.chat_template,
        chat_template_kwargs={"thinking": True},
    )
    out = engine.submit(
        GenerationRequest(
            prompt_ids=tiny_model.tokenizer.hf.encode(prompt.text, add_special_tokens=False),
            sampling=SamplingParams(max_tokens=40, seed=5, logprobs=0),
            grammar=compiler.compile(Constraint.choice(["left", "right"])),
            reasoning=True,
            reasoning_parser=prompt.reasoning_parser(),
            max_reasoning_tokens=4,
        )
    ).wait()
    flags = [lp.reasoning for lp in out.logprobs]
    assert flags == [True] * out.usage.reasoning_tokens + [False] * (len(flags) - out.usage.reasoning_tokens)
    answer = b"".join(
        tiny_model.tokenizer.token_bytes(lp.token_id) for lp in out.logprobs if not lp.reasoning
    )
    assert answer.decode() == out.content
