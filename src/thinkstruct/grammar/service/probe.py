"""Probing a freshly compiled grammar: can it produce anything valid at all?

Some libraries report their limits only when a mask is computed, not at compile time:
llguidance's parser refuses a row of more than 2,000 Earley items (a ``choice`` of 2,000
options, an ``anyOf`` of 2,010 objects, an object of 500 optional properties) only when
the first token of the answer arrives, so the compile "succeeds", its first mask allows
``a``, and accepting ``a`` then fails. A server would return an empty answer or see a
broken mask/accept contract. Before a compiled grammar is handed out it is therefore
probed, cheaply (one mask and a few tokens):

1. the first mask allows some token other than a stop token (for JSON; a regex or
   grammar may legitimately match only the empty answer);
2. the lowest and highest allowed tokens are really accepted (the mask and
   ``accept_token`` agree);
3. for JSON Schemas that declare their root ``type`` and where small instances are easy
   to build (one per type the root allows, :func:`~thinkstruct.grammar.schema.instances.witnesses`), the grammar accepts one of them in one of
   its JSON spellings (non-ASCII raw or escaped, ``2.0`` or ``2``); it fails only when it rejects every
   one that the reference validator confirms valid (a backend may produce only some
   types of an untyped schema: that is inexact, not dead). Only for backends that declare
   :attr:`~thinkstruct.grammar.base.GrammarBackend.tries_witness`.

A failed probe is that backend failing: ``auto`` falls back to the next one, or the
constraint is refused with the reason.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

import numpy as np
import torch

from thinkstruct.errors import InvalidConstraint
from thinkstruct.grammar.constraint import ConstraintKind
from thinkstruct.grammar.runtime.answers import can_stop, first_rejected
from thinkstruct.grammar.runtime.bitmask import allowed_bounds, bitmask_words, is_allowed
from thinkstruct.grammar.runtime.matcher import StopTokenMatcher
from thinkstruct.grammar.schema.instances import integral, witnesses

if TYPE_CHECKING:
    from thinkstruct.grammar.compiled import CompiledGrammar
    from thinkstruct.grammar.runtime.matcher import GrammarMatcher

_JSON_KINDS = (ConstraintKind.JSON_SCHEMA, ConstraintKind.JSON_OBJECT)
_ROW_LIMIT = re.compile(r"Current row has (\d+) items; max is (\d+)")


def probe(compiled: CompiledGrammar, *, witness: bool = True) -> InvalidConstraint | None:
    """Why ``compiled`` cannot produce a valid answer, or ``None`` when the probe passes.

    Args:
        witness: also try a known-valid instance (step 3 of the module docstring; the
            backend's :attr:`~thinkstruct.grammar.base.GrammarBackend.tries_witness`).
    """
    tok = compiled.tokenizer
    kind = compiled.constraint.kind
    matcher = compiled.matcher()
    # Right after a compile every torch call is slow (~0.1 ms: cold caches), so this
    # takes few: the row is numpy's, read as numpy, and kept as the start row. It starts
    # all-allowed, as allocate_bitmask's rows do, whatever words a library leaves.
    words = np.full(bitmask_words(tok.vocab_size), -1, dtype=np.int32)
    row = torch.from_numpy(words)
    bitmask = row.unsqueeze(0)
    matcher.fill_bitmask(bitmask, 0)
    answer = allowed_bounds(words, tok.vocab_size, excluded=tok.eos_token_ids)
    if not answer and (kind in _JSON_KINDS or not any(is_allowed(bitmask, 0, t) for t in tok.eos_token_ids)):
        return _failed(compiled, "the grammar allows no answer at all", matcher)
    for token in answer:
        if not matcher.accept_token(token):
            return _failed(
                compiled,
                f"its first mask allows {tok.decode([token])!r} but accepting it fails",
                matcher,
            )
        matcher.rollback(1)
    if witness and kind is ConstraintKind.JSON_SCHEMA:
        problem = _check_witness(compiled, matcher)
        if problem is not None:
            return problem
    # Passed: the first request's matcher is this one, back at the start, and its first
    # fill copies this mask.
    compiled.keep_start_row(row, spare=matcher if isinstance(matcher, StopTokenMatcher) else None)
    return None


def _check_witness(compiled: CompiledGrammar, matcher: GrammarMatcher) -> InvalidConstraint | None:
    """Whether the grammar accepts a known-valid instance (see the module docstring), fed
    to the probe's own ``matcher`` at its start and rolled back after each try."""
    schema = compiled.constraint.document
    if not isinstance(schema, dict) or "type" not in schema:
        # Without a declared type a backend may rightly produce some types and not
        # others (xgrammar and outlines-core guess one): a rejected witness of another
        # type proves nothing.
        return None
    tok = compiled.tokenizer
    found = witnesses(schema)
    refused: list[str] = []
    for instance in found:
        spellings = [
            json.dumps(value, ensure_ascii=a, separators=(",", ":"))
            for value in (instance, integral(instance))
            for a in (False, True)
        ]
        for text in dict.fromkeys(spellings):
            ids = tok.encode(text)
            n = matcher.accept_tokens(ids)
            produced = n == len(ids) and can_stop(matcher, tok)
            matcher.rollback(n)
            if produced:
                return None  # it produces this valid instance
        if _valid(schema, instance):
            refused.append(spellings[0])
    if not refused or len(refused) < len(found):
        return None  # the rejected witnesses were not valid after all: blame nobody
    shown = refused[0]
    at = first_rejected(compiled, shown)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return _failed(compiled, f"it rejects every valid instance tried ({shown} at character {at})", None)


def _valid(schema: object, instance: object) -> bool:
    import jsonschema

    try:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        return bool(cls(schema).is_valid(instance))
    except Exception:  # noqa: BLE001 - a schema the validator cannot handle blames nobody
        return False


def _failed(compiled: CompiledGrammar, what: str, matcher: GrammarMatcher | None) -> InvalidConstraint:
    detail = library_error(matcher) if matcher is not None else None
    row = _ROW_LIMIT.search(detail or "")
    if row:
        reason = (
            f"too many alternatives for {compiled.backend}: {int(row.group(1)):,} > limit "
            f"{int(row.group(2)):,} ({what})"
        )
    else:
        reason = f"{compiled.backend} compiled it, but {what}" + (
            f": {_first_line(detail)}" if detail else ""
        )
    return InvalidConstraint(reason, backend=compiled.backend, kind=compiled.constraint.kind.value)


def library_error(matcher: GrammarMatcher) -> str | None:
    """The library's own error text for a matcher that failed, where it keeps one."""
    get = getattr(matcher, "library_error", None)
    return get() if callable(get) else None


def _first_line(text: str) -> str:
    # llguidance appends its parser state and the grammar: keep the cause only.
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("Error:"):
            return line[len("Error:") :].strip()[:300]
    return text.splitlines()[0][:300] if text else text
