"""What compiled grammars really hold, against what the compile cache accounts for them.

For each backend, a :class:`~thinkstruct.grammar.service.compiler.GrammarCompiler` (its real
workers: xgrammar and outlines-core compile in worker processes and are loaded here) is
filled with distinct heavy grammars, first with a budget that holds them all, then with a
small byte budget. Printed per backend: the process's RSS growth and glibc's in-use heap
growth (``mallinfo2``: what the libraries really hold, whatever RSS the allocator keeps),
against the bytes the cache accounted (``CompiledGrammar.memory_bytes``), and the ratio;
then, for the small budget, RSS growth against the budget. The accounting is calibrated
on these numbers (see each backend's ``memory_bytes``). Nothing asserts; the regression
test is ``tests/grammar/test_memory.py``.

    .venv/bin/python benchmarks/grammar_memory.py                 # all backends
    .venv/bin/python benchmarks/grammar_memory.py --backends llguidance --count 40
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import sys
import time
from typing import Any

#: backend -> (what the heavy grammar is, how to build the i-th one)
SHAPES = {
    "llguidance": ("anyOf of 400 objects (35 KB)", lambda i: _any_of(i, 400)),
    "xgrammar": ("object of 60 string properties", lambda i: _properties(i, 60)),
    "outlines": ("object of 20 string properties", lambda i: _properties(i, 20)),
}


def _any_of(i: int, width: int) -> dict[str, Any]:
    return {
        "anyOf": [
            {"type": "object", "properties": {f"k{i}_{j}": {"type": "integer"}}, "required": [f"k{i}_{j}"]}
            for j in range(width)
        ]
    }


def _properties(i: int, width: int) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {f"p{i}_{j}": {"type": "string"} for j in range(width)},
        "required": [f"p{i}_0"],
    }


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _heap_in_use() -> int:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        info = libc.mallinfo2()
        return int(info.uordblks + info.hblkhd)
    except (OSError, AttributeError):  # not glibc
        return 0


def _rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def fill(backend: str, count: int, budget: int) -> dict[str, float]:
    from thinkstruct import Constraint, Tokenizer
    from thinkstruct.grammar.service.compiler import CompilerConfig, GrammarCompiler

    _, make = SHAPES[backend]
    config = CompilerConfig(backend=backend, cache_bytes=budget, timeout_s=600.0)
    with GrammarCompiler(Tokenizer.default(), config) as compiler:
        compiler.warm_up((backend,))
        compiler.compile(Constraint.json_schema(make(-1)))  # first allocations, views
        gc.collect()
        rss, heap = _rss(), _heap_in_use()
        start = time.perf_counter()
        for i in range(count):
            compiler.compile(Constraint.json_schema(make(i)))
        gc.collect()
        return {
            "seconds": time.perf_counter() - start,
            "rss": _rss() - rss,
            "heap": _heap_in_use() - heap,
            "accounted": compiler.stats.bytes,
            "entries": compiler.stats.entries,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backends", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--count", type=int, default=12, help="distinct grammars per backend")
    args = parser.parse_args(argv)
    mb = 2**20
    print(
        "| backend | grammar | n | RSS growth | heap in use | accounted | heap / accounted | "
        "small budget | RSS growth under it | heap in use under it | entries kept |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for backend in args.backends:
        full = fill(backend, args.count, 64 << 30)
        budget = max(int(full["accounted"] / 4), 1)
        small = fill(backend, args.count, budget)
        ratio = full["heap"] / full["accounted"] if full["accounted"] else float("nan")
        print(
            f"| {backend} | {SHAPES[backend][0]} | {args.count} | {full['rss'] / mb:.1f} MB | "
            f"{full['heap'] / mb:.1f} MB | {full['accounted'] / mb:.1f} MB | {ratio:.2f} | "
            f"{budget / mb:.1f} MB | {small['rss'] / mb:.1f} MB | {small['heap'] / mb:.1f} MB | "
            f"{small['entries']:.0f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
