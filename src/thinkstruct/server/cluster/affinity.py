"""The routing decision, plain data in and replicas out: :func:`rank_replicas` under :class:`Bounds`.

A request goes to a replica that holds the longest prefix of its prompt, the least busy
of them if several do, unless that replica is busier than the least busy replica by
more than the bound for that kind of match allows; then, and for a prompt no replica
holds, the least busy replica takes it. Two kinds of match, two bounds:

- a whole earlier prompt that this one goes on from (a conversation's previous turn):
  leaving costs re-prefilling the whole conversation on another replica, for this
  request alone, so the holder keeps it up to the looser bound;
- only a prefix of earlier prompts (a shared system prompt), or the same prompt again:
  leaving costs prefilling it once on another replica, which then holds it too, so the
  holder takes it only while it is about as busy as the least busy replica, and a
  popular prefix spreads over the replicas as its requests arrive rather than piling
  onto its first holder.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable, Collection, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

R = TypeVar("R", bound=Hashable)


@dataclass(frozen=True, kw_only=True)
class LoadBound:
    """How much busier than the least busy replica a prefix's holder may be and still be chosen.

    The holder is chosen while its requests in flight are at most ``requests`` more than
    the least busy replica's, or at most ``ratio`` times them: a replica holding a prefix
    takes at most ``max(least + requests, ratio * least)`` requests (plus the one
    deciding).

    Attributes:
        requests: requests in flight beyond the least busy replica's always allowed (>= 0).
        ratio: the holder's requests in flight over the least busy one's always allowed (>= 1).
    """

    requests: int
    ratio: float

    def __post_init__(self) -> None:
        if self.requests < 0 or self.ratio < 1:
            raise ValueError(
                f"a load bound needs requests >= 0 and ratio >= 1, got {self.requests}, {self.ratio}"
            )

    def allows(self, holder: int, least: int) -> bool:
        """Whether a holder with ``holder`` requests in flight may take one more while the
        least busy replica has ``least``."""
        return holder - least <= self.requests or holder <= self.ratio * least

    def __str__(self) -> str:
        return f"at most {self.requests} more or {self.ratio:g}x as many"


@dataclass(frozen=True, kw_only=True)
class Bounds:
    """The load bound for each kind of match (see the module's docstring).

    Attributes:
        whole: for a match that is a whole earlier prompt the request's prompt goes on
            from (a conversation's previous turn).
        shared: for a match that is only a prefix of earlier prompts (a shared system
            prompt) or the same prompt again.
    """

    whole: LoadBound = field(default_factory=lambda: LoadBound(requests=8, ratio=2.0))
    shared: LoadBound = field(default_factory=lambda: LoadBound(requests=1, ratio=1.0))

    def of(self, *, whole: bool) -> LoadBound:
        """The bound for a match of a whole earlier prompt (``whole``) or only a shared prefix."""
        return self.whole if whole else self.shared


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


class InFlight(Generic[R]):
    """Requests in flight per replica as one router counts them: those it ranked a replica
    first for and that replica has not yet accepted, and those accepted and not finished.

    A choice counts at once: a router ranks a burst of waiting requests one after another
    before any of them is sent, and without it each would see the same loads and the
    burst would split by chance. A choice never accepted (the request was cancelled while
    it waited) stops counting after ``choice_ttl_s``.
    """

    def __init__(self, *, choice_ttl_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl = choice_ttl_s
        self._clock = clock
        self._chosen: dict[str, tuple[R, float]] = {}  # by request: the replica ranked first, when
        self._running: dict[str, R] = {}  # accepted and not finished, by request
        self._count: Counter[R] = Counter()

    def __call__(self, replica: R) -> int:
        """The requests in flight on ``replica``."""
        return self._count[replica]

    def _drop(self, replica: R) -> None:
        self._count[replica] -= 1
        if self._count[replica] <= 0:
            del self._count[replica]

    def chose(self, request: str, replica: R) -> None:
        """``replica`` was ranked first for ``request`` (again: the last choice counts)."""
        now = self._clock()
        for old, (where, when) in list(self._chosen.items()):
            if old == request or now - when > self._ttl:
                del self._chosen[old]
                self._drop(where)
        self._chosen[request] = (replica, now)
        self._count[replica] += 1

    def accepted(self, request: str, replica: R) -> None:
        """``replica`` took ``request`` (whichever replica it was chosen for)."""
        chosen = self._chosen.pop(request, None)
        if chosen is not None:
            self._drop(chosen[0])
        if request not in self._running:
            self._running[request] = replica
            self._count[replica] += 1

    def finished(self, request: str) -> None:
        """``request`` ended (or never was accepted)."""
        chosen = self._chosen.pop(request, None)
        if chosen is not None:
            self._drop(chosen[0])
        replica = self._running.pop(request, None)
        if replica is not None:
            self._drop(replica)
