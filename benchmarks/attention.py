"""The attention kernel alone (``CpuKernels.attention``) on SmolLM2-135M's shapes (9 query
heads over 3 key/value heads of 64), at several context lengths:

- **decode 1** / **decode 8**: one new token in each of 1 or 8 slots, at the context's
  last position;
- **verify 6**: 6 consecutive positions of one slot (a speculative draft's verification);
- **prefill 256**: the context's last 256 positions of one slot in one pass.

The cache is paged as the engine pages it (blocks of 32 positions), each slot's blocks
scattered over the pool in random order.

    python benchmarks/attention.py [--contexts 256 1024 4096] [--repeats 30] [--other TREE]

Each figure is the best of ``--repeats`` calls (the machine is shared: best, not mean).
``--other TREE`` adds another checkout's kernels (its ``src``'s library, built by a Python
on that tree's path) as a second side of the same run, sides interleaved call by call, and
prints this tree's speed-up over it (``x``: other's time / this tree's):

    python benchmarks/attention.py --other /work/main

OpenMP threads wait passively, as ``thinkstruct serve`` sets them (with the default active
wait, a call over 2k positions on 2 threads took 4 or 8 ms on either side: a tick).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as serve sets it; before torch loads

import torch

from thinkstruct.engine.kernels.cpu_kernels import CpuKernels, cpu_kernels

HEADS, KV_HEADS, DIM, BLOCK = 9, 3, 64, 32
SLOTS = 8


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--contexts", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--other", default=None, help="another checkout's root: its kernels as a second side")
    parser.add_argument("--avx2", action="store_true", help="both sides on their AVX2 code only")
    args = parser.parse_args()
    kernels = cpu_kernels()
    assert kernels is not None
    sides = {"this": kernels}
    if args.other:
        sides["other"] = _other_tree(args.other)
    for lib in sides.values():
        lib.use_avx512(not args.avx2)
    print(
        f"# {HEADS} heads over {KV_HEADS} kv heads of {DIM}, blocks of {BLOCK}, torch threads "
        f"{torch.get_num_threads()}, {'AVX2' if args.avx2 else 'AVX-512 where the CPU has it'}, "
        f"best of {args.repeats}, load {os.getloadavg()[0]:.2f}"
    )
    header = f"{'context':>7} {'pass':<12} " + " ".join(f"{s + ' us':>10}" for s in sides)
    print(header + ("  x (other / this)" if len(sides) > 1 else ""))
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for context in args.contexts:
            per_slot = -(-context // BLOCK)
            blocks = SLOTS * per_slot
            keys = torch.randn(KV_HEADS, blocks, BLOCK, DIM, generator=generator)
            values = torch.randn(KV_HEADS, blocks, BLOCK, DIM, generator=generator)
            table = torch.randperm(blocks, generator=generator).view(SLOTS, per_slot).contiguous()
            passes = {
                "decode 1": ([0], [context - 1]),
                "decode 8": (list(range(SLOTS)), [context - 1] * SLOTS),
                "verify 6": ([0] * 6, list(range(context - 6, context))),
                "prefill 256": ([0] * 256, list(range(context - 256, context))),
            }
            for name, (slots, positions) in passes.items():
                slot_of = torch.tensor(slots, dtype=torch.long)
                pos_of = torch.tensor(positions, dtype=torch.long)
                qkv = torch.randn(len(slots), (HEADS + 2 * KV_HEADS) * DIM, generator=generator)

                def run(lib: CpuKernels, qkv=qkv, slot_of=slot_of, pos_of=pos_of) -> torch.Tensor:
                    return lib.attention(
                        qkv, heads=HEADS, kv_heads=KV_HEADS, slot_of=slot_of, pos_of=pos_of, span=context,
                        keys=keys, values=values, table=table, scale=DIM**-0.5,
                    )  # fmt: skip

                outs = {side: run(lib) for side, lib in sides.items()}
                if len(sides) > 1:  # the same attention, to float32 rounding (not the same bits)
                    torch.testing.assert_close(outs["this"], outs["other"], rtol=1e-4, atol=1e-4)
                best = dict.fromkeys(sides, float("inf"))
                for _ in range(args.repeats):
                    for side, lib in sides.items():
                        start = time.perf_counter()
                        run(lib)
                        best[side] = min(best[side], time.perf_counter() - start)
                cells = " ".join(f"{best[s] * 1e6:>10.1f}" for s in sides)
                ratio = f"  {best['other'] / best['this']:>5.2f}x" if len(sides) > 1 else ""
                print(f"{context:>7} {name:<12} {cells}{ratio}", flush=True)
    for lib in sides.values():
        lib.use_avx512(True)


def _other_tree(root: str) -> CpuKernels:
    """Another checkout's compiled kernels."""
    path = subprocess.run(
        [
            sys.executable,
            "-c",
            "from thinkstruct.engine.kernels.cpu_kernels import _built_library; print(_built_library())",
        ],
        env={**os.environ, "PYTHONPATH": os.path.join(root, "src")},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return CpuKernels(ctypes.CDLL(path))


if __name__ == "__main__":
    main()
