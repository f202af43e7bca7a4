"""ReasoningGrammar: free thought, then the answer held to the grammar, for every backend."""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import thinkstruct
from thinkstruct import CompiledGrammar, Constraint, Tokenizer
from thinkstruct.grammar.api import can_stop
from thinkstruct.grammar.runtime.bitmask import allocate_bitmask, allowed_token_ids, is_allowed
from thinkstruct.grammar.runtime.reasoning import ReasoningGrammar
from thinkstruct.tokenizer import smollm2_gguf_path

from .conftest import BACKENDS

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


@functools.cache
def smollm2() -> Tokenizer:
    return Tokenizer.from_pretrained(smollm2_gguf_path())


@functools.cache
def compiled_for(tokenizer: Tokenizer, backend: str) -> CompiledGrammar:
    return thinkstruct.compile(Constraint.json_schema(SCHEMA), tokenizer, backend)


def _mask(g, vocab_size: int) -> torch.Tensor:
    bm = allocate_bitmask(1, vocab_size)
    g.fill_bitmask(bm, 0)
    return bm


def _script(tok: Tokenizer, thought: list[int], tag: list[int], answer: str) -> tuple[list[int], int]:
    """Token script and the index of the token that completes the end tag."""
    tokens = thought + tag
    return tokens + tok.encode(answer) + [tok.eos_token_ids[0]], len(tokens) - 1


def _scripts(tok: Tokenizer) -> list[tuple[list[int], int]]:
    text_tag = tok.encode(tok.think_end_text)  # the tag spelled as plain text
    scripts = [
        _script(tok, tok.encode("<think>Is it ok? Yes."), text_tag, '{"ok":true}'),
        # a false start "</thi" inside the thought: the partial match must reset
        _script(tok, tok.encode("<think>a </thi b"), text_tag, '{"ok": false}'),
        _script(tok, [], text_tag, '{"ok":true}'),  # empty thought
    ]
    if len(tok.think_end_ids) == 1:  # the single special tag token
        scripts.append(_script(tok, tok.encode("<think>hm"), list(tok.think_end_ids), '{"ok":true}'))
    return scripts


class ReasoningMachine(RuleBasedStateMachine):
    """Drives a ReasoningGrammar and a plain reference model of its counters side by side."""

    @initialize(
        backend=st.sampled_from(BACKENDS),
        smol=st.booleans(),
        which=st.integers(0, 3),
    )
    def setup(self, backend: str, smol: bool, which: int) -> None:
        self.tok = smollm2() if smol else Tokenizer.default()
        self.cg = compiled_for(self.tok, backend)
        scripts = _scripts(self.tok)
        self.script, self.tag_end = scripts[which % len(scripts)]
        self.g = self.cg.matcher(reasoning=True)
        self.n = 0  # tokens of the script accepted

    # reference model: -1 while thinking, then answer tokens after the tag
    def expected_state(self) -> int:
        return -1 if self.n <= self.tag_end else self.n - self.tag_end - 1

    @precondition(lambda self: hasattr(self, "g") and self.n < len(self.script))
    @rule()
    def accept_next(self) -> None:
        assert self.g.accept_token(self.script[self.n])
        self.n += 1

    @precondition(lambda self: hasattr(self, "g"))
    @rule()
    def stop_token_refused_while_thinking_or_early(self) -> None:
        if self.n >= len(self.script) - 1:
            return  # where the answer is complete, the stop token is the next script token
        before = self.g.state
        assert not self.g.accept_token(self.tok.eos_token_ids[0])
        assert self.g.state == before

    @precondition(lambda self: hasattr(self, "g") and self.n > 0)
    @rule(data=st.data())
    def rollback(self, data: st.DataObject) -> None:
        k = data.draw(st.integers(1, self.n))
        self.g.rollback(k)
        self.n -= k

    @precondition(lambda self: hasattr(self, "g"))
    @invariant()
    def counters_match(self) -> None:
        state = self.expected_state()
        assert self.g.state == state
        assert self.g.is_thinking == (state == -1)
        assert self.g.is_terminated() == (self.n == len(self.script))
        # The answer's first token comes next exactly after the tag's last.
        assert self.g.at_answer_start() == (state == 0)

    @precondition(lambda self: hasattr(self, "g"))
    @invariant()
    def mask_matches(self) -> None:
        mask = _mask(self.g, self.tok.vocab_size)
        eos = self.tok.eos_token_ids[0]
        if self.expected_state() == -1:
            assert not is_allowed(mask, 0, eos)  # a response cannot end inside its thought
            assert is_allowed(mask, 0, self.script[self.n])
            # all allowed but the stop token and the few tokens that would run past the tag
            assert int((mask != -1).sum()) <= 100
        elif self.n < len(self.script):
            reference = self.cg.matcher()
            answer = self.script[self.tag_end + 1 : self.n]
            assert reference.accept_tokens(answer) == len(answer)
            assert torch.equal(mask, _mask(reference, self.tok.vocab_size))


