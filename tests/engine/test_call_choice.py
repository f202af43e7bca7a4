"""A call or another answer, chosen by the model's own odds of opening a call
(``engine/sampling/call_choice.py``), and the tokens that open a call
(``grammar/runtime/opening_tokens.py``)."""

from __future__ import annotations

import functools

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from thinkstruct.engine.request import SamplingParams
from thinkstruct.engine.sampling.call_choice import draws_call, restrict_row
from thinkstruct.engine.sampling.logit_adjustments import LogitAdjustments
from thinkstruct.engine.sampling.sampler import new_generator
from thinkstruct.grammar.runtime.bitmask import allocate_bitmask, allow_only, allowed_token_ids
from thinkstruct.grammar.runtime.opening_tokens import OpeningTokens, opening_tokens
from thinkstruct.tokenizer import Tokenizer, smollm2_gguf_path

VOCAB = 70  # three bitmask words, the last one partly used


@functools.cache
def smollm2() -> Tokenizer:
    return Tokenizer.from_pretrained(smollm2_gguf_path())


def test_the_tokens_that_open_a_trigger_spelled_in_text() -> None:
    tok = smollm2()
    trigger = b"<tool_call>"
    opening = opening_tokens(tok, "<tool_call>")
    ids = set(opening.ids.tolist())
    expected = {
        i
        for i, raw in enumerate(tok.decoded_vocab())
        if raw and (trigger.startswith(raw) or raw.startswith(trigger))
    }
    assert ids == expected
    assert tok.encode("<")[0] in ids and tok.encode("{")[0] not in ids
    assert allowed_token_ids(opening.row[None], 0, tok.vocab_size).tolist() == sorted(ids)
    assert opening_tokens(tok, "<tool_call>") is opening  # built once per tokenizer


def test_an_added_token_that_spells_the_trigger_opens_it() -> None:
    tok = Tokenizer.default()
    trigger = "<｜tool▁calls▁begin｜>"
    added = int(tok.hf.convert_tokens_to_ids(trigger))
    assert added in tok.special_token_ids  # the grammar spells it in plain tokens
    ids = set(opening_tokens(tok, trigger).ids.tolist())
    assert added in ids and tok.encode("<")[0] in ids
    assert int(tok.hf.convert_tokens_to_ids("<｜tool▁calls▁end｜>")) not in ids


def _opening(ids: list[int]) -> OpeningTokens:
    mask = allocate_bitmask(1, VOCAB)
    allow_only(mask, 0, ids)
    return OpeningTokens(ids=torch.tensor(sorted(ids), dtype=torch.int64), row=mask[0])


openings = st.sets(st.integers(0, VOCAB - 1), min_size=1, max_size=VOCAB - 1).map(sorted)
logit_rows = st.lists(
    st.floats(-20, 20, allow_nan=False, allow_infinity=False), min_size=VOCAB, max_size=VOCAB
).map(lambda values: torch.tensor(values, dtype=torch.float32))


@settings(max_examples=200, deadline=None)
@given(
    logits=logit_rows,
    ids=openings,
    temperature=st.floats(0.1, 2.0),
    seed=st.integers(0, 2**32),
    raise_by=st.floats(0, 10),
)
def test_the_more_the_model_wants_a_call_the_sooner_it_calls(
    logits: torch.Tensor, ids: list[int], temperature: float, seed: int, raise_by: float
) -> None:
    """For one seed, a call drawn at some odds is drawn at any higher odds: the choice is
    one uniform draw against the model's probability of the opening tokens."""
    params = SamplingParams(temperature=temperature)
    opening = _opening(ids)
    lifted = logits.clone()
    lifted[opening.ids] += raise_by
    before = draws_call(logits, opening, params=params, generator=new_generator(seed))
    after = draws_call(lifted, opening, params=params, generator=new_generator(seed))
    assert after or not before


