"""The one-call entry points: :func:`compile` and :func:`accepts` (and, re-exported,
:func:`first_rejected` and :func:`can_stop` from :mod:`.answers`)."""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING

from thinkstruct.grammar.backends import create_backend
from thinkstruct.grammar.base import CompiledGrammar, GrammarBackend
from thinkstruct.grammar.json_format import JsonFormat
from thinkstruct.grammar.runtime.answers import can_stop, first_rejected
from thinkstruct.grammar.runtime.tag_checks import first_failed_check
from thinkstruct.grammar.service.compiler import CompilerConfig, GrammarCompiler

if TYPE_CHECKING:
    from thinkstruct.grammar.constraint import Constraint
    from thinkstruct.tokenizer import Tokenizer

_backends: weakref.WeakKeyDictionary[Tokenizer, dict[tuple[str, JsonFormat], GrammarBackend]] = (
    weakref.WeakKeyDictionary()
)
_backends_lock = threading.Lock()


def get_backend(tokenizer: Tokenizer, name: str, *, json_format: JsonFormat | None = None) -> GrammarBackend:
    """The shared backend instance for (tokenizer, name, JSON format)."""
    fmt = json_format or JsonFormat()
    with _backends_lock:
        per_tokenizer = _backends.setdefault(tokenizer, {})
        backend = per_tokenizer.get((name, fmt))
        if backend is None:
            backend = create_backend(name, tokenizer, json_format=fmt)
            per_tokenizer[(name, fmt)] = backend
    return backend


_compilers: weakref.WeakKeyDictionary[Tokenizer, dict[JsonFormat, GrammarCompiler]] = (
    weakref.WeakKeyDictionary()
)


def default_compiler(tokenizer: Tokenizer, *, json_format: JsonFormat | None = None) -> GrammarCompiler:
    """The shared :class:`GrammarCompiler` (default :class:`CompilerConfig`, so with its
    time limit and killable workers) behind :func:`compile` and :func:`accepts`."""
    fmt = json_format or JsonFormat()
    with _backends_lock:
        per_tokenizer = _compilers.setdefault(tokenizer, {})
        compiler = per_tokenizer.get(fmt)
        if compiler is None:
            compiler = GrammarCompiler(tokenizer, CompilerConfig(json_format=fmt))
            per_tokenizer[fmt] = compiler
    return compiler


def compile(
    constraint: Constraint,
    tokenizer: Tokenizer | None = None,
    backend: str = "auto",
    *,
    strict: bool = False,
    json_format: JsonFormat | None = None,
) -> CompiledGrammar:
    """Compile ``constraint`` for ``tokenizer`` (default: DeepSeek-V4).

    Goes through one shared :func:`default_compiler` per tokenizer and JSON format, so it
    is cached and bounded by the default time limit like any :class:`GrammarCompiler`.

    Args:
        backend: ``"auto"`` or a backend name (see :class:`CompilerConfig`).
        strict: with ``auto``, every keyword enforced: by the grammar or, where no
            backend's grammar can, checked as each value closes (``compiled.checks``);
            otherwise such keywords are ignored (``compiled.ignored_keywords``).

    Raises:
        InvalidConstraint: the constraint is malformed, or no backend asked for can enforce
            it; the message names the offending part.
        CompileTimeout: compiling took longer than the default time limit.
        ValueError: an unknown backend name.
    """
    from thinkstruct.tokenizer import Tokenizer

    tok = tokenizer or Tokenizer.default()
    return default_compiler(tok, json_format=json_format).compile(constraint, backend=backend, strict=strict)


def accepts(
    constraint: Constraint,
    text: str,
    *,
    tokenizer: Tokenizer | None = None,
    backend: str = "auto",
    strict: bool = False,
    json_format: JsonFormat | None = None,
) -> bool:
    """Whether ``text`` is a complete answer under ``constraint``.

    ``text`` is tokenized as plain text (no BOS; special tokens' texts stay characters),
    fed token by token, and accepted if every token is and a stop token would be allowed
    next; then, where the compiled grammar has checked keywords (a strict compile's
    fallback), every checked value must validate (``jsonschema``, format checker on), as
    in decoding.

    Raises:
        InvalidConstraint: as :func:`compile`.
    """
    compiled = compile(constraint, tokenizer, backend, strict=strict, json_format=json_format)
    if first_rejected(compiled, text) is not None:
        return False
    return compiled.checks is None or first_failed_check(compiled.checks, text) is None


__all__ = ["accepts", "can_stop", "compile", "default_compiler", "first_rejected", "get_backend"]
