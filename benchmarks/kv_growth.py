"""The paged KV cache filling up as under load: pools that double as they run out (a
small start; every doubling copies the pools and stalls every row) against
pools that reserve their room up front as untouched zero pages (the default), side by
side, the sides alternating round by round.

The embedded SmolLM2's shapes (30 layers, 3 key/value heads of 64, float32, 8 slots of
8192 positions). Each step gives each of the 8 slots one more block and writes it (as a
pass's keys and values would: the first touch of its pages); a slot that reaches
``--request-blocks`` hands its blocks to a list standing for the prefix cache and starts
over, until the held blocks reach ``--held-mib``. Prints per side the total seconds, the
worst step and the steps over 20 ms (each a stall of every row of a real batch).

    python benchmarks/kv_growth.py [--rounds 3] [--held-mib 1024] [--request-blocks 64]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from thinkstruct.engine.kv.blocks import HeldBlocks, PagedKvCache
from thinkstruct.engine.kv.prefix_cache import BLOCK_TOKENS

SHAPE = {"layers": 30, "slots": 8, "kv_heads": 3, "head_dim": 64, "context_length": 8192}


def fill(reserve_bytes: int | None, held_mib: int, request_blocks: int) -> list[float]:
    """Seconds of each step until the held blocks reach ``held_mib``."""
    extra = {} if reserve_bytes is None else {"reserve_bytes": reserve_bytes}
    cache = PagedKvCache(**SHAPE, dtype=torch.float32, **extra)  # type: ignore[arg-type]
    held: list[HeldBlocks] = []
    lengths = [0] * cache.slots
    steps = []
    while sum(h.nbytes for h in held) < held_mib << 20:
        start = time.perf_counter()
        for slot in range(cache.slots):
            cache.prepare(slot, lengths[slot], lengths[slot] + BLOCK_TOKENS)
            block = cache.blocks_of(slot)[-1]
            for pool in (*cache.keys, *cache.values):
                pool[:, block].fill_(1.0)
            lengths[slot] += BLOCK_TOKENS
            if lengths[slot] == request_blocks * BLOCK_TOKENS:
                held.append(cache.hold(slot, 0, lengths[slot]))
                cache.free(slot)
                lengths[slot] = 0
        steps.append(time.perf_counter() - start)
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--held-mib", type=int, default=1024)
    parser.add_argument("--request-blocks", type=int, default=64)
    args = parser.parse_args()
    sides = {"doubling": 0, "reserved": None}
    results: dict[str, list[list[float]]] = {name: [] for name in sides}
    for r in range(args.rounds):
        for name in sorted(sides, reverse=r % 2 == 1):
            results[name].append(fill(sides[name], args.held_mib, args.request_blocks))
    print(
        f"{'side':<9} {'total s':>8} {'worst ms':>9} {'>20 ms':>7} {'median ms':>10}  (median of {args.rounds} rounds)"
    )
    totals = {}
    for name, rounds in results.items():
        totals[name] = statistics.median(sum(s) for s in rounds)
        worst = statistics.median(max(s) for s in rounds)
        stalls = statistics.median(sum(x > 0.02 for x in s) for s in rounds)
        median = statistics.median(statistics.median(s) for s in rounds)
        print(f"{name:<9} {totals[name]:>8.2f} {1e3 * worst:>9.1f} {stalls:>7.0f} {1e3 * median:>10.2f}")
    print(f"reserved / doubling total time: {totals['reserved'] / totals['doubling']:.2f}x")


if __name__ == "__main__":
    main()
