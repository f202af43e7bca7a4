"""One batched KV cache used as slots: :class:`SlotCache`.

Each layer keeps preallocated key and value buffers of shape
``[slots, kv_heads, capacity + 1, head_dim]``: ``capacity`` positions a slot and one
scratch position past them, where a pass's padding tokens write their keys and values
(they are never attended), so the buffers hold what the rows hold and nothing more for
the padding. Row ``i`` of a forward pass over slots
``[lo, hi)`` is slot ``lo + i``; a row's cached tokens are positions ``[0, length)`` of its
slot, with no holes, so a request joins by writing its own prompt into a free slot (no
other row is copied or padded) and leaves by giving the slot back. The scheduler keeps
the running rows in the first slots, so a decoding step reads contiguous views.

The cache is a transformers :class:`~transformers.cache_utils.Cache`, so any model whose
attention layers call ``cache.update`` runs on it unchanged. Attention itself goes
through :func:`slot_attention`, registered with transformers' attention interface: it
applies the engine's per-row mask without expanding grouped key/value heads (SDPA with
a mask would otherwise copy every key and value once per query head, per layer, per step).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.cache_utils import Cache, CacheLayerMixin
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from thinkstruct.engine.kv.prefix_cache import KvSpan

#: The attention implementation name the runner sets on models it drives.
SLOT_ATTENTION = "thinkstruct_slots"


def slot_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention of ``query [B, Hq, q, D]`` over ``key``/``value [B, Hkv, T, D]`` under a
    boolean ``attention_mask [B, 1, q, T]`` (True = attend), without repeating kv heads:
    the ``Hq / Hkv`` query heads of each kv head are folded into the query length.

    Returns ``[B, q, Hq, D]``, as transformers' attention functions do.
    """
    if attention_mask is None:
        # Not a pass the runner planned (the model used on its own): transformers' own SDPA.
        out, weights = sdpa_attention_forward(
            module, query, key, value, None, dropout=dropout, scaling=scaling, **kwargs
        )
        return out, weights
    batch, q_heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    group = q_heads // kv_heads
    folded = query.reshape(batch, kv_heads, group * q_len, dim)
    mask = attention_mask
    if group > 1 and q_len > 1:
        mask = mask.repeat(1, 1, group, 1)
    out = F.scaled_dot_product_attention(folded, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(batch, q_heads, q_len, dim).transpose(1, 2), None


AttentionInterface.register(SLOT_ATTENTION, slot_attention)
# Used outside the runner (a 2-D padding mask, no plan), the model still gets SDPA's masks.
ALL_MASK_ATTENTION_FUNCTIONS.register(SLOT_ATTENTION, sdpa_mask)


class _SlotLayer(CacheLayerMixin):
    """One layer's buffers; writes go where the owning cache's plan says."""

    def __init__(self, owner: SlotCache, index: int) -> None:
        super().__init__()
        self._owner = owner
        self._index = index
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        pass

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self._owner.write(self._index, key_states, value_states)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self._owner.plan_rows[2], 0

    def get_seq_length(self) -> int:
        return self._owner.plan_rows[2]

    def get_max_length(self) -> int:
        return self._owner.capacity


class SlotCache(Cache):
    """Preallocated key/value buffers for ``slots`` rows of up to ``capacity`` tokens
    (and a scratch position each for padding).

    Args:
        layers: number of attention layers.
        slots: rows the buffers hold.
        kv_heads, head_dim: the model's key/value head count and size.
        capacity: tokens per slot allocated now; :meth:`grow` reallocates.
        dtype: storage dtype (the model's activation dtype).
    """

    def __init__(
        self, *, layers: int, slots: int, kv_heads: int, head_dim: int, capacity: int, dtype: torch.dtype
    ) -> None:
        shape = (slots, kv_heads, capacity + 1, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype) for _ in range(layers)]
        self.slots = slots
        self.capacity = capacity
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        #: (first slot, end slot, attended length) of the forward pass being run.
        self.plan_rows: tuple[int, int, int] = (0, 0, 0)
        #: ``[rows, kv_heads, q, head_dim]`` positions each new key/value is written to.
        self.plan_index = torch.zeros(0, dtype=torch.long)
        super().__init__(layers=[_SlotLayer(self, i) for i in range(layers)])

    @property
    def nbytes(self) -> int:
        """Bytes held by the buffers."""
        per = self.keys[0].numel() * self.keys[0].element_size()
        return 2 * per * len(self.keys)

    def plan(self, lo: int, hi: int, positions: torch.Tensor, lengths: torch.Tensor, span: int) -> None:
        """Set where the next forward pass writes: rows ``[lo, hi)``, ``positions [rows, q]``
        (each new token's position in its slot), of which row ``i``'s first
        ``lengths[i]`` are its tokens (the rest padding: written to the scratch position),
        attending to ``span`` positions."""
        rows, q = positions.shape
        padding = torch.arange(q)[None, :] >= lengths[:, None]
        index = positions.masked_fill(padding, self.capacity)
        self.plan_rows = (lo, hi, span)
        self.plan_index = index[:, None, :, None].expand(rows, self.kv_heads, q, self.head_dim)

    def write(
        self, layer: int, key_states: torch.Tensor, value_states: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store one layer's new keys and values ``[rows, kv_heads, q, head_dim]`` where the
        :meth:`plan` says; returns the planned rows' keys and values over the attended span."""
        lo, hi, span = self.plan_rows
        keys = self.keys[layer][lo:hi]
        values = self.values[layer][lo:hi]
        keys.scatter_(2, self.plan_index, key_states.to(keys.dtype))
        values.scatter_(2, self.plan_index, value_states.to(values.dtype))
        return keys[:, :, :span], values[:, :, :span]

    def ensure_capacity(self, needed: int, *, limit: int) -> None:
        """Hold at least ``needed`` tokens per slot: capacity doubles until it does, up to
        ``limit``.

        Raises:
            ValueError: ``needed`` is over ``limit``.
        """
        if needed > limit:
            raise ValueError(f"{needed} positions exceed a slot's {limit}")
        capacity = self.capacity
        if needed <= capacity:
            return
        while capacity < needed:
            capacity *= 2
        self.grow(min(capacity, limit))

    def grow(self, capacity: int) -> None:
        """Reallocate every buffer to ``capacity`` tokens per slot, keeping what is cached."""
        if capacity <= self.capacity:
            return
        for store in (self.keys, self.values):
            for i, old in enumerate(store):
                new = old.new_zeros((self.slots, self.kv_heads, capacity + 1, self.head_dim))
                new[:, :, : self.capacity].copy_(old[:, :, : self.capacity])
                store[i] = new
        self.capacity = capacity

    def read(self, slot: int, start: int, stop: int) -> KvSpan:
        """A copy of positions ``[start, stop)`` of ``slot``."""
        return KvSpan(
            keys=tuple(buf[slot, :, start:stop].clone() for buf in self.keys),
            values=tuple(buf[slot, :, start:stop].clone() for buf in self.values),
        )

    def write_span(self, slot: int, start: int, kv: KvSpan, *, limit: int) -> None:
        """Store ``kv`` at positions ``start...`` of ``slot`` (growing the buffers, up to
        ``limit`` tokens a slot, if they are too short).

        Raises:
            ValueError: the span ends past ``limit``.
        """
        stop = start + kv.keys[0].shape[1]
        self.ensure_capacity(stop, limit=limit)
        for store, parts in ((self.keys, kv.keys), (self.values, kv.values)):
            for buf, part in zip(store, parts, strict=True):
                buf[slot, :, start:stop].copy_(part)

    def copy_slot(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` cached positions of slot ``src`` into slot ``dst``."""
        if src == dst or length <= 0:
            return
        for store in (self.keys, self.values):
            for buf in store:
                buf[dst, :, :length].copy_(buf[src, :, :length])
