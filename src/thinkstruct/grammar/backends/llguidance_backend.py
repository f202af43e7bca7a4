"""llguidance: JSON Schema, regex, EBNF (via Lark) and legacy structural tags, matched by a
lazy lexer and Earley parser (fast compiles, masks computed on demand)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from thinkstruct.errors import InvalidConstraint, UnsupportedConstraint
from thinkstruct.grammar.backends.library_errors import describe_library_error, describe_message
from thinkstruct.grammar.backends.regex_text import alternation
from thinkstruct.grammar.base import (
    NO_BACKEND_ENFORCES,
    CompiledGrammar,
    GrammarBackend,
    InvalidGrammar,
    schema_text,
)
from thinkstruct.grammar.constraint import Constraint, ConstraintKind
from thinkstruct.grammar.json_format import COMPACT, JsonFormat
from thinkstruct.grammar.runtime.matcher import StopTokenMatcher
from thinkstruct.grammar.runtime.row_pointer import row_address

if TYPE_CHECKING:
    import llguidance
    import torch

    from thinkstruct.tokenizer import Tokenizer


def ll_tokenizer(tokenizer: Tokenizer) -> llguidance.LLTokenizer:
    """llguidance's ``LLTokenizer`` for ``tokenizer`` (built once per tokenizer), with every
    added token a control token: llguidance keeps a non-special added token (DeepSeek's
    ``｜DSML｜``) as text a grammar may produce."""

    def build() -> llguidance.LLTokenizer:
        import llguidance

        return llguidance.LLTokenizer(
            tokenizer.all_special_json(),
            n_vocab=tokenizer.vocab_size,
            eos_token=list(tokenizer.eos_token_ids),
        )

    return tokenizer.cached("llguidance.tokenizer", build)


class LLGuidanceBackend(GrammarBackend):
    name = "llguidance"
    kinds = frozenset(ConstraintKind)
    inexact_keywords = NO_BACKEND_ENFORCES
    lenient_mode = True
    rank = dict.fromkeys(ConstraintKind, 0) | {ConstraintKind.STRUCTURAL_TAG: 1}
    # Its grammars accepted a known-valid instance for every one of the 993 MaskBench and
    # JSON-Schema-Test-Suite (2020-12) schemas it compiles; its dead grammars (row limits)
    # show in the first mask and its accepts, which the probe still checks.
    tries_witness = False

    def __init__(
        self, tokenizer: Tokenizer, *, json_format: JsonFormat = COMPACT, lenient: bool = False
    ) -> None:
        super().__init__(tokenizer, json_format=json_format, lenient=lenient)
        self._ll_tokenizer = ll_tokenizer(tokenizer)

    def _compile(self, constraint: Constraint) -> CompiledGrammar:
        import llguidance

        start = time.perf_counter()
        try:
            grammar = self._grammar_text(constraint)
        except InvalidConstraint:
            raise
        except Exception as e:  # noqa: BLE001 - a library error of any type is a refusal
            raise describe_library_error(e, constraint, self.name) from None
        # Building the matcher parses the grammar and builds the lexer (GIL released).
        pristine = llguidance.LLMatcher(
            self._ll_tokenizer,
            grammar,
            log_level=0,
            limits=llguidance.LLParserLimits(max_items_in_row=MAX_ROW_ITEMS),
        )
        if pristine.is_error():
            raise describe_message(pristine.get_error(), constraint, self.name)
        return LLGuidanceCompiled(
            constraint=constraint,
            backend=self.name,
            tokenizer=self.tokenizer,
            compile_seconds=time.perf_counter() - start,
            grammar=grammar,
            pristine=pristine,
            eos_ids=frozenset(self.tokenizer.eos_token_ids),
        )

    def runs_long(self, constraint: Constraint) -> bool:
        """Short text that may still take seconds: a schema whose merges (``allOf``,
        ``$ref`` beside other keywords) intersect more than :data:`INLINE_MERGE_COMBINATIONS`
        alternatives (see :mod:`..schema.merges`), or a regex, pattern or grammar whose
        counted repetitions unroll past :data:`INLINE_UNROLLED_ATOMS` (see :mod:`..schema.repetition`)."""
        from thinkstruct.grammar.schema.merges import merge_combinations
        from thinkstruct.grammar.schema.repetition import unrolled_size

        kind = constraint.kind
        if kind is ConstraintKind.REGEX or kind is ConstraintKind.EBNF:
            return unrolled_size(constraint.value) > INLINE_UNROLLED_ATOMS
        text = constraint.value  # compact JSON: a keyword in it reads '"name":'
        merges = '"allOf":' in text or '"$ref":' in text
        if not merges and '"pattern' not in text:
            return False  # the usual schema: nothing merged, no regex (no walk needed)
        if kind is ConstraintKind.JSON_SCHEMA:
            schemas = [constraint.document]
        elif kind is ConstraintKind.STRUCTURAL_TAG:
            schemas = [
                s.get("schema") for s in constraint.document.get("structures") or () if isinstance(s, dict)
            ]
        else:
            return False
        return any(
            (merges and merge_combinations(s) > INLINE_MERGE_COMBINATIONS)
            or any(unrolled_size(p) > INLINE_UNROLLED_ATOMS for p in _patterns(s))
            for s in schemas
        )

    def export(self, compiled: CompiledGrammar) -> None:
        """Nothing: llguidance grammars do not serialize. A worker's compile proves the
        grammar compiles (and passes its probe) in time; :meth:`load` builds it again."""
        return

    def load(self, constraint: Constraint, payload: Any, compile_seconds: float) -> CompiledGrammar:
        """Build in this process a grammar a worker compiled (its time is now known)."""
        result = self.compile(constraint, checked=True)
        if isinstance(result, InvalidGrammar):
            raise result.error
        return result

    def _grammar_text(self, constraint: Constraint) -> str:
        import llguidance

        kind = constraint.kind
        if kind is ConstraintKind.JSON_SCHEMA or kind is ConstraintKind.JSON_OBJECT:
            schema = schema_text(constraint)
            # Overrides, not defaults: a schema's own "x-guidance" must not re-enable
            # unbounded whitespace.
            return llguidance.LLMatcher.grammar_from_json_schema(
                schema,
                overrides=self._json_options(),  # type: ignore[arg-type]  # a TypedDict in its stubs
            )
        if kind is ConstraintKind.REGEX:
            return llguidance.LLMatcher.grammar_from_regex(constraint.value)
        if kind is ConstraintKind.EBNF:
            _check_alternatives(constraint)
            return llguidance.grammar_from("ebnf", constraint.value)
        if kind is ConstraintKind.CHOICE:
            # One regex lexeme, not a grammar rule per option: a rule of n alternatives
            # is an Earley row of n items (refused past MAX_ROW_ITEMS when the first token
            # comes) and compiles in time quadratic in n; the lexeme compiles 10,000
            # options in 0.1 s and masks in 0.1 ms.
            return llguidance.LLMatcher.grammar_from_regex(alternation(constraint.document))
        if kind is ConstraintKind.STRUCTURAL_TAG:
            return self._structural_tag(constraint)
        raise AssertionError(f"unhandled kind {kind}")

    def _structural_tag(self, constraint: Constraint) -> str:
        import llguidance

        tag = constraint.document
        if "structures" not in tag:
            raise UnsupportedConstraint(
                "the llguidance backend only takes the legacy {structures, triggers} structural tag form",
                kind=constraint.kind.value,
                backend=self.name,
            )
        triggers = tag.get("triggers") or []
        tags = []
        for i, s in enumerate(tag["structures"]):
            trigger = next((t for t in triggers if s["begin"].startswith(t)), None)
            if trigger is None:
                raise InvalidConstraint(
                    f"begin {s['begin']!r} starts with none of the triggers {triggers!r}",
                    pointer=f"/structures/{i}/begin",
                    kind=constraint.kind.value,
                )
            schema = s.get("schema")
            schema = {"allOf": [schema]} if isinstance(schema, bool) else dict(schema or {})
            # Inside Lark's %json the options travel in the schema's "x-guidance" key.
            schema["x-guidance"] = self._json_options()
            tags.append(llguidance.StructTag(trigger=trigger, begin=s["begin"], grammar=schema, end=s["end"]))
        return llguidance.StructTag.to_grammar(tags)

    def _json_options(self) -> dict[str, Any]:
        ws = self.json_format.max_whitespace
        options: dict[str, Any] = {
            "item_separator": ",",
            "key_separator": ":",
            "lenient": self.lenient,
        }
        if ws == 0:
            options["whitespace_flexible"] = False
        else:
            options["whitespace_flexible"] = True
            options["whitespace_pattern"] = self.json_format.whitespace_regex
        return options


#: Most intersections of alternatives a schema's merges may take for its compile to run on
#: a thread: about 0.3 ms each (measured: ``allOf`` of three 15-way ``anyOf`` lists,
#: 2,744 of them, 0.8 s; three 29-way lists 7.8 s; four, minutes), so at most about 0.1 s.
INLINE_MERGE_COMBINATIONS = 256

#: Most atoms a regex, pattern or grammar may unroll to for its compile to run on a thread:
#: about 1 µs each (``a{100000}`` 0.25 s), so at most about 0.05 s.
INLINE_UNROLLED_ATOMS = 50_000


def _patterns(schema: Any) -> Iterator[str]:
    """Every regex of a schema: its ``pattern`` values and ``patternProperties`` keys."""
    from thinkstruct.grammar.schema.walk import subschemas

    for node, _ in subschemas(schema):
        if isinstance(node.get("pattern"), str):
            yield node["pattern"]
        if isinstance(node.get("patternProperties"), dict):
            yield from node["patternProperties"]


#: Bytes a compiled llguidance grammar holds per character of its grammar text (measured).
LLGUIDANCE_BYTES_PER_CHAR = 160

#: llguidance's limit on the Earley items of one parser row, raised from its default of
#: 2,000: an ``anyOf`` of 2,010 objects or an object of 500 optional properties (2,007
#: items) otherwise compiles and then refuses the first token of every answer, and the
#: fallback, xgrammar, needs minutes for them. Measured on the 129k vocabulary with this
#: limit: anyOf of 2,010 objects masks in 0.2 ms at the median (7.5 ms for the first
#: mask), 500 optional properties in 2.8 ms (worst 17 ms), 1,200 in 1.2 ms (worst 29 ms).
#: Wider rows are refused by the probe, naming this limit.
MAX_ROW_ITEMS = 10_000


def _check_alternatives(constraint: Constraint) -> None:
    """Refuse an EBNF rule with more alternatives than one llguidance row holds, before
    any compile work (llguidance would only notice at the first token)."""
    widest, rule = _widest_alternation(constraint.value)
    if widest > MAX_ROW_ITEMS:
        raise UnsupportedConstraint(
            f"too many alternatives for llguidance: {widest:,} > limit {MAX_ROW_ITEMS:,} (rule {rule!r})",
            kind=constraint.kind.value,
        )


def _widest_alternation(grammar: str) -> tuple[int, str]:
    """The most ``|`` alternatives of one group (a rule body or a parenthesised group) in a
    GBNF grammar, and the rule it is in; strings, classes and comments are skipped."""
    widest, widest_rule = 0, ""
    rule = ""
    counts = [1]
    i, n = 0, len(grammar)
    while i < n:
        ch = grammar[i]
        if ch in "\"'":
            end = i + 1
            while end < n and grammar[end] != ch:
                end += 2 if grammar[end] == "\\" else 1
            i = end + 1
            continue
        if ch == "[":
            end = i + 1
            while end < n and grammar[end] != "]":
                end += 2 if grammar[end] == "\\" else 1
            i = end + 1
            continue
        if ch == "#":
            while i < n and grammar[i] != "\n":
                i += 1
            continue
        if grammar.startswith("::=", i):
            if counts[0] > widest:
                widest, widest_rule = counts[0], rule
            # A new rule: its name is the last word before "::=".
            rule = grammar[:i].rstrip().rsplit(None, 1)[-1] if grammar[:i].strip() else ""
            counts = [1]
            i += 3
            continue
        if ch == "(":
            counts.append(1)
        elif ch == ")" and len(counts) > 1:
            done = counts.pop()
            if done > widest:
                widest, widest_rule = done, rule
        elif ch == "|":
            counts[-1] += 1
        i += 1
    for done in counts:
        if done > widest:
            widest, widest_rule = done, rule
    return widest, widest_rule


@dataclass(frozen=True, eq=False)
class LLGuidanceCompiled(CompiledGrammar):
    grammar: str = field(default="", repr=False)
    pristine: Any = field(default=None, repr=False)
    eos_ids: frozenset[int] = frozenset()

    def _new_matcher(self) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(self)

    @property
    def _library_bytes(self) -> int:
        # llguidance exposes no size; measured (glibc's in-use heap, compile plus first
        # mask, 129k vocabulary) at 30-150 bytes per character of grammar text for enums,
        # objects, patterns and anyOf alike (benchmarks/grammar_memory.py): counted here
        # at the top of that range. The lexer states its matchers add while masks are
        # computed are not counted (bounded by llguidance's max_lexer_states).
        return len(self.grammar) * LLGUIDANCE_BYTES_PER_CHAR + 256 * 1024


class LLGuidanceMatcher(StopTokenMatcher):
    __slots__ = ("_compiled", "_m")

    def __init__(self, compiled: LLGuidanceCompiled) -> None:
        super().__init__(compiled.eos_ids, start_row=compiled.start_row)
        self._compiled = compiled
        # A deep copy of the compiled matcher skips re-parsing the grammar.
        self._m = compiled.pristine.deep_copy()

    def _advance(self, token_id: int) -> bool:
        # try_consume_tokens stops at a refused token without entering the error state.
        consumed: int = self._m.try_consume_tokens([token_id])  # typed here, not converted
        return consumed == 1

    def _advance_many(self, token_ids: Sequence[int]) -> int:
        return int(self._m.try_consume_tokens(list(token_ids)))

    def _rollback(self, num_tokens: int) -> None:
        self._m.rollback(num_tokens)

    def _fill(self, bitmask: torch.Tensor, row: int) -> None:
        address, words = row_address(bitmask, row)
        self._m.unsafe_compute_mask_ptr(address, words * 4)

    def _can_stop(self) -> bool:
        return bool(self._m.is_accepting())

    def _forced(self) -> list[int]:
        return list(self._m.compute_ff_tokens())

    def _validate(self, token_ids: Sequence[int]) -> int:
        return int(self._m.validate_tokens(list(token_ids))) if token_ids else 0

    def library_error(self) -> str | None:
        """llguidance's error text once the matcher has failed (a parser limit), else ``None``."""
        return str(self._m.get_error()) if self._m.is_error() else None

    def copy(self) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(self._compiled)
