"""Prefix-aware routing on Ray Serve: :class:`PromptPrefixRouter` over a :class:`PrefixIndex`.

A chat's next turn starts with its previous turn's whole prompt, and requests that share
a system prompt start alike; the replica that served that prefix holds its keys and
values in its prefix cache (and the compiled grammar of a client's repeated schema).
The router sends a request to the replica holding the longest run of the prompt's
leading token blocks, unless that replica's queue is longer than the least busy
candidate's by more than ``imbalance`` requests: then Ray Serve's queue-length choice
among all candidates decides, so one replica is not flooded by one popular prefix.
"""

from __future__ import annotations

import hashlib
import random
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

#: Tokens per prefix block: a match is counted in whole blocks.
BLOCK_TOKENS = 16


def block_keys(token_ids: Sequence[int], *, block: int = BLOCK_TOKENS) -> list[bytes]:
    """One key per whole leading block: key ``i`` digests tokens ``[0, (i + 1) * block)``,
    so equal keys mean equal prefixes."""
    keys: list[bytes] = []
    digest = hashlib.blake2b(digest_size=16)
    for end in range(block, len(token_ids) + 1, block):
        digest.update(b"".join(t.to_bytes(4, "little") for t in token_ids[end - block : end]))
        keys.append(digest.copy().digest())
    return keys


class PrefixIndex:
    """Which replica last served each prompt prefix block (least recently used first out).

    Args:
        max_blocks: blocks remembered in all (each entry ~100 bytes).
    """

    def __init__(self, *, max_blocks: int = 200_000) -> None:
        self._owner: OrderedDict[bytes, Hashable] = OrderedDict()
        self._max_blocks = max_blocks

    def __len__(self) -> int:
        return len(self._owner)

    def record(self, keys: Sequence[bytes], replica: Hashable) -> None:
        """``replica`` now holds these blocks."""
        for key in keys:
            self._owner[key] = replica
            self._owner.move_to_end(key)
        while len(self._owner) > self._max_blocks:
            self._owner.popitem(last=False)

    def longest(self, keys: Sequence[bytes], among: set[Hashable]) -> tuple[Hashable | None, int]:
        """The replica in ``among`` holding the most leading blocks of ``keys``, and how
        many it holds (``None, 0``: none)."""
        best: Hashable | None = None
        matched = 0
        for depth, key in enumerate(keys, start=1):
            owner = self._owner.get(key)
            if owner is None:
                break
            if owner in among:
                best, matched = owner, depth
        return best, matched

    def forget(self, replica: Hashable) -> None:
        """Drop every block of a replica that is gone."""
        for key in [k for k, owner in self._owner.items() if owner == replica]:
            del self._owner[key]


class PromptPrefixRouter(RequestRouter):
    """Ray Serve request router: prefix affinity balanced against queue length.

    Reads the prompt from the request's first argument (anything with ``prompt_ids``);
    requests without one fall back to the queue-length choice among all candidates.
    ``request_router_kwargs``: ``imbalance`` (requests; default 4), ``block`` (tokens).
    """

    def initialize_state(self, **kwargs: Any) -> None:
        self._imbalance = int(kwargs.get("imbalance", 4))
        self._block = int(kwargs.get("block", BLOCK_TOKENS))
        self._index = PrefixIndex()

    def _keys(self, pending_request: PendingRequest | None) -> list[bytes]:
        if pending_request is None or not pending_request.args:
            return []
        prompt = getattr(pending_request.args[0], "prompt_ids", None)
        return [] if prompt is None else block_keys(prompt, block=self._block)

    def _queue(self, replica: RunningReplica) -> int:
        return self.replica_queue_len_cache.get(replica.replica_id) or 0

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        by_id = {r.replica_id: r for r in candidate_replicas}
        # Shuffled first, so equally busy replicas share what no prefix claims.
        least_busy = sorted(random.sample(candidate_replicas, len(candidate_replicas)), key=self._queue)
        owner, _ = self._index.longest(self._keys(pending_request), set(by_id))
        if owner is not None:
            holder = by_id[owner]  # type: ignore[index]
            if self._queue(holder) - self._queue(least_busy[0]) <= self._imbalance:
                return [[holder], [r for r in least_busy if r is not holder]]
        return [least_busy[:2], least_busy[2:]] if len(least_busy) > 2 else [least_busy]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        self._index.record(self._keys(pending_request), replica_id)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._index.forget(replica_id)
