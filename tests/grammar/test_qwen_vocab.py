"""Grammar masks over Qwen3's real 151k vocabulary, for every backend: no special token
inside an answer (Qwen3 flags only 14 of its 26 added tokens special; ``<think>``,
``</think>``, ``<tool_call>`` and the FIM tokens are plain added tokens upstream), both
stop tokens where the answer may end, no padding row ever, and the reasoning wrapper with
``</think>`` as one token id."""

from __future__ import annotations

import functools

import pytest

from thinkstruct import CompiledGrammar, Constraint, InvalidGrammar, Tokenizer
from thinkstruct.grammar.api import get_backend
from thinkstruct.grammar.runtime.bitmask import allocate_bitmask, allowed_token_ids
from thinkstruct.grammar.runtime.matcher import GrammarMatcher
from thinkstruct.grammar.runtime.reasoning import ReasoningGrammar
from thinkstruct.parsers import reasoning_families
from thinkstruct.vocabularies import QWEN3

from .test_special_tokens import FREE_TEXT_SCHEMA, PREFIXES

THINK, END_THINK = QWEN3.token_id("<think>"), QWEN3.token_id("</think>")
STOPS = set(QWEN3.stop_ids)  # <|im_end|>, <|endoftext|>
FREE_TEXT = Constraint.regex(r"(.|\n){0,12}")  # short: outlines-core indexes each state


@functools.cache
def compiled(backend: str, constraint: Constraint) -> CompiledGrammar:
    """Compiled once per test run, in this process (a compile over 151k tokens takes
    seconds on outlines-core and xgrammar)."""
    result = get_backend(Tokenizer.qwen3(), backend).compile(constraint)
    if isinstance(result, InvalidGrammar):
        raise result.error
    return result


def allowed(matcher: GrammarMatcher, tok: Tokenizer) -> set[int]:
    bm = allocate_bitmask(1, tok.vocab_size)
    matcher.fill_bitmask(bm, 0)
    return set(allowed_token_ids(bm, 0, tok.vocab_size).tolist())


def allowed_after(cg: CompiledGrammar, tok: Tokenizer, prefix: str) -> set[int]:
    g = cg.matcher()
    ids = tok.encode(prefix)
    assert g.accept_tokens(ids) == len(ids)
    return allowed(g, tok)


@pytest.mark.parametrize("where", list(PREFIXES))
def test_no_special_token_in_json(backend: str, qwen3_tokenizer: Tokenizer, where: str) -> None:
    tok = qwen3_tokenizer
    mask = allowed_after(compiled(backend, Constraint.json_schema(FREE_TEXT_SCHEMA)), tok, PREFIXES[where])
    assert mask, "the mask must allow something"
    leaked = mask & tok.special_token_ids
    assert not leaked, [tok.hf.convert_ids_to_tokens(i) for i in sorted(leaked)[:10]]
    assert max(mask) < tok.tokenizer_vocab_size  # never a padding row (151,669 … 151,935)


def test_free_text_allows_text_and_both_stops_but_no_other_special(
    backend: str, qwen3_tokenizer: Tokenizer
) -> None:
    tok = qwen3_tokenizer
    mask = allowed_after(compiled(backend, FREE_TEXT), tok, "so ")
    assert len(mask) > 100_000  # free text really is free over the 151k tokens ...
    assert mask & tok.special_token_ids == STOPS  # ... the answer may end, with either stop
    assert max(mask) < tok.tokenizer_vocab_size


def test_only_stop_tokens_where_the_answer_may_end(backend: str, qwen3_tokenizer: Tokenizer) -> None:
    cg = compiled(backend, Constraint.json_schema(FREE_TEXT_SCHEMA))
    mask = allowed_after(cg, qwen3_tokenizer, '{"note":"abc","items":[]}')
    assert mask & qwen3_tokenizer.special_token_ids == STOPS


def test_reasoning_ends_at_the_single_think_end_token(backend: str, qwen3_tokenizer: Tokenizer) -> None:
    tok = qwen3_tokenizer
    banned = {QWEN3.token_id(t) for t in reasoning_families()["qwen3"].banned_while_thinking}
    assert banned == {THINK, *(QWEN3.token_id(t) for t in ("<tool_call>", "</tool_call>", "<|im_start|>"))}
    cg = compiled(backend, Constraint.json_schema(FREE_TEXT_SCHEMA))
    g = cg.matcher(reasoning=True, banned_ids_while_thinking=banned)
    assert isinstance(g, ReasoningGrammar)
    thought = tok.encode("\nthe note is 'abc' 🙂\n")
    assert g.accept_tokens(thought) == len(thought) and g.is_thinking

    thinking = allowed(g, tok)
    assert END_THINK in thinking and len(thinking) > 150_000  # text, and the end tag
    assert not thinking & (banned | STOPS)  # no nested thought, no call, no early stop
    for refused in (THINK, *STOPS):
        assert not g.accept_token(refused)

    assert g.accept_token(END_THINK)  # one token ends the thought
    assert not g.is_thinking and g.state == 0
    answer_start = allowed(g, tok)
    assert answer_start == allowed(cg.matcher(), tok)  # the grammar's own first mask
    assert not answer_start & tok.special_token_ids

    answer = tok.encode('{"note":"abc","items":[1]}')
    assert g.accept_tokens(answer) == len(answer)
    assert g.accept_token(QWEN3.stop_ids[0]) and g.is_terminated()

    g.rollback(len(answer) + 2)  # back across the boundary, into the thought
    assert g.is_thinking and allowed(g, tok) == thinking
    assert g.accept_token(END_THINK) and g.state == 0


def test_the_end_tag_spelled_as_text_ends_the_thought_too(backend: str, qwen3_tokenizer: Tokenizer) -> None:
    tok = qwen3_tokenizer
    spelled = tok.encode("</think>")
    assert len(spelled) > 1 and END_THINK not in spelled
    g = compiled(backend, Constraint.json_schema(FREE_TEXT_SCHEMA)).matcher(reasoning=True)
    assert g.accept_tokens(tok.encode("hm ")) == 2 and g.is_thinking
    assert g.accept_tokens(spelled) == len(spelled)
    assert not g.is_thinking
    assert not allowed(g, tok) & tok.special_token_ids


def test_xgrammar_reads_the_vocabulary_as_thinkstruct_does(qwen3_tokenizer: Tokenizer) -> None:
    from thinkstruct.grammar.backends.xgrammar_backend import tokenizer_info

    info = tokenizer_info(qwen3_tokenizer)
    assert info.vocab_size == 151_936
    assert list(info.decoded_vocab) == qwen3_tokenizer.decoded_vocab()
    assert set(info.special_token_ids) >= qwen3_tokenizer.special_token_ids - STOPS
