"""What a runner's logits are held to: transformers' own full forward pass, with the keys
and values rounded to the dtype the runner's KV cache holds (the compiled kernels keep
float16 by default: each key and value is rounded once, when written, and attention
computes in float32 with the rounded ones). Rounding in the reference, not a looser
tolerance in the tests, keeps every comparison as tight as a float32 cache's."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

_FLOAT16_KV = "thinkstruct_test_float16_kv"


def _float16_kv_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """transformers' SDPA over keys and values rounded through float16."""
    rounded_key, rounded_value = (x.to(torch.float16).to(x.dtype) for x in (key, value))
    return sdpa_attention_forward(module, query, rounded_key, rounded_value, attention_mask, **kwargs)


AttentionInterface.register(_FLOAT16_KV, _float16_kv_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(_FLOAT16_KV, sdpa_mask)


@contextlib.contextmanager
def rounded_kv(model: Any, kv_dtype: torch.dtype | None) -> Iterator[None]:
    """``model`` attends over keys and values rounded to ``kv_dtype`` inside the block
    (float16; float32 or ``None``: as it is)."""
    if kv_dtype != torch.float16:
        yield
        return
    before = model.config._attn_implementation
    model.set_attn_implementation(_FLOAT16_KV)
    try:
        yield
    finally:
        model.set_attn_implementation(before)


def kv_dtype_of(runner: Any) -> torch.dtype | None:
    """The dtype ``runner``'s cache holds keys and values in (``None``: a cache that
    keeps the model's own, as the transformers runner's slot buffers do)."""
    return getattr(runner.cache, "dtype", None)


def reference_logits(model: Any, ids: list[int], kv_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Logits of the last token of ``ids``, from a fresh full forward pass of ``model``
    with its keys and values rounded to ``kv_dtype``."""
    with torch.inference_mode(), rounded_kv(model, kv_dtype):
        out = model(input_ids=torch.tensor([ids]), use_cache=False)
    return out.logits[0, -1].float()


def tolerance(kv_dtype: torch.dtype | None) -> dict[str, float]:
    """``assert_close``'s tolerances against :func:`reference_logits`: 1e-4 (float
    summation order) with float32 keys and values; 1e-2 with float16 ones. There a key
    one float32 step away from torch's (the runner's projections sum in another order)
    can round to the neighbouring float16 value, a relative step of 1/1024, and the tiny
    random models amplify it: measured up to 5.5e-3 on a logit after a slot copy and a
    few passes (against 1e-5 right after a prefill). The kernels' float16 reads are held
    bit for bit in ``test_cpu_kernels.py``; here the question is the runner's plumbing."""
    bound = 1e-2 if kv_dtype == torch.float16 else 1e-4
    return {"rtol": bound, "atol": bound}
