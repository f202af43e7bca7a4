"""The compile probe's first mask is kept on the compiled grammar and a fresh matcher's
first fill copies it: the copy must equal what the library itself computes, at the start
and after rolling back to it, and must not be used anywhere else."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from thinkstruct import CompiledGrammar, Constraint, Tokenizer
from thinkstruct.grammar.api import get_backend
from thinkstruct.grammar.runtime.bitmask import allocate_bitmask
from thinkstruct.grammar.service.compiler import CompilerConfig, GrammarCompiler

from .conftest import BACKENDS, PERSON_SCHEMA, compiled, mask_of

CONSTRAINTS = {
    "person": Constraint.json_schema(PERSON_SCHEMA),
    "regex": Constraint.regex(r"(yes|no) [0-9]{1,3}"),
    "choice": Constraint.choice(["alpha", "beta", "gamma"]),
}
TEXTS = {
    "person": json.dumps({"name": "Ada", "age": 36, "tags": ["x"]}, separators=(",", ":")),
    "regex": "yes 42",
    "choice": "gamma",
}


def _library_only(cg: CompiledGrammar) -> CompiledGrammar:
    """The same grammar without a kept row: every fill asks the library."""
    return dataclasses.replace(cg, start_row=None)


@pytest.mark.parametrize("name", CONSTRAINTS)
def test_compiled_grammars_keep_the_library_startmask_of(
    tokenizer: Tokenizer, backend: str, name: str
) -> None:
    cg = compiled(backend, CONSTRAINTS[name])
    assert cg.start_row is not None
    assert cg.start_row.dtype == torch.int32 and cg.start_row.shape == (
        allocate_bitmask(1, tokenizer.vocab_size).shape[1],
    )
    library = mask_of(_library_only(cg).matcher(), tokenizer.vocab_size)
    assert torch.equal(cg.start_row, library[0])
    assert torch.equal(mask_of(cg.matcher(), tokenizer.vocab_size), library)
    # The row is counted in the cache's accounting.
    assert cg.memory_bytes == _library_only(cg).memory_bytes + cg.start_row.numel() * 4


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    backend=st.sampled_from(BACKENDS),
    name=st.sampled_from(sorted(CONSTRAINTS)),
    steps=st.lists(st.integers(0, 5), min_size=1, max_size=8),
)
def test_every_fill_equals_the_library_fill(
    tokenizer: Tokenizer, backend: str, name: str, steps: list[int]
) -> None:
    """Accepts and rollbacks in any order (back to the start and away again): the kept
    row is used exactly when the matcher is at the start, and agrees with the library."""
    ids = tokenizer.encode(TEXTS[name]) + [tokenizer.eos_token_ids[0]]
    cg = compiled(backend, CONSTRAINTS[name])
    kept, library = cg.matcher(), _library_only(cg).matcher()
    position = 0
    for i, n in enumerate(steps):
        if i % 2 == 0:
            n = min(n, len(ids) - position)
            assert kept.accept_tokens(ids[position : position + n]) == n
            assert library.accept_tokens(ids[position : position + n]) == n
            position += n
        else:
            n = min(n, position)
            kept.rollback(n)
            library.rollback(n)
            position -= n
        assert torch.equal(mask_of(kept, tokenizer.vocab_size), mask_of(library, tokenizer.vocab_size))
    assert torch.equal(
        mask_of(kept.copy(), tokenizer.vocab_size), mask_of(cg.matcher(), tokenizer.vocab_size)
    )


def test_grammars_from_worker_processes_bring_their_start_row(tokenizer: Tokenizer) -> None:
    """xgrammar compiles in a worker process: the probe's row travels back with it."""
    with GrammarCompiler(tokenizer, CompilerConfig(backend="xgrammar", timeout_s=60)) as service:
        cg = service.compile(CONSTRAINTS["person"])
    assert cg.backend == "xgrammar" and cg.start_row is not None
    assert torch.equal(cg.start_row, mask_of(_library_only(cg).matcher(), tokenizer.vocab_size)[0])


@pytest.mark.parametrize("name", CONSTRAINTS)
def test_the_first_matcher_is_the_probes_and_starts_where_a_new_one_does(
    tokenizer: Tokenizer, backend: str, name: str
) -> None:
    """The probe's matcher, rolled back to the start, is handed to the first request
    (once: the second gets a new one); it accepts and masks exactly as a new matcher."""
    result = get_backend(tokenizer, backend).compile(CONSTRAINTS[name])
    assert isinstance(result, CompiledGrammar)
    first, second = result.matcher(), result.matcher()
    assert first is not second
    library = _library_only(result).matcher()
    ids = tokenizer.encode(TEXTS[name]) + [tokenizer.eos_token_ids[0]]
    for m in (first, second, library):
        assert torch.equal(mask_of(m, tokenizer.vocab_size), mask_of(library, tokenizer.vocab_size))
    for i, token in enumerate(ids):
        masks = [mask_of(m, tokenizer.vocab_size) for m in (first, second, library)]
        assert torch.equal(masks[0], masks[2]) and torch.equal(masks[1], masks[2]), f"at token {i}"
        assert first.accept_token(token) and second.accept_token(token) and library.accept_token(token)
    assert first.is_terminated() and second.is_terminated()


def test_a_renamed_grammar_takes_the_spare_along(tokenizer: Tokenizer) -> None:
    """The compile service renames a grammar to the constraint as asked: the spare moves
    with it and is handed out once, by the renamed grammar only."""
    result = get_backend(tokenizer, "llguidance").compile(CONSTRAINTS["person"])
    assert isinstance(result, CompiledGrammar)
    spare = result._spare[0]
    named = result.renamed(CONSTRAINTS["regex"], ignored_keywords=("/x",))
    assert named.constraint == CONSTRAINTS["regex"] and named.ignored_keywords == ("/x",)
    assert result.matcher() is not spare
    assert named.matcher() is spare and named.matcher() is not spare
