"""The routing decision, plain data in and replicas out: :func:`rank_replicas` under a :class:`LoadBound`.

A request goes to a replica that holds the longest prefix of its prompt (its
conversation's previous turn, a shared system prompt), the least busy of them if several
do, unless that replica is busier than the least busy replica by more than the bound
allows; then, and for a prompt no replica holds, the least busy replica takes it. A
prefix several replicas hold (a popular system prompt, once it has spread) so goes to
the least busy of its holders, and one only a single replica holds goes there until the
bound is reached, and from then on also to the others.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Hashable, Sequence
from dataclasses import dataclass
from typing import TypeVar

R = TypeVar("R", bound=Hashable)


@dataclass(frozen=True, kw_only=True)
class LoadBound:
    """How much busier than the least busy replica a prefix's holder may be and still be chosen.

    The holder is chosen while its requests in flight are at most ``requests`` more than
    the least busy replica's, or at most ``ratio`` times them: a replica holding a prefix
    takes at most ``max(least + requests, ratio * least)`` requests (plus the one
    deciding), so a popular prefix spreads, while two busy replicas a few requests apart
    (one finished its conversations' turns sooner) keep their conversations.

    Attributes:
        requests: requests in flight beyond the least busy replica's always allowed (>= 0).
        ratio: the holder's requests in flight over the least busy one's always allowed (>= 1).
    """

    requests: int = 4
    ratio: float = 1.5

    def __post_init__(self) -> None:
        if self.requests < 0 or self.ratio < 1:
            raise ValueError(
                f"a load bound needs requests >= 0 and ratio >= 1, got {self.requests}, {self.ratio}"
            )

    def allows(self, holder: int, least: int) -> bool:
        """Whether a holder with ``holder`` requests in flight may take one more while the
        least busy replica has ``least``."""
        return holder - least <= self.requests or holder <= self.ratio * least


def rank_replicas(
    candidates: Sequence[R],
    *,
    holders: Collection[R],
    load: Callable[[R], int],
    bound: LoadBound,
    rng: random.Random,
) -> list[R]:
    """``candidates``, most preferred first: the least busy of ``holders`` (the replicas
    holding the prompt's longest known prefix) if ``bound`` allows it, then the others
    least busy first (equally busy ones in ``rng``'s order)."""
    order = sorted(rng.sample(list(candidates), len(candidates)), key=load)
    if not order:
        return order
    held = next((r for r in order if r in holders), None)
    if held is None or held == order[0] or not bound.allows(load(held), load(order[0])):
        return order
    return [held, *(r for r in order if r != held)]
