"""outlines-core: regular languages only (JSON Schema through its regex translation, regex,
choice), compiled to a token-level DFA index over the whole vocabulary."""

from __future__ import annotations

import pickle
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from thinkstruct.errors import InvalidConstraint, UnsupportedConstraint
from thinkstruct.grammar.backends.library_errors import describe_library_error
from thinkstruct.grammar.backends.regex_text import alternation
from thinkstruct.grammar.base import NO_BACKEND_ENFORCES, CompiledGrammar, GrammarBackend, schema_text
from thinkstruct.grammar.constraint import Constraint, ConstraintKind, escape_pointer
from thinkstruct.grammar.runtime.bitmask import set_allowed
from thinkstruct.grammar.runtime.matcher import StopTokenMatcher
from thinkstruct.grammar.runtime.row_pointer import row_address
from thinkstruct.grammar.schema.walk import subschemas

if TYPE_CHECKING:
    import outlines_core
    import torch

    from thinkstruct.tokenizer import Tokenizer

#: Most tokens a matcher can roll back (outlines-core keeps a bounded state history).
MAX_ROLLBACK_TOKENS = 4096

#: How deep outlines-core unrolls recursive schemas (``$ref`` cycles, free-form objects).
MAX_RECURSION_DEPTH = 3


def vocabulary(tokenizer: Tokenizer) -> outlines_core.Vocabulary:
    """outlines-core's ``Vocabulary`` for ``tokenizer`` (built once per tokenizer): the
    text tokens only, keyed by their bytes, so no special token is ever in a mask."""

    def build() -> outlines_core.Vocabulary:
        import outlines_core

        by_bytes: dict[bytes, list[int]] = {}
        for idx, raw in enumerate(tokenizer.decoded_vocab()):
            if raw and idx not in tokenizer.special_token_ids:
                by_bytes.setdefault(raw, []).append(idx)
        return outlines_core.Vocabulary(tokenizer.eos_token_ids[0], by_bytes)

    return tokenizer.cached("outlines.vocabulary", build)


