from __future__ import annotations

import pytest
import torch

from thinkstruct import Constraint, Tokenizer
from thinkstruct.grammar.runtime.bitmask import (
    TokenBitmask,
    allocate_bitmask,
    allowed_token_ids,
    apply_bitmask_inplace,
    bitmask_words,
)

from .conftest import BACKENDS, PERSON_SCHEMA, compiled

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def test_shape_and_reuse() -> None:
    assert bitmask_words(129_280) == 4040
    buf = TokenBitmask(8, 129_280)
    rows = buf.rows(3)
    assert rows.shape == (3, 4040) and rows.dtype == torch.int32
    rows[0].zero_()
    rows[1, 4039] = 5
    again = buf.rows(2)
    assert again.data_ptr() == rows.data_ptr()  # the same memory, reset
    assert bool((again == -1).all())  # every word of every row, the last included
    grown = buf.rows(9)  # past the rows allocated: a new buffer, all allowed
    assert grown.shape == (9, 4040) and bool((grown == -1).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("device", DEVICES)
def test_apply_in_place(dtype: torch.dtype, device: str) -> None:
    vocab = 100
    bm = allocate_bitmask(2, vocab)
    bm.zero_()
    bm[0, 0] = 0b1011  # tokens 0, 1, 3
    bm[1, 2] = 1 << 5  # token 69
    logits = torch.randn(2, vocab, dtype=dtype, device=device)
    ptr = logits.data_ptr()
    apply_bitmask_inplace(logits, bm)
    assert logits.data_ptr() == ptr
    finite = torch.isfinite(logits.float()).cpu()
    assert finite[0].nonzero().flatten().tolist() == [0, 1, 3]
    assert finite[1].nonzero().flatten().tolist() == [69]


@pytest.mark.parametrize("device", DEVICES)
def test_apply_to_selected_rows(device: str) -> None:
    logits = torch.zeros(3, 40, device=device)
    bm = allocate_bitmask(1, 40)
    bm.zero_()
    bm[0, 1] = 1  # token 32
    apply_bitmask_inplace(logits, bm, indices=[1])
    logits = logits.cpu()
    assert torch.isfinite(logits[0]).all() and torch.isfinite(logits[2]).all()
    assert torch.isfinite(logits[1]).nonzero().flatten().tolist() == [32]


@pytest.mark.parametrize("device", DEVICES)
def test_logits_wider_than_the_mask_are_cut(device: str) -> None:
    logits = torch.zeros(1, 70, device=device)
    bm = allocate_bitmask(1, 40)  # two words: 64 tokens
    apply_bitmask_inplace(logits, bm)
    logits = logits.cpu()
    assert torch.isfinite(logits[0, :64]).all() and not torch.isfinite(logits[0, 64:]).any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("vocab", "mask_vocab"), [(129_280, 129_280), (151_936, 151_669), (1000, 999)])
def test_every_device_masks_what_the_cpu_reference_masks(
    dtype: torch.dtype, device: str, vocab: int, mask_vocab: int
) -> None:
    """Random masks over real vocabulary widths (a model's embedding rows past its
    tokenizer's, as Qwen3's 151,936 over 151,669): each device's result is the reference's,
    a token allowed exactly where its bit is set and inside the mask's words."""
    gen = torch.Generator().manual_seed(vocab + len(str(dtype)))
    rows = 5
    bm = torch.randint(
        -(2**31), 2**31 - 1, (rows, bitmask_words(mask_vocab)), generator=gen, dtype=torch.int32
    )
    bm[1].zero_()  # nothing allowed
    bm[2].fill_(-1)  # everything the mask covers
    logits = torch.randn(rows, vocab, generator=gen).to(dtype)
    bits = ((bm.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).view(rows, -1).bool()
    expected = torch.zeros(rows, vocab, dtype=torch.bool)
    covered = min(vocab, bits.shape[1])
    expected[:, :covered] = bits[:, :covered]
    on_device = logits.clone().to(device)
    apply_bitmask_inplace(on_device, bm)
    got = torch.isfinite(on_device.float()).cpu()
    assert torch.equal(got, expected)
    assert torch.equal(on_device.cpu()[expected], logits[expected])  # allowed logits untouched
    selected = logits.clone().to(device)
    apply_bitmask_inplace(selected, bm[[3]], indices=[4])
    got_rows = torch.isfinite(selected.float()).cpu()
    assert got_rows[:4].all() and torch.equal(got_rows[4], expected[3])


def test_one_batch_mixes_backends(tokenizer: Tokenizer) -> None:
    """Rows filled by different backends in one tensor mean the same tokens."""
    prefix = tokenizer.encode('{"name":"Ada","age":')
    bm = allocate_bitmask(len(BACKENDS), tokenizer.vocab_size)
    for row, backend in enumerate(BACKENDS):
        g = compiled(backend, Constraint.json_schema(PERSON_SCHEMA)).matcher()
        assert g.accept_tokens(prefix) == len(prefix)
        g.fill_bitmask(bm, row)
    allowed = [set(allowed_token_ids(bm, r, tokenizer.vocab_size).tolist()) for r in range(len(BACKENDS))]
    assert allowed[0] == allowed[1] == allowed[2]
    digits = tokenizer.encode("7")[0]
    assert digits in allowed[0]
    logits = torch.zeros(len(BACKENDS), tokenizer.vocab_size)
    apply_bitmask_inplace(logits, bm)
    assert [int(torch.isfinite(logits[r]).sum()) for r in range(3)] == [len(a) for a in allowed]


def test_wrong_bitmask_is_refused_not_written(tokenizer: Tokenizer) -> None:
    g = compiled("llguidance", Constraint.json_schema(PERSON_SCHEMA)).matcher()
    with pytest.raises(TypeError):
        g.fill_bitmask(torch.zeros(1, 4040, dtype=torch.int64), 0)
    with pytest.raises(IndexError):
        g.fill_bitmask(allocate_bitmask(1, tokenizer.vocab_size), 1)
    with pytest.raises(ValueError):
        g.fill_bitmask(allocate_bitmask(2, tokenizer.vocab_size).t(), 0)
