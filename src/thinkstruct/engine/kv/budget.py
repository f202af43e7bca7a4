"""How much memory keys and values may take: :class:`KvBudget`.

Two budgets bound a runner's keys and values, each set by the operator:

- **running requests** (``kv_bytes``, ``serve --kv-cache-bytes``): a request is admitted
  only while the reservations of the running ones and its own fit; it reserves, in whole
  units, the most positions it can come to hold (its prompt plus ``max_tokens``, within
  the context), so once admitted it never finds the memory short, whatever it and the
  others write;
- **the prefix cache** (``prefix_bytes``, ``serve --prefix-cache-bytes``): finished
  requests' keys and values kept for the next request that starts the same way, least
  recently used first out past it.

A unit is what a runner hands out: a block of
:data:`~thinkstruct.engine.kv.prefix_cache.BLOCK_TOKENS` positions on the paged cache
(:class:`~thinkstruct.engine.kv.blocks.PagedKvCache`, whose pools then never hold more
than both budgets' blocks and one for a copy on write), a whole slot's buffer on slot
buffers (:class:`~thinkstruct.engine.kv.slots.SlotCache`, whose slots each hold
``kv_bytes / slots``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["DEFAULT_KV_BYTES", "DEFAULT_PREFIX_BYTES", "KvBudget"]

#: Default budget of the running requests' keys and values (``--kv-cache-bytes``): 2 GiB
#: hold about 91,000 positions of SmolLM2-135M's keys and values in float16, as the
#: compiled kernels keep them (23 KB a position; 45,000 in float32), 64 requests of 1,400
#: positions each.
DEFAULT_KV_BYTES = 2 << 30
#: Default budget of the prefix cache (``--prefix-cache-bytes``).
DEFAULT_PREFIX_BYTES = 1 << 30


@dataclass(frozen=True, kw_only=True)
class KvBudget:
    """The keys and values a runner lets requests take.

    Attributes:
        kv_bytes: most bytes the running requests reserve together (whole units).
        prefix_bytes: most bytes the prefix cache keeps.
        unit_tokens: positions one unit holds.
        unit_bytes: bytes one unit takes (every layer's keys and values).
        max_positions: most positions one request may hold (the context, or less where
            the budget is smaller).
    """

    kv_bytes: int
    prefix_bytes: int
    unit_tokens: int
    unit_bytes: int
    max_positions: int

    def __post_init__(self) -> None:
        if self.unit_tokens < 1 or self.unit_bytes < 1:
            raise ValueError("unit_tokens and unit_bytes must be positive")
        if self.kv_bytes < 0 or self.prefix_bytes < 0 or self.max_positions < 0:
            raise ValueError("kv_bytes, prefix_bytes and max_positions must not be negative")

    def need(self, positions: int) -> int | None:
        """Bytes a request that holds up to ``positions`` positions reserves (whole
        units), or ``None`` where no admission can ever give it that many."""
        if positions > self.max_positions:
            return None
        units = -(-positions // self.unit_tokens)
        needed = units * self.unit_bytes
        return needed if needed <= self.kv_bytes else None

    def within(self, *, kv_bytes: int, prefix_bytes: int) -> KvBudget:
        """This budget, each part at most the given bytes (an engine's configuration over
        a runner built with more); the limits of one request shrink with it."""
        kv = min(self.kv_bytes, kv_bytes // self.unit_bytes * self.unit_bytes)
        return replace(
            self,
            kv_bytes=kv,
            prefix_bytes=min(self.prefix_bytes, prefix_bytes),
            max_positions=min(self.max_positions, kv // self.unit_bytes * self.unit_tokens),
        )
