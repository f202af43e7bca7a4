"""What a compile produces: :class:`CompiledGrammar`, or :class:`InvalidGrammar`.

A :class:`CompiledGrammar` is immutable and shared by every request with its constraint;
:meth:`CompiledGrammar.matcher` makes a fresh, cheap per-request
:class:`~thinkstruct.grammar.runtime.matcher.GrammarMatcher` (wrapped in a
:class:`~thinkstruct.grammar.runtime.reasoning.ReasoningGrammar` for a reasoning model).
An :class:`InvalidGrammar` carries the user-facing error of a constraint a backend cannot
compile.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from thinkstruct.errors import InvalidConstraint
from thinkstruct.grammar.constraint import Constraint, ConstraintKind
from thinkstruct.grammar.runtime.matcher import GrammarMatcher, StopTokenMatcher
from thinkstruct.grammar.runtime.reasoning import ReasoningGrammar
from thinkstruct.grammar.schema.checks import KeywordEnforcement
from thinkstruct.grammar.schema.keywords import assertions

if TYPE_CHECKING:
    import torch

    from thinkstruct.grammar.schema.tag_checks import Checks
    from thinkstruct.tokenizer import Tokenizer


@dataclass(frozen=True, eq=False)
class CompiledGrammar(abc.ABC):
    """A constraint compiled for one tokenizer by one backend; shared and immutable."""

    constraint: Constraint
    backend: str
    tokenizer: Tokenizer = field(repr=False)
    #: Seconds the backend spent compiling.
    compile_seconds: float = 0.0

    #: JSON Schema keywords this grammar does not enforce (JSON pointers), when a
    #: lenient compile ignored them; empty when the constraint is enforced exactly.
    ignored_keywords: tuple[str, ...] = ()

    #: The keywords this grammar does not enforce and which are checked as each value
    #: closes instead (a strict compile's fallback; see
    #: :mod:`thinkstruct.grammar.runtime.value_checks`; in a structural tag, each tag's
    #: JSON: :mod:`thinkstruct.grammar.runtime.tag_checks`); ``None`` when nothing is checked.
    checks: Checks | None = None
    #: The backend the compile was asked for: ``"auto"``, or a backend's name (then
    #: ``backend`` is that name, with its checks or ignored keywords).
    requested: str = "auto"

    #: The grammar's first mask (int32 ``[ceil(vocab_size / 32)]``), kept by the compile
    #: probe so that a fresh matcher's first fill is a 16 KB copy, not a recompute.
    start_row: torch.Tensor | None = field(default=None, repr=False)

    #: The probe's matcher, back at the start state: the first :meth:`matcher` call
    #: takes it instead of building one (at most one; see :meth:`keep_start_row`).
    _spare: list[GrammarMatcher] = field(default_factory=list, init=False, repr=False)

    def matcher(
        self,
        *,
        reasoning: bool = False,
        max_reasoning_tokens: int | None = None,
        stops_end_thought: bool = False,
        banned_ids_while_thinking: Iterable[int] = (),
        end_tag: str | None = None,
    ) -> GrammarMatcher:
        """A fresh per-request matcher.

        Args:
            reasoning: the model thinks first; the grammar applies after its end tag
                (see :class:`~thinkstruct.grammar.runtime.reasoning.ReasoningGrammar`). With
                ``False`` the answer starts at once and the plain backend matcher is
                returned.
            max_reasoning_tokens: thinking budget in tokens; once spent, only the end tag
                is allowed until it is complete.
            stops_end_thought: a stop token sampled while thinking ends the thought,
                not the response (the engine forces the end tag in its place). By
                default every stop id is masked until the thought is closed.
            banned_ids_while_thinking: further ids masked while thinking (a family's
                tool-call tokens, say).
            end_tag: the text that ends the thought (default: the tokenizer's).
        """
        inner = self._take_spare() or self._new_matcher()
        if not reasoning:
            return inner
        return ReasoningGrammar.wrap(
            inner,
            self.tokenizer,
            max_reasoning_tokens=max_reasoning_tokens,
            stops_end_thought=stops_end_thought,
            banned_ids_while_thinking=banned_ids_while_thinking,
            end_tag=end_tag,
        )

    @abc.abstractmethod
    def _new_matcher(self) -> GrammarMatcher:
        """A fresh backend matcher at the start of the grammar."""

    def keep_start_row(self, row: torch.Tensor, *, spare: StopTokenMatcher | None = None) -> None:
        """Remember ``row``, a mask filled at the start state, as :attr:`start_row`
        (the compile probe calls this once, before the grammar is shared). The row is kept
        as given, not copied: pass one nothing else writes to.

        Args:
            spare: a matcher of this grammar at its start state that nobody else holds
                (the probe's own): handed out by the first :meth:`matcher` call, so the
                first request neither builds a matcher nor asks the library for its
                first mask.
        """
        object.__setattr__(self, "start_row", row)
        if spare is not None:
            spare.adopt_start_row(row)
            self._spare[:] = [spare]

    def renamed(
        self,
        constraint: Constraint,
        *,
        ignored_keywords: tuple[str, ...],
        checks: Checks | None = None,
        requested: str = "auto",
    ) -> CompiledGrammar:
        """This grammar under another name for its constraint (the one a request asked
        for, where a backend compiled a rewrite), its spare matcher moved along."""
        named = dataclasses.replace(
            self, constraint=constraint, ignored_keywords=ignored_keywords, checks=checks, requested=requested
        )
        spare = self._take_spare()
        if spare is not None:
            named._spare.append(spare)
        return named

    def enforcement(self) -> tuple[KeywordEnforcement, ...]:
        """How each assertion keyword of a JSON schema (or of the schemas in a structural
        tag that checks some) is enforced: by this grammar, checked as values close, or
        ignored (a lenient compile); ``()`` for other kinds."""
        if self.checks is not None:
            return self.checks.enforcement
        if self.constraint.kind is not ConstraintKind.JSON_SCHEMA:
            return ()
        ignored = set(self.ignored_keywords)
        found = [
            KeywordEnforcement(keyword, pointer, "ignored" if pointer in ignored else "grammar")
            for keyword, pointer in assertions(self.constraint.document)
        ]
        # Pointers into auto's rewrite of the schema that the schema as asked lacks.
        found += [
            KeywordEnforcement(pointer.rsplit("/", 1)[-1], pointer, "ignored")
            for pointer in sorted(ignored - {e.pointer for e in found})
        ]
        return tuple(found)

    def _take_spare(self) -> GrammarMatcher | None:
        try:
            return self._spare.pop()  # atomic: two threads never get the same one
        except IndexError:
            return None

    @property
    def memory_bytes(self) -> int:
        """Approximate memory the compiled grammar holds (for cache accounting)."""
        row = self.start_row
        return self._library_bytes + (0 if row is None else row.numel() * row.element_size())

    @property
    def _library_bytes(self) -> int:
        """What the library's compiled form holds."""
        return len(self.constraint.value) * 4 + 1024


@dataclass(frozen=True)
class InvalidGrammar:
    """The result of compiling a constraint a backend cannot compile."""

    constraint: Constraint
    backend: str
    error: InvalidConstraint

    def raise_error(self) -> None:
        raise self.error


CompileResult = CompiledGrammar | InvalidGrammar

__all__ = ["CompileResult", "CompiledGrammar", "InvalidGrammar"]
