"""The backend interface: a backend compiles, a per-request grammar matches.

Everything else in thinkstruct hangs off three small types:

- :class:`GrammarBackend` compiles a :class:`~thinkstruct.Constraint` for one tokenizer
  into a :class:`CompiledGrammar`, or into an :class:`InvalidGrammar` that carries a
  user-facing :class:`~thinkstruct.InvalidConstraint`. It never raises for bad input.
- :class:`CompiledGrammar` is immutable and shared; :meth:`CompiledGrammar.matcher`
  makes a fresh, cheap per-request :class:`GrammarMatcher`.
- :class:`GrammarMatcher` (:mod:`thinkstruct.grammar.runtime.matcher`) follows one request's
  tokens and fills its row of the token bitmask.

Token bitmasks are int32 tensors of shape ``[batch, ceil(vocab_size / 32)]``: bit ``j``
of word ``i`` set means token ``32 * i + j`` is allowed. Every backend writes the same
bits, so one batch may mix backends.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from thinkstruct.errors import InvalidConstraint, UnsupportedConstraint
from thinkstruct.grammar.constraint import Constraint, ConstraintKind
from thinkstruct.grammar.json_format import COMPACT, JsonFormat
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

__all__ = [
    "NO_BACKEND_ENFORCES",
    "CompileResult",
    "CompiledGrammar",
    "GrammarBackend",
    "GrammarMatcher",
    "InvalidGrammar",
    "schema_text",
]


def schema_text(constraint: Constraint) -> str:
    """The JSON schema a JSON constraint hands a backend (boolean schemas spelled out,
    since not every backend takes them)."""
    if constraint.kind is ConstraintKind.JSON_OBJECT:
        return '{"type":"object"}'
    if constraint.value == "true":
        return "{}"
    if constraint.value == "false":
        raise InvalidConstraint(
            "the schema false matches no value, so no answer is possible", pointer="", kind="json_schema"
        )
    return constraint.value


#: JSON Schema assertion keywords no backend here enforces (not expressible as a grammar,
#: or not implemented by the libraries): every backend lists them as inexact. Measured by
#: tests/grammar/test_conformance.py (see docs/keyword_support.md).
NO_BACKEND_ENFORCES = frozenset(
    {
        "not", "uniqueItems", "contains", "minContains", "maxContains", "if", "then", "else",
        "dependentRequired", "dependentSchemas", "dependencies", "propertyNames",
        "unevaluatedProperties", "unevaluatedItems", "oneOf", "$dynamicRef", "$recursiveRef",
    }
)  # fmt: skip


class GrammarBackend(abc.ABC):
    """Compiles constraints for one tokenizer with one library.

    One instance per (tokenizer, backend, options). ``compile`` is safe to call from
    several threads at once. A subclass declares what it can do in its class attributes
    (the one place each backend fact lives; the registry in
    :mod:`thinkstruct.grammar.backends` and ``auto`` read them).
    """

    name: ClassVar[str]
    #: Constraint kinds it compiles.
    kinds: ClassVar[frozenset[ConstraintKind]]
    #: JSON Schema assertion keywords it does not enforce exactly (it refuses them, or
    #: lets invalid instances through).
    inexact_keywords: ClassVar[frozenset[str]] = NO_BACKEND_ENFORCES
    #: It has a lenient mode that ignores the keywords it cannot enforce (``lenient=True``).
    lenient_mode: ClassVar[bool] = False
    #: It compiles schemas with its inexact keywords as they are, ignoring them silently,
    #: so ``auto`` may use it as a lenient fallback without a mode.
    ignores_inexact: ClassVar[bool] = False
    #: Compiles run in native code that cannot be interrupted and may take minutes, so
    #: the compile service runs them in a worker process it can kill (see :meth:`export`
    #: and :meth:`load`).
    isolated: ClassVar[bool] = False
    #: The compile probe also feeds a known-valid instance to each JSON-Schema grammar
    #: (:mod:`.probe`, step 3): the library has compiled schemas into grammars that reject
    #: every valid instance. A backend measured never to do so may skip it (~0.5-1 ms of
    #: every cold compile).
    tries_witness: ClassVar[bool] = True
    #: ``auto``'s preference per kind: lower is tried first; a kind missing here is never
    #: chosen by ``auto`` (it may still be asked for by name).
    rank: ClassVar[Mapping[ConstraintKind, int]] = {}

    def __init__(
        self, tokenizer: Tokenizer, *, json_format: JsonFormat = COMPACT, lenient: bool = False
    ) -> None:
        if lenient and not self.lenient_mode:
            raise ValueError(f"the {self.name} backend has no lenient mode")
        self.tokenizer = tokenizer
        self.json_format = json_format
        #: Ignore the keywords it cannot enforce instead of refusing the schema.
        self.lenient = lenient

    def compile(self, constraint: Constraint, *, checked: bool = False) -> CompileResult:
        """Compile, or return an :class:`InvalidGrammar` naming what is wrong.

        Args:
            checked: the caller already ran :func:`~thinkstruct.grammar.schema.validation.check_constraint`
                on this constraint (the compile service does, once for all backends).
        """
        if constraint.kind not in self.kinds:
            return self.invalid(
                constraint,
                UnsupportedConstraint(
                    f"the {self.name} backend cannot enforce a {constraint.kind.value} constraint",
                    backend=self.name,
                    kind=constraint.kind.value,
                ),
            )
        from thinkstruct.grammar.schema.validation import check_constraint
        from thinkstruct.grammar.service.probe import probe

        try:
            if not checked:
                check_constraint(constraint)
            compiled = self._compile(constraint)
        except InvalidConstraint as e:
            if e.backend is None:
                e.backend = self.name
            return self.invalid(constraint, e)
        # A grammar that compiles but can produce nothing valid counts as a failure.
        problem = probe(compiled, witness=self.tries_witness)
        return compiled if problem is None else self.invalid(constraint, problem)

    def runs_long(self, constraint: Constraint) -> bool:
        """Whether compiling this checked constraint may take long although its text is
        short, so the compile service runs it in a worker it can kill rather than on a
        thread (backends that always do, :attr:`isolated`, need not say)."""
        return False

    def invalid(self, constraint: Constraint, error: InvalidConstraint) -> InvalidGrammar:
        return InvalidGrammar(constraint, self.name, error)

    @abc.abstractmethod
    def _compile(self, constraint: Constraint) -> CompiledGrammar:
        """Compile a checked constraint of a supported kind; raise InvalidConstraint if the
        library refuses it."""

    def export(self, compiled: CompiledGrammar) -> Any:
        """A picklable form of ``compiled`` for :meth:`load` in another process."""
        raise NotImplementedError(f"{self.name} grammars are compiled in-process")

    def load(self, constraint: Constraint, payload: Any, compile_seconds: float) -> CompiledGrammar:
        """Rebuild a grammar exported by :meth:`export` against this backend's tokenizer."""
        raise NotImplementedError(f"{self.name} grammars are compiled in-process")

    def options_key(self) -> tuple[object, ...]:
        """The options that change what ``compile`` produces (part of the cache key)."""
        return (self.name, self.json_format, self.lenient)
