"""The backend interface: a backend compiles, a per-request grammar matches.

Everything else in thinkstruct hangs off three small types, all importable from here:

- :class:`GrammarBackend` compiles a :class:`~thinkstruct.Constraint` for one tokenizer
  into a :class:`CompiledGrammar`, or into an :class:`InvalidGrammar` that carries a
  user-facing :class:`~thinkstruct.InvalidConstraint`. It never raises for bad input.
- :class:`CompiledGrammar` (:mod:`thinkstruct.grammar.compiled`) is immutable and shared;
  :meth:`CompiledGrammar.matcher` makes a fresh, cheap per-request :class:`GrammarMatcher`.
- :class:`GrammarMatcher` (:mod:`thinkstruct.grammar.runtime.matcher`) follows one request's
  tokens and fills its row of the token bitmask.

Token bitmasks are int32 tensors of shape ``[batch, ceil(vocab_size / 32)]``: bit ``j``
of word ``i`` set means token ``32 * i + j`` is allowed. Every backend writes the same
bits, so one batch may mix backends.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from thinkstruct.errors import InvalidConstraint, UnsupportedConstraint
from thinkstruct.grammar.compiled import CompiledGrammar, CompileResult, InvalidGrammar
from thinkstruct.grammar.constraint import Constraint, ConstraintKind
from thinkstruct.grammar.json_format import COMPACT, JsonFormat
from thinkstruct.grammar.runtime.matcher import GrammarMatcher
from thinkstruct.grammar.schema.validation import check_constraint
from thinkstruct.grammar.service.probe import probe

if TYPE_CHECKING:
    from thinkstruct.tokenizer import Tokenizer

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
