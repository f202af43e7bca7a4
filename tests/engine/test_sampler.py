"""Per-row sampling: greedy, top-k, exact top-p, seeds, masked tokens."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from thinkstruct.engine.request import SamplingParams
from thinkstruct.engine.sampling import sampler
from thinkstruct.engine.sampling.sampler import TOP_P_CANDIDATES, new_generator, sample

VOCAB = 2048


@pytest.fixture(autouse=True, params=["kernels", "torch"])
def sampling_path(request, monkeypatch) -> None:
    """Every test on both paths: the compiled kernels (greedy and whole-softmax rows in one
    call), and the torch operations that run where they do not build."""
    if request.param == "torch":
        monkeypatch.setattr(sampler, "cpu_kernels", lambda: None)
    else:
        assert sampler.cpu_kernels() is not None  # this project's machines build them


def _logits(seed: int, rows: int = 1, scale: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, VOCAB, generator=g) * scale


def _nucleus(row: torch.Tensor, top_p: float, temperature: float) -> set[int]:
    """Reference top-p support: sort everything, keep the smallest prefix reaching top_p."""
    probs = torch.softmax(row / temperature, -1)
    values, order = torch.sort(probs, descending=True)
    keep = int(torch.searchsorted(torch.cumsum(values, 0), torch.tensor(top_p))) + 1
    return set(order[:keep].tolist())


def test_greedy_is_argmax_per_row() -> None:
    logits = _logits(0, rows=5)
    params = [SamplingParams(temperature=0)] * 3 + [SamplingParams(top_k=1, temperature=1.5)] * 2
    gens = [new_generator(i) for i in range(5)]
    assert sample(logits, params, gens) == logits.argmax(-1).tolist()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), top_k=st.integers(2, 50), draw_seed=st.integers(0, 2**40))
def test_top_k_only_picks_among_the_k_best(seed: int, top_k: int, draw_seed: int) -> None:
    logits = _logits(seed)
    token = sample(logits, [SamplingParams(top_k=top_k)], [new_generator(draw_seed)])[0]
    assert token in set(torch.topk(logits[0], top_k).indices.tolist())


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    top_p=st.floats(0.05, 0.99),
    temperature=st.sampled_from([0.3, 1.0, 2.5, 20.0]),
    draw_seed=st.integers(0, 2**40),
)
def test_top_p_picks_inside_the_exact_nucleus(
    seed: int, top_p: float, temperature: float, draw_seed: int
) -> None:
    # A high temperature flattens the distribution so that the first candidates hold less
    # than top_p of the mass: the sampler must widen to the whole vocabulary, not truncate.
    logits = _logits(seed)
    params = SamplingParams(top_p=top_p, temperature=temperature)
    token = sample(logits, [params], [new_generator(draw_seed)])[0]
    assert token in _nucleus(logits[0], top_p, temperature)


def test_a_flat_distribution_widens_past_the_candidates() -> None:
    logits = torch.zeros(1, VOCAB)  # uniform: 0.9 of the mass needs 1843 tokens
    params = SamplingParams(top_p=0.9)
    seen = {sample(logits, [params], [new_generator(s)])[0] for s in range(400)}
    assert max(seen) >= TOP_P_CANDIDATES  # some picks beyond the first candidates


def test_same_seed_same_tokens_whatever_the_other_rows() -> None:
    mine = _logits(7)
    params = SamplingParams(temperature=1.0, top_p=0.95)
    alone = [sample(mine, [params], [new_generator(42)])[0] for _ in range(1)]
    others = _logits(8, rows=3)
    batch = torch.cat([others[:1], mine, others[1:]])
    in_batch = sample(
        batch,
        [SamplingParams(temperature=0.5)] + [params] + [SamplingParams(top_k=3)] * 2,
        [new_generator(1), new_generator(42), new_generator(2), new_generator(3)],
    )
    assert in_batch[1] == alone[0]


def test_masked_tokens_are_never_sampled() -> None:
    logits = _logits(3, rows=1, scale=1.0)
    allowed = torch.tensor([5, 77, 1500])
    masked = torch.full_like(logits, float("-inf"))
    masked[0, allowed] = logits[0, allowed]
    for s in range(50):
        for params in (
            SamplingParams(),
            SamplingParams(top_p=0.5),
            SamplingParams(top_k=20),
            SamplingParams(temperature=0),
        ):
            assert sample(masked.clone(), [params], [new_generator(s)])[0] in allowed.tolist()


def test_a_row_with_nothing_allowed_is_named() -> None:
    logits = _logits(1, rows=3)
    logits[1] = float("-inf")
    with pytest.raises(ValueError, match="row 1"):
        sample(logits, [SamplingParams()] * 3, [new_generator(i) for i in range(3)])


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"seed": "7"}, "seed"),
        ({"stop": ("",)}, "stop"),
        ({"stop": tuple(str(i) for i in range(40))}, "stop"),
    ],
)
def test_bad_parameters_name_their_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_draws_follow_the_distribution() -> None:
    """Frequencies over many seeded draws match the softmax (every sampling path)."""
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.1, 0.0]]))  # last one masked
    draws = 4000
    for params, expected in (
        (SamplingParams(), [0.5, 0.25, 0.15, 0.1, 0.0]),
        (SamplingParams(top_k=2), [2 / 3, 1 / 3, 0, 0, 0]),
        (SamplingParams(top_p=0.7), [2 / 3, 1 / 3, 0, 0, 0]),
    ):
        counts = [0] * 5
        g = new_generator(99)
        for _ in range(draws):
            counts[sample(logits.clone(), [params], [g])[0]] += 1
        for token, p in enumerate(expected):
            assert abs(counts[token] / draws - p) < 0.03, (params, counts)
        assert counts[4] == 0
