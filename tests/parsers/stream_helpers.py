"""Helpers shared by the parsers tests (a plain module: conftest is not importable by name
when several test folders have one)."""

from __future__ import annotations

from collections.abc import Iterable

from thinkstruct.parsers import ParseResult, ReasoningParser


def run_stream(parser: ReasoningParser, chunks: Iterable[str]) -> tuple[list[ParseResult], ParseResult]:
    """Feed ``chunks`` then finish; the per-chunk results and their concatenation."""
    results = [parser.feed(chunk) for chunk in chunks]
    results.append(parser.finish())
    joined = ParseResult("".join(r.reasoning for r in results), "".join(r.content for r in results))
    return results, joined
