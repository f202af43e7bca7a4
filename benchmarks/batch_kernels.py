"""Kernel efficiency per batch size: GFLOP/s (2 per multiply-add) of the GGUF block multiply
(``CpuKernels.gguf_linear``, the embedded SmolLM2's Q4_1 layer shapes), the int8-weight
multiply (``w8_linear``, the same shapes), attention over paged KV with rows of different
lengths (``CpuKernels.attention``: one new token per slot, SmolLM2's 9 query heads over 3
key/value heads of 64, over 30 layers' caches in turn as a step reads them; ``attn f16``
over float16 pools, as the engine keeps them on the kernels, ``attn f32`` over float32
ones), and a whole decoding step of the embedded model
(``DecoderRunner``), at 1, 8, 16, 32 and 64 rows; beside the machine's multiply-add peak,
measured by a plain kernel compiled here (independent chains of float32 fused
multiply-adds, and of int16 pair multiply-adds into int32 as the GGUF blocks use: AVX-512
``vpdpwssd`` where the CPU has VNNI, else AVX2 ``vpmaddwd``), on the same OpenMP threads.

    python benchmarks/batch_kernels.py [--rows 1 8 16 32 64] [--repeats 20] [--context 128 1024]
        [--kv-cache-dtype float16 float32]

Each figure is the best of ``--repeats`` calls (the machine is shared: best, not mean); the
kernels of a batch size are interleaved call by call. ``x peak`` is a kernel's GFLOP/s over
the peak of the arithmetic it runs (int16 for GGUF blocks, float32 for the rest). The
decoding step (the model loaded as ``thinkstruct serve`` loads it: its GGUF blocks) also
gives tokens/s and its ratio to the ceilings the peaks set for the model's multiply-adds a
token in weights: ``x ceiling`` at the int16 peak (the arithmetic the blocks run), ``x f32
ceiling`` at the float32 FMA peak (a float32 model's). OpenMP threads wait passively, as
``thinkstruct serve`` sets them.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as serve sets it; before torch loads

import numpy as np
import torch
from gguf.constants import GGMLQuantizationType
from gguf.quants import quantize

from thinkstruct.engine.core.config import KV_CACHE_DTYPES
from thinkstruct.engine.kernels.cpu_kernels import cpu_kernels
from thinkstruct.engine.weights.gguf_weights import pack_blocks
from thinkstruct.engine.weights.int8_weights import Int8Linear

#: SmolLM2-135M's projections of one layer, (outputs, inputs): q, k, v, o, gate, up, down.
LAYER = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]
HEADS, KV_HEADS, DIM, BLOCK = 9, 3, 64, 32
#: Layers whose caches one attention figure reads in turn, each its own blocks, as a
#: decoding step of the embedded model does (one layer's alone stays in the CPU's cache).
ATTENTION_LAYERS = 30

PEAK_SOURCE = r"""
#include <immintrin.h>
/* Twelve independent chains (named, so they stay in registers) of one instruction each,
   per thread; each returns the multiply-adds done by all threads. */
#define CHAINS(T, init) T c0 = init(0), c1 = init(1), c2 = init(2), c3 = init(3), c4 = init(4), \
    c5 = init(5), c6 = init(6), c7 = init(7), c8 = init(8), c9 = init(9), c10 = init(10), c11 = init(11)
#define ROUND(op) c0 = op(c0); c1 = op(c1); c2 = op(c2); c3 = op(c3); c4 = op(c4); c5 = op(c5); \
    c6 = op(c6); c7 = op(c7); c8 = op(c8); c9 = op(c9); c10 = op(c10); c11 = op(c11)