class OutlinesBackend(GrammarBackend):
    name = "outlines"
    kinds = frozenset(
        {
            ConstraintKind.JSON_SCHEMA,
            ConstraintKind.JSON_OBJECT,
            ConstraintKind.REGEX,
            ConstraintKind.CHOICE,
        }
    )
    inexact_keywords = NO_BACKEND_ENFORCES | {
        "allOf", "multipleOf", "format", "minProperties", "maxProperties",
        "patternProperties", "additionalItems", "additionalProperties",
        "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    }  # fmt: skip
    isolated = True
    # json_object is left out: a free-form value takes outlines-core minutes to index.
    rank: ClassVar[Mapping[ConstraintKind, int]] = {
        ConstraintKind.JSON_SCHEMA: 2,
        ConstraintKind.REGEX: 2,
        ConstraintKind.CHOICE: 2,
    }

    def _compile(self, constraint: Constraint) -> CompiledGrammar:
        import outlines_core

        start = time.perf_counter()
        try:
            regex = self.regex_for(constraint)
            index = outlines_core.Index(regex, vocabulary(self.tokenizer))
        except InvalidConstraint:
            raise
        except BaseException as e:  # a Rust panic surfaces as PanicException(BaseException)
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            raise describe_library_error(e, constraint, self.name) from None
        return self._wrap(constraint, index, regex, time.perf_counter() - start)

    def export(self, compiled: CompiledGrammar) -> tuple[Any, str]:
        assert isinstance(compiled, OutlinesCompiled)
        return compiled.index, compiled.regex  # the index pickles itself

    def load(self, constraint: Constraint, payload: Any, compile_seconds: float) -> OutlinesCompiled:
        index, regex = payload
        return self._wrap(constraint, index, regex, compile_seconds)

    def _wrap(self, constraint: Constraint, index: Any, regex: str, seconds: float) -> OutlinesCompiled:
        eos = self.tokenizer.eos_token_ids
        return OutlinesCompiled(
            size_bytes=len(pickle.dumps(index)) + len(regex),
            constraint=constraint,
            backend=self.name,
            tokenizer=self.tokenizer,
            compile_seconds=seconds,
            index=index,
            regex=regex,
            eos_ids=frozenset(eos),
            extra_eos_ids=tuple(eos[1:]),
            forced={},
        )

    def regex_for(self, constraint: Constraint) -> str:
        """The regex outlines-core enforces for ``constraint``."""
        kind = constraint.kind
        if kind is ConstraintKind.REGEX:
            return constraint.value
        if kind is ConstraintKind.CHOICE:
            return alternation(constraint.document)
        import outlines_core

        if constraint.kind is ConstraintKind.JSON_SCHEMA:
            _refuse_control_characters(constraint)
        schema = schema_text(constraint)
        ws = self.json_format.whitespace_regex
        regex = outlines_core.json_schema.build_regex_from_schema(
            schema, ws or "", max_recursion_depth=MAX_RECURSION_DEPTH
        )
        return _align_array_separators(regex, ws) if ws else regex


# A pattern that mentions a control character, as itself or as a regex escape.
_CONTROL = re.compile(
    r"[\x00-\x1f]|\\(?:x[01][0-9a-fA-F]|x\{0*1?[0-9a-fA-F]\}|u00[01][0-9a-fA-F]|[0nrtfvae]|c)"
)


def _refuse_control_characters(constraint: Constraint) -> None:
    """outlines-core matches a ``pattern`` and a property name against the JSON *text*,
    where a control character can only appear escaped (``\\u0000``): it would accept
    the escape a pattern forbids (``[^\\u0000]``) and require a raw control character in
    a key, which is not JSON. Such schemas are refused (``auto`` uses another backend)."""
    for node, pointer in subschemas(constraint.document):
        where = []
        if isinstance(node.get("pattern"), str):
            where.append((node["pattern"], f"{pointer}/pattern"))
        for keyword in ("properties", "patternProperties"):
            if isinstance(node.get(keyword), dict):
                where += [(name, f"{pointer}/{keyword}/{escape_pointer(name)}") for name in node[keyword]]
        for text, at in where:
            if _CONTROL.search(text):
                raise UnsupportedConstraint(
                    "outlines-core cannot enforce a pattern or property name with control "
                    "characters (it matches them against the escaped JSON text)",
                    pointer=at,
                    kind=constraint.kind.value,
                )


# outlines-core writes array items as `item(,WS item)*` while objects (and xgrammar and
# llguidance everywhere) allow `WS,WS`; add the missing run so all backends accept the same
# whitespace. Only an unescaped "(," followed by the whitespace run is an array separator.
def _align_array_separators(regex: str, ws: str) -> str:
    pattern = re.compile(r"(?<!\\)((?:\\\\)*)\(," + re.escape(ws))
    return pattern.sub(lambda m: m.group(1) + "(" + ws + "," + ws, regex)


@dataclass(frozen=True, eq=False)
class OutlinesCompiled(CompiledGrammar):
    index: Any = field(default=None, repr=False)
    regex: str = field(default="", repr=False)
    eos_ids: frozenset[int] = frozenset()
    #: Stop ids beyond the first (outlines-core's vocabulary knows a single EOS id).
    extra_eos_ids: tuple[int, ...] = ()
    #: Per-state cache for jump-forward: state -> (forced byte's token, next state) or None.
    forced: dict[int, tuple[int, int] | None] = field(default_factory=dict, repr=False)
    #: Serialized size of the index, as an estimate of its memory.
    size_bytes: int = 0

    @property
    def _library_bytes(self) -> int:
        # The index in memory is 2.0-2.7 times its pickle (measured: glibc's in-use heap
        # against the pickled size, benchmarks/grammar_memory.py).
        return int(self.size_bytes * 2.75) + 64 * 1024

    def _new_matcher(self) -> OutlinesMatcher:
        return OutlinesMatcher(self)


class OutlinesMatcher(StopTokenMatcher):
    __slots__ = ("_compiled", "_extra_eos", "_guide", "_target", "_write")

    def __init__(self, compiled: OutlinesCompiled) -> None:
        super().__init__(compiled.eos_ids, start_row=compiled.start_row)
        self._compiled = compiled
        import outlines_core

        self._guide = outlines_core.Guide(compiled.index, max_rollback=MAX_ROLLBACK_TOKENS)
        # Bound once: fills are the hot path and most of their cost is Python overhead.
        self._write = self._guide.write_mask_into
        self._extra_eos = compiled.extra_eos_ids
        # (bitmask, its data pointer, row, address, words) of the last fill: a request
        # usually keeps its row from step to step, so the checks are skipped then.
        self._target: tuple[Any, int, int, int, int] | None = None

    def _advance(self, token_id: int) -> bool:
        try:
            self._guide.advance(token_id, return_tokens=False)
        except ValueError:  # no transition: the guide's state is unchanged
            return False
        return True

    def _rollback(self, num_tokens: int) -> None:
        self._guide.rollback_state(num_tokens)

    def _fill(self, bitmask: torch.Tensor, row: int) -> None:
        target = self._target
        if (
            target is not None
            and target[0] is bitmask
            and target[2] == row
            and target[1] == bitmask.data_ptr()
        ):
            address, words = target[3], target[4]
        else:
            address, words = row_address(bitmask, row)
            self._target = (bitmask, bitmask.data_ptr(), row, address, words)
        self._write(address, words, 4)
        if self._extra_eos and self._guide.is_finished():
            for t in self._extra_eos:
                set_allowed(bitmask, row, t)

    def _can_stop(self) -> bool:
        return bool(self._guide.is_finished())

    def _validate(self, token_ids: Sequence[int]) -> int:
        # Walked on the index itself: no state change, and no bound on the length (the
        # guide's rollback history is bounded).
        index = self._compiled.index
        state = self._guide.get_state()
        for n, token_id in enumerate(token_ids):
            state = index.get_next_state(state, token_id)
            if state is None:
                return n
        return len(token_ids)

    def _forced(self) -> list[int]:
        """Follow the states where every allowed token starts with the same byte (so that
        byte is forced), then tokenize the forced text."""
        compiled = self._compiled
        index = compiled.index
        vocab = compiled.tokenizer.decoded_vocab()
        state = self._guide.get_state()
        forced = bytearray()
        while len(forced) < 256:
            if state not in compiled.forced:
                compiled.forced[state] = _forced_byte(index, state, vocab)
            step = compiled.forced[state]
            if step is None:
                break
            token, state = step
            forced += vocab[token]
        if not forced:
            return []
        text = forced.decode("utf-8", errors="ignore")
        return compiled.tokenizer.encode(text) if text else []

    def copy(self) -> OutlinesMatcher:
        return OutlinesMatcher(self._compiled)


def _forced_byte(index: Any, state: int, vocab: list[bytes]) -> tuple[int, int] | None:
    if index.is_final_state(state):
        return None  # the answer may end here: nothing is forced
    allowed = index.get_allowed_tokens(state)
    if not allowed:
        return None
    first = None
    single = None
    for t in allowed:
        raw = vocab[t]
        if not raw:
            return None
        if first is None:
            first = raw[0]
        elif raw[0] != first:
            return None
        if len(raw) == 1:
            single = t
    if single is None:
        return None
    nxt = index.get_next_state(state, single)
    return None if nxt is None else (single, nxt)
