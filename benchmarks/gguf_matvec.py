"""The GGUF block matmul alone (``CpuKernels.gguf_linear``) against int8 rows
(``w8_linear``) and this machine's read bandwidth: GB/s of weights read for 1-8 activation
rows, on weights too big for the caches (about 60 MB a format, random values quantized by
the ``gguf`` package; random super-blocks for Q4_K and Q6_K, ``--inputs`` a multiple of
256 then).

    python benchmarks/gguf_matvec.py [--rows 1 2 8] [--repeats 20]

Each figure is the best of ``--repeats`` calls (the machine is shared: best, not mean);
sides interleaved call by call. ``--other TREE`` adds another checkout's GGUF kernels
(its ``src``'s library, built by a Python on that tree's path, and its ``pack_blocks``)
as more sides of the same run: an A/B under the same load.

    python benchmarks/gguf_matvec.py --other /tmp/wt-base --formats Q4_1 Q8_0
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import os
import subprocess
import sys
import time

import numpy as np
import torch
from gguf.constants import GGMLQuantizationType
from gguf.quants import quantize

from thinkstruct.engine.kernels.cpu_kernels import CpuKernels, cpu_kernels
from thinkstruct.engine.weights.gguf_weights import pack_blocks
from thinkstruct.engine.weights.int8_weights import Int8Linear


def _raw_blocks(fmt: str, weights: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``weights`` quantized by the ``gguf`` package to ``fmt``; for the K formats, which it
    does not quantize, random super-blocks of the same size (the speed does not depend on
    the values), their float16 scales set to small numbers."""
    rows, k = weights.shape
    sizes = {"Q4_K": (144, slice(0, 4)), "Q6_K": (210, slice(208, 210))}
    if fmt not in sizes:
        return quantize(weights, GGMLQuantizationType[fmt])
    nbytes, fields = sizes[fmt]
    raw = rng.integers(0, 256, (rows, k // 256, nbytes), dtype=np.uint8)
    width = fields.stop - fields.start
    scales = rng.uniform(1e-4, 1e-2, (rows, k // 256, width // 2)).astype(np.float16)
    raw[..., fields] = scales.view(np.uint8).reshape(rows, k // 256, width)
    return raw.reshape(rows, -1)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--inputs", type=int, default=576)
    parser.add_argument("--outputs", type=int, default=98304)
    parser.add_argument("--formats", nargs="+", default=["Q4_0", "Q4_1", "Q8_0"])
    parser.add_argument(
        "--other", default=None, help="another checkout's root: its GGUF kernels as more sides"
    )
    args = parser.parse_args()
    kernels = cpu_kernels()
    assert kernels is not None
    trees = {"": (kernels, pack_blocks)}
    if args.other:
        trees["base "] = _other_tree(args.other)
    n, k = args.outputs, args.inputs
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((n, k)).astype(np.float32)
    sides = {}
    for fmt in args.formats:
        raw = _raw_blocks(fmt, weights, rng)
        for label, (lib, pack) in trees.items():
            packed = pack(fmt, raw)
            sides[label + fmt] = (
                packed.numel(),
                lambda x, p=packed, f=fmt, lb=lib: lb.gguf_linear(x, f, p, n),
            )
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
    print(
        f"# {n} x {k} weights, torch threads {torch.get_num_threads()}, read bandwidth {bandwidth / 1e9:.1f} GB/s"
    )
    print(f"{'rows':>4} " + " ".join(f"{s + ' GB/s':>14}" for s in sides) + "  (x of bandwidth)")
    with torch.inference_mode():
        for rows in args.rows:
            x = torch.randn(rows, k)
            best = dict.fromkeys(sides, float("inf"))
            for _ in range(args.repeats):
                for side, (_, run) in sides.items():
                    best[side] = min(best[side], _time(lambda r=run: r(x)))
            cells = " ".join(
                f"{sides[s][0] / best[s] / 1e9:>8.1f} {sides[s][0] / best[s] / bandwidth:>4.2f}x"
                for s in sides
            )
            print(f"{rows:>4} {cells}")


def _other_tree(root: str) -> tuple[CpuKernels, object]:
    """Another checkout's compiled kernels and ``pack_blocks`` (its engine/ in subpackages
    or flat)."""
    src = os.path.join(root, "src")
    layouts = (
        ("thinkstruct.engine.kernels.cpu_kernels", "thinkstruct/engine/weights/gguf_weights.py"),
        ("thinkstruct.engine.cpu_kernels", "thinkstruct/engine/gguf_weights.py"),
    )
    kernels, weights = next(layout for layout in layouts if os.path.exists(os.path.join(src, layout[1])))
    path = subprocess.run(
        [sys.executable, "-c", f"from {kernels} import _built_library; print(_built_library())"],
        env={**os.environ, "PYTHONPATH": src},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    spec = importlib.util.spec_from_file_location("other_gguf_weights", os.path.join(src, weights))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return CpuKernels(ctypes.CDLL(path)), module.pack_blocks


def _time(fn) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
