"""The grammar backends, by name: one :class:`~thinkstruct.registry.Registry` of backend
classes, each declaring its capabilities in one place (see
:class:`~thinkstruct.grammar.base.GrammarBackend`: kinds, inexact keywords, lenient
mode, worker compiles, preference ranks). ``auto``'s tables, the keyword analysis and
``docs/keyword_support.md``'s capability table are derived from these declarations.

Adding a backend: one module beside these with its ``GrammarBackend`` subclass, and one
``BACKENDS.register`` line below. Backend modules import their library lazily, so reading
the registry costs no library import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from thinkstruct.grammar.backends.llguidance_backend import LLGuidanceBackend
from thinkstruct.grammar.backends.outlines_backend import OutlinesBackend
from thinkstruct.grammar.backends.xgrammar_backend import XGrammarBackend
from thinkstruct.grammar.base import GrammarBackend
from thinkstruct.registry import Registry

if TYPE_CHECKING:
    from thinkstruct.grammar.json_format import JsonFormat
    from thinkstruct.tokenizer import Tokenizer

BACKENDS: Registry[type[GrammarBackend]] = Registry("grammar backend", type)
BACKENDS.register(XGrammarBackend)
BACKENDS.register(LLGuidanceBackend)
BACKENDS.register(OutlinesBackend)

#: Names accepted wherever a backend is chosen, in registration order.
BACKEND_NAMES: tuple[str, ...] = tuple(BACKENDS.snapshot())


def backend_class(name: str) -> type[GrammarBackend]:
    """The backend class registered under ``name``.

    Raises:
        UnknownName: no such backend (a ``KeyError`` listing the known ones).
    """
    return BACKENDS.get(name)


def backend_classes() -> list[type[GrammarBackend]]:
    """Every registered backend class, in registration order."""
    return list(BACKENDS.snapshot().values())


def create_backend(
    name: str, tokenizer: Tokenizer, *, json_format: JsonFormat | None = None, lenient: bool = False
) -> GrammarBackend:
    """A backend instance for ``tokenizer`` (the JSON format defaults to compact)."""
    from thinkstruct.grammar.json_format import JsonFormat

    return backend_class(name)(tokenizer, json_format=json_format or JsonFormat(), lenient=lenient)
