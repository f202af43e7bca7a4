"""What crosses from the ingress to an engine replica: :class:`WireRequest`.

A compiled grammar holds its tokenizer and backend state and does not travel; the
replica compiles the constraint again with its own compiler (and caches it there), with
the backend the ingress's compile resolved, so both hold the same grammar.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from thinkstruct.engine import GenerationRequest
    from thinkstruct.grammar.base import CompiledGrammar
    from thinkstruct.grammar.constraint import Constraint


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    """A constraint, the backend that compiled it at the ingress, and whether it is held
    exactly (a lenient compile that ignored keywords is not). A grammar that checks or
    ignores keywords travels as the backend asked for: ``auto``'s fallbacks (a lenient
    mode, a relaxed schema) as ``auto``, whose plan is the same on every replica; a
    backend asked for by name as that name (its checks are the same everywhere too)."""

    constraint: Constraint
    backend: str
    strict: bool


@dataclass(frozen=True, slots=True)
class WireRequest:
    """A generation request without its compiled grammar, what to compile it from, and
    the ingress that sent it (its deltas share that ingress's streams, see
    :mod:`.outbox`)."""

    request: GenerationRequest
    grammar: GrammarSpec | None
    ingress: str = ""

    @property
    def prompt_ids(self) -> list[int]:
        return self.request.prompt_ids

    @classmethod
    def of(
        cls, request: GenerationRequest, grammar: CompiledGrammar | None, *, ingress: str = ""
    ) -> WireRequest:
        """``request`` to send from ``ingress``, with ``grammar``, its compiled grammar
        (resolved: a future does not travel)."""
        spec = None
        if grammar is not None:
            fallback = grammar.checks is not None or bool(grammar.ignored_keywords)
            spec = GrammarSpec(
                grammar.constraint,
                grammar.requested if fallback else grammar.backend,
                strict=not grammar.ignored_keywords,
            )
        return cls(request=dataclasses.replace(request, grammar=None), grammar=spec, ingress=ingress)

    def with_grammar(self, compiled: CompiledGrammar | None) -> GenerationRequest:
        """The request for the local engine, with the replica's own compiled grammar."""
        return dataclasses.replace(self.request, grammar=compiled)