TestReasoningMachine = ReasoningMachine.TestCase
TestReasoningMachine.settings = settings(
    max_examples=20,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_seed_example_rollback_across_the_boundary(backend: str, tokenizer: Tokenizer) -> None:
    """3 answer tokens, rollback 5: inner rollback 3, back to thinking."""
    cg = compiled_for(tokenizer, backend)
    g = cg.matcher(reasoning=True)
    assert isinstance(g, ReasoningGrammar)
    thought = tokenizer.encode("<think>ok") + [tokenizer.think_end_ids[0]]
    assert g.accept_tokens(thought) == len(thought)
    assert g.state == 0
    answer = tokenizer.encode('{"ok"')[:3]
    assert g.accept_tokens(answer) == 3 and g.state == 3
    g.rollback(5)
    assert g.state == -1 and g.thinking_tokens == len(thought) - 2
    # the inner grammar is back at its start: after the tag, '{' is allowed again
    assert g.accept_tokens(thought[-2:]) == 2
    assert torch.equal(_mask(g, tokenizer.vocab_size), _mask(cg.matcher(), tokenizer.vocab_size))


def test_end_tag_never_reaches_the_inner_grammar(backend: str, tokenizer: Tokenizer) -> None:
    g = compiled_for(tokenizer, backend).matcher(reasoning=True)
    g.accept_tokens(tokenizer.encode("<think>x") + [tokenizer.think_end_ids[0]])
    ans = tokenizer.encode('{"ok":true}')
    assert g.accept_tokens(ans) == len(ans)  # would fail if "</think>" had been fed to JSON
    assert can_stop(g, tokenizer)


def test_reasoning_off_starts_in_the_answer(backend: str, tokenizer: Tokenizer) -> None:
    g = compiled_for(tokenizer, backend).matcher(reasoning=False)
    assert g.at_answer_start()
    assert g.accept_tokens(tokenizer.encode('{"ok":true}')) == len(tokenizer.encode('{"ok":true}'))
    assert not g.at_answer_start()
    assert not g.accept_token(tokenizer.think_end_ids[0])


@pytest.mark.parametrize("smol", [False, True], ids=["deepseek-v4", "smollm2"])
def test_tag_spelled_in_pieces(backend: str, smol: bool) -> None:
    tok = smollm2() if smol else Tokenizer.default()
    g = compiled_for(tok, backend).matcher(reasoning=True)
    pieces = [tok.encode(p)[0] for p in ("</", "think", ">")]
    if smol:
        assert tuple(pieces) == tok.think_end_ids
    assert g.accept_tokens(tok.encode("<think>so")) > 0
    g.accept_token(pieces[0])
    g.accept_token(pieces[1])
    assert g.is_thinking
    g.rollback(1)  # back to "</" matched: the partial match is restored, not lost
    g.accept_token(pieces[1])
    g.accept_token(pieces[2])
    assert g.state == 0


def test_token_running_past_the_tag_is_masked(backend: str) -> None:
    tok = smollm2()
    g = compiled_for(tok, backend).matcher(reasoning=True)
    g.accept_tokens(tok.encode("<think>x</think"))
    run_on = tok.encode(">,")
    assert len(run_on) == 1  # one token that closes the tag and goes on
    mask = _mask(g, tok.vocab_size)
    assert not is_allowed(mask, 0, run_on[0])
    assert not g.accept_token(run_on[0])
    assert g.accept_token(tok.encode(">")[0]) and g.state == 0


@pytest.mark.parametrize("smol", [False, True], ids=["deepseek-v4", "smollm2"])
def test_budget_forces_the_end_tag_then_the_schema(backend: str, smol: bool) -> None:
    tok = smollm2() if smol else Tokenizer.default()
    budget = 7
    g = compiled_for(tok, backend).matcher(reasoning=True, max_reasoning_tokens=budget)
    endless = tok.encode(" and then" * 20)
    assert g.accept_tokens(endless) == budget  # the 8th free token is refused
    closing: list[int] = []
    while g.is_thinking:
        allowed = allowed_token_ids(_mask(g, tok.vocab_size), 0, tok.vocab_size).tolist()
        assert len(allowed) == 1  # only the next token of the end tag
        assert g.jump_forward()[0] == allowed[0]
        assert g.accept_token(allowed[0])
        closing += allowed
    assert tok.decode(closing) == tok.think_end_text
    assert not g.accept_token(tok.encode(" and")[0])  # now held to the schema
    ans = tok.encode('{"ok":false}')
    assert g.accept_tokens(ans) == len(ans) and can_stop(g, tok)


@pytest.mark.parametrize("smol", [False, True], ids=["deepseek-v4", "smollm2"])
def test_a_stop_can_end_the_thought_instead_of_the_response(smol: bool) -> None:
    tokenizer = smollm2() if smol else Tokenizer.default()
    cg = compiled_for(tokenizer, "llguidance")
    eos = tokenizer.eos_token_ids[0]
    assert not is_allowed(_mask(cg.matcher(reasoning=True), tokenizer.vocab_size), 0, eos)
    g = cg.matcher(reasoning=True, stops_end_thought=True)
    assert isinstance(g, ReasoningGrammar)
    assert is_allowed(_mask(g, tokenizer.vocab_size), 0, eos)
    assert g.accept_tokens(tokenizer.encode("so")) == 1
    assert g.ends_thought(eos) and not g.ends_thought(tokenizer.encode(" x")[0])
    closing = g.close_thought()
    assert tokenizer.decode(closing) == tokenizer.think_end_text
    # Closed: only the end tag now, forced; then the answer's grammar.
    allowed = allowed_token_ids(_mask(g, tokenizer.vocab_size), 0, tokenizer.vocab_size).tolist()
    assert allowed == closing[:1] and not g.accept_token(eos)
    assert g.accept_token(closing[0]) and g.jump_forward() == closing[1:]
    assert g.accept_tokens(closing[1:]) == len(closing) - 1 and not g.is_thinking
    assert not g.ends_thought(eos)
    with pytest.raises(ValueError, match="already closed"):
        g.close_thought()
    # Rolled back into the tag, it is still closed; back past its first token, open again.
    if len(closing) > 1:  # SmolLM2's </think> is several tokens
        g.rollback(len(closing) - 1)
        allowed = allowed_token_ids(_mask(g, tokenizer.vocab_size), 0, tokenizer.vocab_size).tolist()
        assert g.is_thinking and allowed == closing[1:2]
        g.rollback(1)
    else:
        g.rollback(1)
    assert (
        g.is_thinking and len(allowed_token_ids(_mask(g, tokenizer.vocab_size), 0, tokenizer.vocab_size)) > 1
    )


def test_banned_ids_while_thinking(tokenizer: Tokenizer) -> None:
    tool = tokenizer.hf.convert_tokens_to_ids("<｜tool▁calls▁begin｜>")
    g = compiled_for(tokenizer, "xgrammar").matcher(reasoning=True, banned_ids_while_thinking=[tool])
    assert not is_allowed(_mask(g, tokenizer.vocab_size), 0, tool)
    assert not g.accept_token(tool)


def test_copy_restarts_in_the_thought(tokenizer: Tokenizer) -> None:
    g = compiled_for(tokenizer, "outlines").matcher(reasoning=True, max_reasoning_tokens=3)
    g.accept_tokens(tokenizer.encode("<think>x") + [tokenizer.think_end_ids[0]])
    fresh = g.copy()
    assert fresh.is_thinking and fresh.thinking_tokens == 0
    assert fresh.accept_tokens(tokenizer.encode("a b c d")) == 3


def test_jump_forward_only_in_the_answer(tokenizer: Tokenizer) -> None:
    g = compiled_for(tokenizer, "llguidance").matcher(reasoning=True)
    g.accept_tokens(tokenizer.encode("<think>{"))
    assert g.jump_forward() == []
    g.accept_token(tokenizer.think_end_ids[0])
    g.accept_tokens(tokenizer.encode('{"'))
    assert tokenizer.decode(g.jump_forward()).startswith("ok")
