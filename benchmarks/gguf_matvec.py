"""The GGUF block matmul alone (``CpuKernels.gguf_linear``) against int8 rows
(``w8_linear``) and this machine's read bandwidth: GB/s of weights read for 1-8 activation
rows, on weights too big for the caches (about 60 MB a format, random values quantized by
the ``gguf`` package).

    python benchmarks/gguf_matvec.py [--rows 1 2 8] [--repeats 20]

Each figure is the best of ``--repeats`` calls (the machine is shared: best, not mean);
formats interleaved call by call. Run it under two trees' ``PYTHONPATH`` in turn to
compare kernels (each packs the blocks its own way).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from gguf.constants import GGMLQuantizationType
from gguf.quants import quantize

from thinkstruct.engine.cpu_kernels import cpu_kernels
from thinkstruct.engine.gguf_weights import pack_blocks
from thinkstruct.engine.int8_weights import Int8Linear


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--inputs", type=int, default=576)
    parser.add_argument("--outputs", type=int, default=98304)
    args = parser.parse_args()
    kernels = cpu_kernels()
    assert kernels is not None
    n, k = args.outputs, args.inputs
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((n, k)).astype(np.float32)
    sides = {}
    for fmt in ("Q4_0", "Q4_1", "Q8_0"):
        packed = pack_blocks(fmt, quantize(weights, GGMLQuantizationType[fmt]))
        sides[fmt] = (packed.numel(), lambda x, p=packed, f=fmt: kernels.gguf_linear(x, f, p, n))
    linear = torch.nn.Linear(k, n, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.from_numpy(weights))
    int8 = Int8Linear.from_linear(linear, kernels=kernels)
    del linear
    int8_bytes = sum(t.numel() * t.element_size() for t in (int8.weight_int8, int8.scale))
    sides["int8"] = (int8_bytes, lambda x: int8(x))
    data = torch.ones(64 * 1024 * 1024)
    best_read = min(_time(lambda: data.sum()) for _ in range(8))
    bandwidth = data.numel() * 4 / best_read
    print(f"# {n} x {k} weights, torch threads {torch.get_num_threads()}, read bandwidth {bandwidth / 1e9:.1f} GB/s")
    print(f"{'rows':>4} " + " ".join(f"{s + ' GB/s':>12}" for s in sides) + "  (x of bandwidth)")
    with torch.inference_mode():
        for rows in args.rows:
            x = torch.randn(rows, k)
            best = dict.fromkeys(sides, float("inf"))
            for _ in range(args.repeats):
                for side, (_, run) in sides.items():
                    best[side] = min(best[side], _time(lambda r=run: r(x)))
            cells = " ".join(f"{sides[s][0] / best[s] / 1e9:>6.1f} {sides[s][0] / best[s] / bandwidth:>4.2f}x" for s in sides)
            print(f"{rows:>4} {cells}")


def _time(fn) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