@settings(max_examples=100, deadline=None)
@given(logits=logit_rows, ids=openings, seed=st.integers(0, 2**32))
def test_no_odds_never_call_and_certainty_always_does(
    logits: torch.Tensor, ids: list[int], seed: int
) -> None:
    params = SamplingParams(temperature=1.0)
    opening = _opening(ids)
    never = logits.clone()
    never[opening.ids] = float("-inf")
    assert not draws_call(never, opening, params=params, generator=new_generator(seed))
    always = torch.full_like(logits, float("-inf"))
    always[opening.ids] = logits[opening.ids]
    assert draws_call(always, opening, params=params, generator=new_generator(seed))


@settings(max_examples=100, deadline=None)
@given(logits=logit_rows, ids=openings)
def test_a_greedy_row_calls_when_its_likeliest_token_opens_a_call(
    logits: torch.Tensor, ids: list[int]
) -> None:
    called = draws_call(
        logits, _opening(ids), params=SamplingParams(temperature=0.0), generator=new_generator(0)
    )
    assert called == (int(logits.argmax()) in ids)


@settings(max_examples=100, deadline=None)
@given(logits=logit_rows, ids=openings, seed=st.integers(0, 2**32), greedy=st.booleans())
def test_the_request_bias_shapes_the_odds(
    logits: torch.Tensor, ids: list[int], seed: int, greedy: bool
) -> None:
    """A bias the request puts on the opening tokens counts as the model's own odds: -100
    on each of them and no call is drawn where a call was certain, +100 and one always is
    where none could be; the logits are left as they were."""
    opening = _opening(ids)
    temperature = 0.0 if greedy else 1.0
    against = SamplingParams(temperature=temperature, logit_bias=tuple((i, -100.0) for i in ids))
    towards = SamplingParams(temperature=temperature, logit_bias=tuple((i, 100.0) for i in ids))
    likely = torch.full_like(logits, -20.0)
    likely[opening.ids] = 20.0
    unlikely = torch.full_like(logits, 20.0)
    unlikely[opening.ids] = -20.0
    before = likely.clone()
    assert not draws_call(
        likely,
        opening,
        params=against,
        generator=new_generator(seed),
        adjustments=LogitAdjustments(against, []),
    )
    assert torch.equal(likely, before)
    assert draws_call(
        unlikely,
        opening,
        params=towards,
        generator=new_generator(seed),
        adjustments=LogitAdjustments(towards, []),
    )


def test_the_share_of_calls_follows_the_model_odds() -> None:
    """Logits that give the opening tokens 30 % of the probability: about 30 % of seeds call."""
    logits = torch.zeros(VOCAB)
    opening = _opening([1, 2, 3])
    # three tokens at weight w against 67 at weight 1: 3w / (3w + 67) = 0.3
    logits[opening.ids] = float(torch.log(torch.tensor(0.3 * 67 / (3 * 0.7))))
    calls = sum(
        draws_call(logits, opening, params=SamplingParams(temperature=1.0), generator=new_generator(seed))
        for seed in range(2000)
    )
    assert 540 <= calls <= 660  # 600 expected, a standard deviation of 20.5 (the seeds are fixed)


@settings(max_examples=200, deadline=None)
@given(allowed=st.sets(st.integers(0, VOCAB - 1), min_size=1), ids=openings, call=st.booleans())
def test_the_mask_keeps_the_choice_and_never_empties(allowed: set[int], ids: list[int], call: bool) -> None:
    masks = allocate_bitmask(2, VOCAB)
    allow_only(masks, 1, allowed)
    restrict_row(masks, 1, _opening(ids), call=call)
    kept = set(allowed_token_ids(masks, 1, VOCAB).tolist())
    chosen = allowed & set(ids) if call else allowed - set(ids)
    assert kept == (chosen or allowed)  # an empty choice leaves the grammar's row
    assert allowed_token_ids(masks, 0, VOCAB).tolist() == list(range(VOCAB))  # other rows untouched
