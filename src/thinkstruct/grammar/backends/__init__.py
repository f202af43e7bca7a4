"""The grammar backends, by name."""

from __future__ import annotations

from typing import TYPE_CHECKING

from thinkstruct.grammar.base import GrammarBackend

if TYPE_CHECKING:
    from thinkstruct.grammar.json_format import JsonFormat
    from thinkstruct.tokenizer import Tokenizer

#: Names accepted wherever a backend is chosen.
BACKEND_NAMES = ("xgrammar", "llguidance", "outlines")


def backend_class(name: str) -> type[GrammarBackend]:
    """The backend class registered under ``name``."""
    if name == "xgrammar":
        from thinkstruct.grammar.backends.xgrammar_backend import XGrammarBackend

        return XGrammarBackend
    if name == "llguidance":
        from thinkstruct.grammar.backends.llguidance_backend import LLGuidanceBackend

        return LLGuidanceBackend
    if name == "outlines":
        from thinkstruct.grammar.backends.outlines_backend import OutlinesBackend

        return OutlinesBackend
    raise ValueError(f"unknown backend {name!r}; known backends: {', '.join(BACKEND_NAMES)}")


def create_backend(name: str, tokenizer: Tokenizer, *, json_format: JsonFormat | None = None) -> GrammarBackend:
    """A backend instance for ``tokenizer`` (the JSON format defaults to compact)."""
    from thinkstruct.grammar.json_format import JsonFormat

    return backend_class(name)(tokenizer, json_format=json_format or JsonFormat())
