"""Constrained calls: each syntax's call form, compiled by the grammar layer, accepts the
calls its model writes and nothing else, and whatever it lets through parses back into
calls whose arguments validate against the tool's schema."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from thinkstruct import Constraint, GrammarCompiler
from thinkstruct.grammar.runtime.bitmask import TokenBitmask
from thinkstruct.grammar.service.compiler import CompilerConfig
from thinkstruct.parsers.tool_calls import ToolCallParser, tool_call_structural_tag, tool_call_syntaxes

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "days": {"type": "integer", "minimum": 1, "maximum": 9},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"type": "string", "maxLength": 8}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [("get_weather", WEATHER), ("get_time", TIME)]
OPENAI_TOOLS = [{"type": "function", "function": {"name": n, "parameters": p}} for n, p in TOOLS]
FORMED = sorted(name for name, s in tool_call_syntaxes().items() if s.form is not None)


def arguments_text(style: str, args: dict) -> str:
    """``args`` the way the style writes them (one of the spellings the grammars take)."""
    if style == "json":
        return json.dumps(args)
    if style == "qwen_xml":
        return "".join(
            f"<parameter={k}>{v if isinstance(v, str) else json.dumps(v)}</parameter>"
            for k, v in args.items()
        )
    if style == "deepseek_xml":
        return "".join(
            f'<｜DSML｜parameter name="{k}" string="{"true" if isinstance(v, str) else "false"}">'
            f"{v if isinstance(v, str) else json.dumps(v)}</｜DSML｜parameter>\n"
            for k, v in args.items()
        )
    if style == "glm_xml":
        return "".join(
            f"<arg_key>{k}</arg_key><arg_value>{v if isinstance(v, str) else json.dumps(v)}</arg_value>"
            for k, v in args.items()
        )
    if style == "minimax_xml":
        return "".join(
            f'<parameter name="{k}">{v if isinstance(v, str) else json.dumps(v)}</parameter>\n'
            for k, v in args.items()
        )
    if style == "gemma":
        return (
            "{"
            + ",".join(
                f'{k}:<|"|>{v}<|"|>' if isinstance(v, str) else f"{k}:{json.dumps(v)}"
                for k, v in args.items()
            )
            + "}"
        )
    raise AssertionError(style)


def written(syntax: str, calls: list[tuple[str, dict]]) -> str:
    form = tool_call_syntaxes()[syntax].form
    parts = []
    for i, (name, args) in enumerate(calls):
        text = form.begin.replace("{name}", name)
        if form.index:
            text += str(i) + form.index
        parts.append(text + arguments_text(form.style, args) + form.end)
    return form.group_begin + form.separator.join(parts) + form.group_end


@pytest.fixture(scope="module")
def compiler(tokenizer):
    # A call form compiles in 0.1-2 s; the limit only guards a machine that is very busy.
    return GrammarCompiler(tokenizer, CompilerConfig(timeout_s=180.0))


def compiled(compiler, syntax: str, mode: str, *, parallel: bool = True, tools=TOOLS):
    doc = tool_call_structural_tag(
        tool_call_syntaxes()[syntax].form, tools, mode=mode, parallel=parallel, max_whitespace=2
    )
    return compiler.compile(Constraint.structural_tag(doc))


def accepts(grammar, tokenizer, text: str) -> bool:
    matcher = grammar.matcher()
    ids = tokenizer.encode(text)
    if matcher.accept_tokens(ids) != len(ids):
        return False
    return any(matcher.validate_tokens([e]) == 1 for e in tokenizer.eos_token_ids) or matcher.is_terminated()


ONE = [("get_weather", {"city": "Paris", "days": 3})]
TWO = [("get_weather", {"city": "Paris", "days": 3, "unit": "celsius"}), ("get_time", {"zone": "CET"})]


@pytest.mark.parametrize("syntax", FORMED)
def test_a_required_call_is_the_answer_and_nothing_else(syntax: str, compiler, tokenizer) -> None:
    grammar = compiled(compiler, syntax, "required")
    assert grammar.backend == "xgrammar"
    for calls in (ONE, TWO):
        text = written(syntax, calls)
        assert accepts(grammar, tokenizer, text), text
        parsed = ToolCallParser(syntax, tools=OPENAI_TOOLS).parse(text)
        assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == calls
    assert not accepts(grammar, tokenizer, "Sure. " + written(syntax, ONE))  # no text around the call
    assert not accepts(
        grammar, tokenizer, written(syntax, [("get_wether", {"city": "Paris", "days": 3})])
    )  # no other name
    assert not accepts(
        grammar, tokenizer, written(syntax, [("get_weather", {"city": "Paris"})])
    )  # the schema holds
    assert not accepts(grammar, tokenizer, "")  # a call is required
    single = compiled(compiler, syntax, "required", parallel=False)
    assert accepts(single, tokenizer, written(syntax, ONE))
    assert not accepts(single, tokenizer, written(syntax, TWO))


@pytest.mark.parametrize("syntax", FORMED)
def test_auto_is_free_text_until_the_call_starts(syntax: str, compiler, tokenizer) -> None:
    grammar = compiled(compiler, syntax, "auto")
    form = tool_call_syntaxes()[syntax].form
    # The legacy {structures, triggers} form: llguidance takes it too, except a trigger
    # such as <tool_call>, which its grammar text reads as a special token's name.
    if form.style == "json" and not form.group_begin and not form.index and not form.trigger.startswith("<"):
        doc = tool_call_structural_tag(form, TOOLS, mode="auto", parallel=True, max_whitespace=2)
        assert "structures" in doc
        other = compiler.compile(Constraint.structural_tag(doc), backend="llguidance")
        assert accepts(other, tokenizer, "Let me look it up. " + written(syntax, ONE))
        assert not accepts(other, tokenizer, written(syntax, [("get_wether", {"city": "Paris", "days": 3})]))
    assert accepts(grammar, tokenizer, "Paris is sunny today.")
    call = written(syntax, ONE)
    if not tool_call_syntaxes()[syntax].leading_starts:
        assert accepts(grammar, tokenizer, "Let me look it up. " + call)
    assert accepts(grammar, tokenizer, call)
    assert not accepts(grammar, tokenizer, written(syntax, [("get_wether", {"city": "Paris", "days": 3})]))
    assert not accepts(
        grammar, tokenizer, written(syntax, [("get_weather", {"city": "Paris", "days": "many"})])
    )


@pytest.mark.parametrize("syntax", ["hermes-list", "dsml", "qwen3-coder", "glm47", "kimi-k2"])
def test_whatever_a_required_grammar_lets_through_parses_into_valid_calls(
    syntax: str, compiler, tokenizer
) -> None:
    """A random walk over short tokens the mask allows (a model that knows nothing) ends in
    calls that name a tool and whose arguments validate."""
    import torch

    grammar = compiled(compiler, syntax, "required")
    vocab = tokenizer.decoded_vocab()
    short = torch.tensor([0 < len(b) <= 3 for b in vocab] + [False] * (tokenizer.vocab_size - len(vocab)))
    shifts = torch.arange(32, dtype=torch.int32)
    masks = TokenBitmask(1, tokenizer.vocab_size)
    rng = random.Random(7)
    schemas = dict(TOOLS)
    finished = 0
    for _ in range(4):
        matcher = grammar.matcher()
        ids: list[int] = []
        for _ in range(600):
            if matcher.is_terminated():
                break
            rows = masks.rows(1)
            matcher.fill_bitmask(rows, 0)
            allowed = ((rows[0].unsqueeze(1) >> shifts) & 1).flatten()[: tokenizer.vocab_size].bool()
            if any(bool(allowed[e]) for e in tokenizer.eos_token_ids) and rng.random() < 0.5:
                break
            pool = (allowed & short).nonzero().flatten().tolist() or allowed.nonzero().flatten().tolist()
            token = rng.choice(pool)
            assert matcher.accept_token(token)
            ids.append(token)
        else:
            continue  # cut off: nothing to check, as for a request ending with "length"
        text = tokenizer.decode(ids)
        parsed = ToolCallParser(syntax, tools=OPENAI_TOOLS).parse(text)
        assert parsed.calls, text
        for call in parsed.calls:
            assert call.arguments, (text, parsed)
            jsonschema.validate(json.loads(call.arguments), schemas[call.name])
        finished += 1
    assert finished
