"""The compile cache's byte budget holds in real memory (RSS), not only in its own count."""

from __future__ import annotations

import gc

import psutil

from thinkstruct import Constraint, Tokenizer
from thinkstruct.grammar.service.compiler import CompilerConfig, GrammarCompiler

#: What RSS may exceed the budget by: allocator slack and the interpreter's own garbage.
MARGIN_BYTES = 32 << 20


def heavy(i: int, width: int = 400) -> Constraint:
    """A distinct anyOf of ``width`` one-property objects (about 35 KB of schema text; each
    compiled grammar holds about 4.5 MB)."""
    return Constraint.json_schema(
        {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {f"k{i}_{j}": {"type": "integer"}},
                    "required": [f"k{i}_{j}"],
                }
                for j in range(width)
            ]
        }
    )


def test_filling_the_cache_keeps_rss_within_the_byte_budget(tokenizer: Tokenizer) -> None:
    budget = 48 << 20
    config = CompilerConfig(backend="llguidance", cache_bytes=budget, worker_processes=0)
    with GrammarCompiler(tokenizer, config) as compiler:
        compiler.compile(heavy(-1))  # the backend's vocabulary view and first allocations
        compiler.compile(heavy(-2))
        gc.collect()
        before = psutil.Process().memory_info().rss
        for i in range(40):
            compiler.compile(heavy(i))
        gc.collect()
        grown = psutil.Process().memory_info().rss - before
        stats = compiler.stats
        print(
            f"\n40 heavy grammars: RSS +{grown / 2**20:.1f} MB; cache holds {stats.entries} "
            f"accounted at {stats.bytes / 2**20:.1f} MB (budget {budget / 2**20:.0f} MB), "
            f"{stats.evictions} evicted"
        )
        assert stats.bytes <= budget
        assert stats.evictions > 0  # the budget, not the entry count, bounded the cache
        assert grown <= budget + MARGIN_BYTES
