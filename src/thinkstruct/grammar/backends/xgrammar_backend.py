"""xgrammar: JSON Schema, regex, EBNF and structural tags, compiled to a pushdown automaton
with a precomputed per-state token-mask cache (fast masks, slower compiles)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from thinkstruct.errors import InvalidConstraint
from thinkstruct.grammar.backends.library_errors import describe_library_error
from thinkstruct.grammar.base import NO_BACKEND_ENFORCES, CompiledGrammar, GrammarBackend, schema_text
from thinkstruct.grammar.constraint import Constraint, ConstraintKind
from thinkstruct.grammar.json_format import COMPACT, JsonFormat
from thinkstruct.grammar.runtime.matcher import StopTokenMatcher

if TYPE_CHECKING:
    import torch
    import xgrammar as xgr

    from thinkstruct.tokenizer import Tokenizer

#: Threads one xgrammar compile uses (it parallelises the per-state mask cache). Two: the
#: compile runs in a worker process beside the serving loop on small machines.
COMPILE_THREADS = 2


def tokenizer_info(tokenizer: Tokenizer) -> xgr.TokenizerInfo:
    """xgrammar's ``TokenizerInfo`` for ``tokenizer`` (built once per tokenizer), with
    every special token blanked so it is never part of a mask."""
    return tokenizer.cached("xgrammar.tokenizer_info", lambda: _build_tokenizer_info(tokenizer))


def _build_tokenizer_info(tokenizer: Tokenizer) -> xgr.TokenizerInfo:
    import xgrammar as xgr

    encoded: list[str] = [""] * tokenizer.vocab_size
    for token, idx in tokenizer.hf.get_vocab().items():
        if idx < tokenizer.vocab_size and idx not in tokenizer.special_token_ids:
            encoded[idx] = token
    # xgrammar treats a token whose text is empty as special: it never appears in a
    # mask, which is exactly what the added/control tokens need.
    try:  # xgrammar's own reading of the tokenizer (a private helper: it may move)
        meta = xgr.TokenizerInfo._detect_metadata_from_hf(tokenizer.hf.backend_tokenizer.to_str())
        vocab_type, add_prefix_space = meta["vocab_type"], bool(meta["add_prefix_space"])
    except Exception:  # noqa: BLE001 - a private helper's failure: use the fallback
        vocab_type = {
            "byte_level": xgr.VocabType.BYTE_LEVEL,
            "byte_fallback": xgr.VocabType.BYTE_FALLBACK,
            "raw": xgr.VocabType.RAW,
        }[tokenizer.vocab_type()]
        add_prefix_space = False
    return xgr.TokenizerInfo(
        encoded,
        vocab_type,
        vocab_size=tokenizer.vocab_size,
        stop_token_ids=list(tokenizer.eos_token_ids),
        add_prefix_space=add_prefix_space,
    )


class XGrammarBackend(GrammarBackend):
    name = "xgrammar"
    kinds = frozenset(ConstraintKind)
    inexact_keywords = NO_BACKEND_ENFORCES | {
        "allOf", "multipleOf", "format", "minProperties", "maxProperties",
        "patternProperties", "additionalItems",
    }  # fmt: skip
    ignores_inexact = True
    isolated = True
    rank = dict.fromkeys(ConstraintKind, 1) | {ConstraintKind.STRUCTURAL_TAG: 0}

    def __init__(
        self, tokenizer: Tokenizer, *, json_format: JsonFormat = COMPACT, lenient: bool = False
    ) -> None:
        super().__init__(tokenizer, json_format=json_format, lenient=lenient)
        self._compiler: xgr.GrammarCompiler | None = None

    def _xgr_compiler(self) -> xgr.GrammarCompiler:
        # Built on first compile: a parent that only loads grammars compiled in a worker
        # never needs one. thinkstruct keeps its own compile cache (GrammarCompiler);
        # xgrammar's would hold a second copy of every grammar.
        if self._compiler is None:
            import xgrammar as xgr

            self._compiler = xgr.GrammarCompiler(
                tokenizer_info(self.tokenizer), max_threads=COMPILE_THREADS, cache_enabled=False
            )
        return self._compiler

    def _compile(self, constraint: Constraint) -> CompiledGrammar:
        start = time.perf_counter()
        try:
            ctx = self._compile_ctx(constraint)
        except InvalidConstraint:
            raise
        except Exception as e:  # noqa: BLE001 - xgrammar raises RuntimeError/ValueError/its own types
            raise describe_library_error(e, constraint, self.name) from None
        return self._wrap(constraint, ctx, time.perf_counter() - start)

    def export(self, compiled: CompiledGrammar) -> str:
        assert isinstance(compiled, XGrammarCompiled)
        return str(compiled.ctx.serialize_json())

    def load(self, constraint: Constraint, payload: Any, compile_seconds: float) -> XGrammarCompiled:
        import xgrammar as xgr

        ctx = xgr.CompiledGrammar.deserialize_json(payload, tokenizer_info(self.tokenizer))
        return self._wrap(constraint, ctx, compile_seconds, serialized_bytes=len(payload))

    def _wrap(
        self, constraint: Constraint, ctx: xgr.CompiledGrammar, seconds: float, *, serialized_bytes: int = 0
    ) -> XGrammarCompiled:
        return XGrammarCompiled(
            serialized_bytes=serialized_bytes,
            constraint=constraint,
            backend=self.name,
            tokenizer=self.tokenizer,
            compile_seconds=seconds,
            ctx=ctx,
            eos_ids=frozenset(self.tokenizer.eos_token_ids),
        )

    def _compile_ctx(self, constraint: Constraint) -> xgr.CompiledGrammar:
        import xgrammar as xgr

        compiler = self._xgr_compiler()
        kind = constraint.kind
        if kind is ConstraintKind.JSON_SCHEMA or kind is ConstraintKind.JSON_OBJECT:
            schema = schema_text(constraint)
            return compiler.compile_json_schema(schema, **self._json_options())
        if kind is ConstraintKind.REGEX:
            return compiler.compile_regex(constraint.value)
        if kind is ConstraintKind.EBNF:
            _refuse_raw_nul(constraint.value)
            return compiler.compile_grammar(constraint.value)
        if kind is ConstraintKind.CHOICE:
            options = constraint.document
            ebnf = "root ::= " + " | ".join(_ebnf_literal(o) for o in options)
            return compiler.compile_grammar(ebnf)
        if kind is ConstraintKind.STRUCTURAL_TAG:
            tag = constraint.document
            if "structures" in tag or "triggers" in tag:
                items = [
                    xgr.StructuralTagItem(
                        begin=s["begin"], schema=json.dumps(s.get("schema") or {}), end=s["end"]
                    )
                    for s in tag.get("structures", [])
                ]
                return compiler.compile_structural_tag(items, tag.get("triggers", []))
            return compiler.compile_structural_tag(constraint.value)
        raise AssertionError(f"unhandled kind {kind}")

    def _json_options(self) -> dict[str, Any]:
        # strict_mode=False keeps JSON Schema's defaults: unlisted properties and items
        # are allowed unless the schema says otherwise (xgrammar's strict mode forbids
        # them, and then refuses valid schemas such as {"type": "array", "minItems": 2}).
        ws = self.json_format.max_whitespace
        if ws == 0:
            return {"any_whitespace": False, "separators": (",", ":"), "strict_mode": False}
        return {"any_whitespace": True, "max_whitespace_cnt": ws, "strict_mode": False}


def _refuse_raw_nul(grammar: str) -> None:
    """xgrammar reads a grammar as C text: a raw NUL ends it, and the rest would be dropped
    without a word (``root ::= "a" | "b"\0 "c"`` accepted ``b``)."""
    at = grammar.find("\0")
    if at >= 0:
        line = grammar.count("\n", 0, at) + 1
        raise InvalidConstraint(
            "a raw NUL character: xgrammar reads a grammar only up to it (write it as \\u0000)",
            position=at,
            line=line,
            column=at - (grammar.rfind("\n", 0, at) + 1) + 1,
            backend="xgrammar",
            kind="ebnf",
        )


def _ebnf_literal(text: str) -> str:
    # xgrammar's EBNF string literals take JSON-style escapes.
    return json.dumps(text, ensure_ascii=False) if text else '""'


@dataclass(frozen=True, eq=False)
class XGrammarCompiled(CompiledGrammar):
    ctx: Any = field(default=None, repr=False)
    eos_ids: frozenset[int] = frozenset()
    #: Length of the JSON it was loaded from (0 when compiled in this process).
    serialized_bytes: int = 0

    def _new_matcher(self) -> XGrammarMatcher:
        return XGrammarMatcher(self)

    @property
    def _library_bytes(self) -> int:
        # Measured against glibc's in-use heap (benchmarks/grammar_memory.py): compiled
        # here, xgrammar's own count (grammar and adaptive token-mask cache) is within 5 %;
        # loaded from a worker's JSON it holds 0.75-1.2 times the JSON's length, up to 3.5
        # times its own count (which stays that of the original). The larger of the two,
        # and a page of Python objects on top (which covers the small ones).
        own = self.ctx.memory_size_bytes * 1.1
        return int(max(own, self.serialized_bytes * 0.85)) + 64 * 1024


class XGrammarMatcher(StopTokenMatcher):
    __slots__ = ("_compiled", "_m")

    def __init__(self, compiled: XGrammarCompiled) -> None:
        super().__init__(compiled.eos_ids, start_row=compiled.start_row)
        self._compiled = compiled
        # Stop tokens are never fed to xgrammar (see StopTokenMatcher): it would log a
        # warning for a token offered after one, and raise if asked for a mask.
        import xgrammar as xgr

        self._m = xgr.GrammarMatcher(compiled.ctx)

    def _advance(self, token_id: int) -> bool:
        # False (state unchanged) for a refused, special or out-of-range token.
        return self._m.accept_token(token_id)

    def _rollback(self, num_tokens: int) -> None:
        self._m.rollback(num_tokens)

    def _fill(self, bitmask: torch.Tensor, row: int) -> None:
        self._m.fill_next_token_bitmask(bitmask, row)

    def _can_stop(self) -> bool:
        return bool(self._m.is_completed())

    def _forced(self) -> list[int]:
        # xgrammar finds the forced string and tokenizes it greedily, leaving out a final
        # token that could still grow; special and stop tokens are never included.
        return list(self._m.find_jump_forward_tokens())

    def copy(self) -> XGrammarMatcher:
        return XGrammarMatcher(self._compiled)