#define SUM(f) (f(c0) + f(c1) + f(c2) + f(c3) + f(c4) + f(c5) + f(c6) + f(c7) + f(c8) + f(c9) + f(c10) + f(c11))
#if defined(__AVX512F__)
#define FMA(c) _mm512_fmadd_ps(c, a, b)
#define FLANES 16
#define FVEC __m512
#define FSET _mm512_set1_ps
#define FOUT(c) _mm512_cvtss_f32(c)
#else
#define FMA(c) _mm256_fmadd_ps(c, a, b)
#define FLANES 8
#define FVEC __m256
#define FSET _mm256_set1_ps
#define FOUT(c) _mm256_cvtss_f32(c)
#endif
#if defined(__AVX512VNNI__)
#define MADD(c) _mm512_dpwssd_epi32(c, a, b)
#define ILANES 32
#define IVEC __m512i
#define ISET16 _mm512_set1_epi16
#define ISET32 _mm512_set1_epi32
#define IOUT(c) _mm_cvtsi128_si32(_mm512_castsi512_si128(c))
#else
#define MADD(c) _mm256_add_epi32(c, _mm256_madd_epi16(c, a)) /* the pair products depend on the chain */
#define ILANES 16
#define IVEC __m256i
#define ISET16 _mm256_set1_epi16
#define ISET32 _mm256_set1_epi32
#define IOUT(c) _mm_cvtsi128_si32(_mm256_castsi256_si128(c))
#endif
#define FINIT(k) FSET(0.5f + (k))
/* peak_NAME(iters): the chains of OP over VEC from INIT, then one lane of each kept. */
#define PEAK(name, VEC, A, B, INIT, OP, LANES, OUT) double name(long iters) { \
    double total = 0; \
    _Pragma("omp parallel reduction(+:total)") \
    { \
        VEC a = A, b = B; \
        CHAINS(VEC, INIT); \
        for (long i = 0; i < iters; i++) { ROUND(OP); } \
        total += (double)iters * 12 * LANES + (SUM(OUT) == 12345); \
    } \
    return total; \
}
PEAK(peak_f32, FVEC, FSET(1.0000001f), FSET(0.9999999f), FINIT, FMA, FLANES, FOUT)
PEAK(peak_i16, IVEC, ISET16(3), ISET16(5), ISET32, MADD, ILANES, IOUT)
"""


def peak_kernels(directory: Path) -> ctypes.CDLL:
    """The plain peak kernels, compiled with gcc for this CPU."""
    source = directory / "peak.c"
    library = directory / "peak.so"
    source.write_text(PEAK_SOURCE)
    subprocess.run(
        ["gcc", "-O2", "-march=native", "-fopenmp", "-shared", "-fPIC", str(source), "-o", str(library)],
        check=True,
    )
    lib = ctypes.CDLL(str(library))
    for name in ("peak_f32", "peak_i16"):
        getattr(lib, name).restype = ctypes.c_double
        getattr(lib, name).argtypes = [ctypes.c_long]
    return lib


def best_rate(run: Callable[[], float], repeats: int) -> float:
    """The best of ``repeats`` calls of ``run`` (which returns the multiply-adds it did), as
    GFLOP/s."""
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        work = run()
        best = max(best, 2 * work / (time.perf_counter() - start) / 1e9)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16, 32, 64])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument(
        "--context",
        type=int,
        nargs=2,
        default=[128, 1024],
        help="the rows' positions are drawn in this range",
    )
    parser.add_argument("--no-step", action="store_true", help="leave out the whole decoding step")
    parser.add_argument(
        "--kv-cache-dtype",
        nargs="+",
        choices=("auto", *KV_CACHE_DTYPES),
        default=["auto"],
        help="what the decoding step's KV cache holds, a runner each, interleaved (auto: the engine's "
        "default, float16 on the kernels)",
    )
    args = parser.parse_args()
    kernels = cpu_kernels()
    if kernels is None:
        sys.exit("the compiled kernels do not build here")
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as tmp:
        peak = peak_kernels(Path(tmp))
        peak_f32 = best_rate(lambda: peak.peak_f32(2_000_000), 10)
        peak_i16 = best_rate(lambda: peak.peak_i16(2_000_000), 10)
    print(
        f"# {threads} threads, load {os.getloadavg()[0]:.2f}; multiply-add peak: float32 FMA "
        f"{peak_f32:.1f} GFLOP/s, int16 pairs {peak_i16:.1f} GFLOP/s (2 per multiply-add)"
    )
    rng = np.random.default_rng(0)
    generator = torch.Generator().manual_seed(0)
    gguf_layer = []
    int8_layer = []
    for n, k in LAYER:
        weights = rng.standard_normal((n, k)).astype(np.float32)
        packed = pack_blocks("Q4_1", quantize(weights, GGMLQuantizationType.Q4_1))
        gguf_layer.append((packed, n))
        linear = torch.nn.Linear(k, n, bias=False)
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(weights))
        int8_layer.append(Int8Linear.from_linear(linear, kernels=kernels))
    layer_madds = sum(n * k for n, k in LAYER)
    low, high = args.context
    max_rows = max(args.rows)
    per_slot = -(-high // BLOCK)
    pool_blocks = ATTENTION_LAYERS * max_rows * per_slot
    keys = torch.randn(KV_HEADS, pool_blocks, BLOCK, DIM, generator=generator)
    values = torch.randn(KV_HEADS, pool_blocks, BLOCK, DIM, generator=generator)
    pools = {"attn f16": (keys.half(), values.half()), "attn f32": (keys, values)}
    tables = torch.randperm(pool_blocks, generator=generator).view(ATTENTION_LAYERS, max_rows, per_slot)
    lengths = rng.integers(low, high + 1, max_rows)
    print(
        f"# one layer's projections {layer_madds / 1e6:.2f}M multiply-adds a row (Q4_1 blocks, int8 rows); "
        f"attention rows at positions {low}-{high}, blocks shuffled; best of {args.repeats}"
    )
    print(
        f"{'rows':>4} {'Q4_1 GFLOP/s':>13} {'x peak':>6} {'int8 GFLOP/s':>13} {'x peak':>6}"
        + "".join(f" {name + ' GFLOP/s':>17} {'x peak':>6}" for name in pools)
    )
    with torch.inference_mode():
        for rows in args.rows:
            x = torch.randn(rows, 1536, generator=generator)

            def gguf(x: torch.Tensor = x) -> float:
                for (packed, n), (_, k) in zip(gguf_layer, LAYER, strict=True):
                    kernels.gguf_linear(x[:, :k].contiguous(), "Q4_1", packed, n)
                return x.shape[0] * layer_madds

            def int8(x: torch.Tensor = x) -> float:
                for layer, (_, k) in zip(int8_layer, LAYER, strict=True):
                    layer(x[:, :k].contiguous())
                return x.shape[0] * layer_madds

            qkv = torch.randn(rows, (HEADS + 2 * KV_HEADS) * DIM, generator=generator)
            slot_of = torch.arange(rows)
            pos_of = torch.tensor(lengths[:rows] - 1, dtype=torch.long)
            span = int(lengths[:rows].max())

            def attention(
                pool: tuple[torch.Tensor, torch.Tensor],
                qkv: torch.Tensor = qkv,
                slot_of: torch.Tensor = slot_of,
                pos_of: torch.Tensor = pos_of,
                span: int = span,
            ) -> float:
                for table in tables:
                    kernels.attention(
                        qkv, heads=HEADS, kv_heads=KV_HEADS, slot_of=slot_of, pos_of=pos_of, span=span,
                        keys=pool[0], values=pool[1], table=table, scale=DIM**-0.5,
                    )  # fmt: skip
                # Scores, then the weighted sum, in every layer.
                return ATTENTION_LAYERS * 2 * HEADS * DIM * float((pos_of + 1).sum())

            sides: dict[str, Callable[[], float]] = {"gguf": gguf, "int8": int8}
            for name, pool in pools.items():
                sides[name] = functools.partial(attention, pool)
            best = dict.fromkeys(sides, 0.0)
            for _ in range(args.repeats):
                for name, run in sides.items():
                    best[name] = max(best[name], best_rate(run, 1))
            print(
                f"{rows:>4} {best['gguf']:>13.1f} {best['gguf'] / peak_i16:>6.2f} {best['int8']:>13.1f} "
                f"{best['int8'] / peak_f32:>6.2f}"
                + "".join(f" {best[name]:>17.1f} {best[name] / peak_f32:>6.2f}" for name in pools),
                flush=True,
            )
    if not args.no_step:
        decoding_steps(
            args.rows,
            lengths,
            repeats=max(3, args.repeats // 4),
            peak_i16=peak_i16,
            peak_f32=peak_f32,
            kv_cache_dtypes=args.kv_cache_dtype,
        )
    print("# python benchmarks/batch_kernels.py " + " ".join(sys.argv[1:]))


def decoding_steps(
    rows_list: list[int],
    lengths: np.ndarray,
    *,
    repeats: int,
    peak_i16: float,
    peak_f32: float,
    kv_cache_dtypes: list[str],
) -> None:
    """A whole decoding step of the embedded model (its GGUF blocks), per batch size: each
    slot prefilled to its drawn length, then one token per slot; one runner per KV cache
    dtype (``auto``: the engine's default), their steps interleaved call by call."""
    from thinkstruct.engine.assembly import EngineSpec
    from thinkstruct.engine.model.loading import load_model
    from thinkstruct.engine.runners.decoder_runner import DecoderRunner

    model = load_model(quantize=EngineSpec().quantize, progress=False)  # as thinkstruct serve loads it
    config = model.model.config
    max_rows = max(rows_list)
    runners = {
        name: DecoderRunner(
            model.model,
            slots=max_rows,
            context_length=int(lengths.max()) + 2,
            vocab_size=model.tokenizer.vocab_size,
            kv_cache_dtype=None if name == "auto" else getattr(torch, name),
        )
        for name in kv_cache_dtypes
    }
    hidden, inner = config.hidden_size, config.intermediate_size
    kv = config.num_key_value_heads * (hidden // config.num_attention_heads)
    layers = config.num_hidden_layers
    # q and o, k and v, gate, up and down; then the output layer.
    madds_per_token = (
        layers * (2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * inner) + config.vocab_size * hidden
    )
    rng = np.random.default_rng(1)
    with torch.inference_mode():
        for slot in range(max_rows):
            prompt = rng.integers(100, 10000, int(lengths[slot]) - 1).tolist()
            for start in range(0, len(prompt), 256):
                for runner in runners.values():
                    runner.forward(slot, [prompt[start : start + 256]], [start])
        attention_madds = 2 * layers * HEADS * DIM  # a token over one position: scores and sum
        ceiling = peak_i16 * 1e9 / (2 * madds_per_token)
        ceiling_f32 = peak_f32 * 1e9 / (2 * madds_per_token)
        print(
            f"# decoding step, the embedded model: {madds_per_token / 1e6:.1f}M multiply-adds a token in "
            f"weights; ceiling at the int16 peak {ceiling:.0f} tokens/s, at the float32 FMA peak "
            f"{ceiling_f32:.0f} (attention excluded)"
        )
        print(
            f"{'rows':>4} {'KV cache':>8} {'step ms':>8} {'tokens/s':>9} {'GFLOP/s':>8} {'x peak':>6} "
            f"{'x ceiling':>9} {'x f32 ceiling':>13}"
        )
        for rows in rows_list:
            starts = [int(n) - 1 for n in lengths[:rows]]
            tokens = [[int(t)] for t in rng.integers(100, 10000, rows)]
            best = dict.fromkeys(runners, float("inf"))
            for _ in range(repeats):
                for name, runner in runners.items():
                    begin = time.perf_counter()
                    runner.forward(0, tokens, starts)
                    best[name] = min(best[name], time.perf_counter() - begin)
            madds = rows * madds_per_token + attention_madds * sum(n for n in lengths[:rows])
            for name, runner in runners.items():
                rate = 2 * madds / best[name] / 1e9
                dtype = str(runner.cache.dtype).removeprefix("torch.")
                print(
                    f"{rows:>4} {dtype:>8} {best[name] * 1e3:>8.1f} {rows / best[name]:>9.1f} {rate:>8.1f} "
                    f"{rate / peak_i16:>6.2f} {rows / best[name] / ceiling:>9.2f} "
                    f"{rows / best[name] / ceiling_f32:>13.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
