"""Checked keywords inside tool calls, in the engine on the embedded SmolLM2 (hermes-list
calls): every call's arguments are checked against its own tool's schema as its values
close; a failed value is taken back and drawn again before any of it is streamed; out of
tries the request ends with an error naming the keyword, the pointer and the tool; the
thought before the calls is never checked nor taken back."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from thinkstruct import Constraint
from thinkstruct.engine import Engine, EngineConfig, FinishReason, GenerationRequest, SamplingParams
from thinkstruct.engine.output.checked_answer import CheckedAnswer
from thinkstruct.engine.output.detokenizer import TokenTexts
from thinkstruct.grammar.runtime.end_tag import end_tag_matcher
from thinkstruct.grammar.schema.tag_checks import TagChecks
from thinkstruct.grammar.service.compiler import GrammarCompiler
from thinkstruct.parsers import render_chat
from thinkstruct.parsers.tool_calls import ToolCallParser, get_tool_call_syntax, tool_call_structural_tag
from thinkstruct.parsers.tool_calls.types import ToolSchemas
from thinkstruct.server.tools import ToolPlan

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from checked_cases import PAINT  # the benchmark's cases

#: A flag of three different stripes, and a wall with more than one coat, asked for what
#: breaks both.
SCHEMAS = PAINT.tools
TOOLS = [
    {
        "type": "function",
        "function": {"name": name, "description": name.replace("_", " "), "parameters": schema},
    }
    for name, schema in SCHEMAS.items()
]
ASK = PAINT.prompt


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf):
    """The embedded model as the server runs it by default (its GGUF's blocks)."""
    return smollm2_gguf


@pytest.fixture(scope="module")
def compiler(smollm2):
    with GrammarCompiler(smollm2.tokenizer) as c:
        yield c


def tool_plan(model: Any, tools: list[dict[str, Any]]) -> ToolPlan:
    """The plan the server makes for ``tool_choice: "required"`` with parallel calls."""
    return ToolPlan(
        tools=tools,
        schemas=ToolSchemas.from_tools(tools),
        choice="required",
        allowed=tuple(t["function"]["name"] for t in tools),
        parallel=True,
        syntax=get_tool_call_syntax(model.family.tool_call_syntax),
    )


def grammar_of(model: Any, compiler: GrammarCompiler, plan: ToolPlan) -> Any:
    assert plan.syntax is not None and plan.syntax.form is not None
    tag = tool_call_structural_tag(
        plan.syntax.form,
        [(n, plan.schemas.parameters[n]) for n in plan.allowed],
        mode="required",
        parallel=True,
        max_whitespace=compiler.config.json_format.max_whitespace,  # as the server writes it
    )
    grammar = compiler.compile(Constraint.structural_tag(tag), strict=True)
    assert isinstance(grammar.checks, TagChecks)  # the tag grammar skips them: checked
    return grammar


def run(model: Any, compiler: GrammarCompiler, tools: list[dict[str, Any]], seeds: range, *, thinking: bool,
        max_tokens: int, **fields: Any) -> list[Any]:  # fmt: skip
    """Each seed's request at temperature 1, batched; their whole outputs."""
    prompt = render_chat(
        [{"role": "user", "content": ASK}],
        family=model.family,
        tokenizer=model.tokenizer,
        chat_template=model.chat_template,
        chat_template_kwargs={"enable_thinking": thinking},
        tools=tools,
    )
    ids = model.tokenizer.hf.encode(prompt.text, add_special_tokens=False)
    plan = tool_plan(model, tools)
    grammar = grammar_of(model, compiler, plan)
    with Engine(model, config=EngineConfig(max_batch=4), compiler=compiler) as engine:
        handles = [
            engine.submit(
                GenerationRequest(
                    prompt_ids=ids,
                    sampling=SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed),
                    grammar=grammar,
                    reasoning=prompt.reasoning_enabled,
                    reasoning_parser=prompt.reasoning_parser(),
                    tool_calls=plan.reading(),
                    **fields,
                )
            )
            for seed in seeds
        ]
        return [h.wait() for h in handles]


def parsed_calls(model: Any, out: Any, tools: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The calls read again from the whole answer's tokens (the answer after the thought)."""
    text = model.tokenizer.hf.decode(list(out.token_ids), skip_special_tokens=False)
    answer = text.split(model.family.think_end)[-1]
    parser = ToolCallParser(
        get_tool_call_syntax(model.family.tool_call_syntax), tools=ToolSchemas.from_tools(tools)
    )
    return [(c.name, c.arguments) for c in parser.parse(answer).calls]


def test_every_call_meets_its_tools_checked_keywords(smollm2, compiler) -> None:
    outs = run(smollm2, compiler, TOOLS, range(4), thinking=False, max_tokens=80)
    rollbacks = 0
    finished = 0
    for out in outs:
        assert out.usage is not None
        rollbacks += out.usage.check_rollbacks
        if out.finish_reason is FinishReason.ERROR:
            # Out of tries at one position: the error names the check and the tool.
            assert "the arguments of paint_" in (out.error or ""), out.error
            assert all(c.arguments.count('"red"') <= 1 for c in out.tool_calls)  # nothing undone was sent
            continue
        if out.finish_reason is not FinishReason.STOP:
            assert out.finish_reason is FinishReason.LENGTH, out
            continue
        finished += 1
        assert out.tool_calls, out
        for call in out.tool_calls:
            # What was streamed (the joined deltas) is valid: no undone text reached it.
            jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
        # The streamed calls are the calls of the final answer's tokens.
        assert [(c.name, c.arguments) for c in out.tool_calls] == parsed_calls(smollm2, out, TOOLS)
    assert finished >= 2
    assert rollbacks > 0  # a repeated stripe (or one coat) was drawn and taken back


def test_out_of_tries_the_error_names_keyword_pointer_and_tool(smollm2, compiler) -> None:
    label = {"type": "object", "properties": {"tags": {"type": "array", "items": {"const": "x"}, "minItems": 2,
             "maxItems": 2, "uniqueItems": True}}, "required": ["tags"], "additionalProperties": False}  # fmt: skip
    tools = [{"type": "function", "function": {"name": "label", "parameters": label}}]
    (out,) = run(smollm2, compiler, tools, range(1), thinking=False, max_tokens=60)
    assert out.finish_reason is FinishReason.ERROR, out
    error = out.error or ""
    assert "uniqueItems" in error and "/tags" in error and "the arguments of label" in error, error
    assert all('"x"' not in c.arguments for c in out.tool_calls)  # the failed value was never sent


def test_the_thought_before_the_calls_is_never_checked_nor_taken_back(smollm2, compiler) -> None:
    outs = run(smollm2, compiler, TOOLS, range(4), thinking=True, max_tokens=110, max_reasoning_tokens=12)
    assert sum(o.usage.check_rollbacks for o in outs if o.usage) > 0
    for out in outs:
        assert out.usage is not None and out.reasoning
        assert out.usage.reasoning_tokens >= 12  # the budget, then the end tag: all thought
        if out.finish_reason is FinishReason.STOP:
            for call in out.tool_calls:
                jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])


def test_a_failing_lookalike_in_the_thought_is_not_a_call(smollm2, compiler) -> None:
    """Token by token with the real tokenizer: a thought that writes a call breaking the
    schema passes untouched (released as it comes); the answer's own call is checked."""
    plan = tool_plan(smollm2, TOOLS)
    grammar = grammar_of(smollm2, compiler, plan)
    tokenizer = smollm2.tokenizer
    reading = plan.reading()
    assert reading is not None
    checked = CheckedAnswer(
        grammar.checks,
        texts=TokenTexts(tokenizer),
        end_tag=end_tag_matcher(tokenizer, smollm2.family.think_end),
        thinking=True,
        stop_ids=frozenset(tokenizer.eos_token_ids),
        names=reading.names,
    )
    call = '<tool_call>[{"name": "paint_wall", "arguments": {"color": "red", "coats": 1}}]</tool_call>'
    thought = tokenizer.hf.encode(
        "I could write " + call + " but " + smollm2.family.think_end, add_special_tokens=False
    )
    for token in thought:
        settled = checked.settle([token], forced=0, logprob=None, allowed=2)
        assert settled.undo is None and [t.token for t in settled.release] == [token]
    answer = tokenizer.hf.encode(call, add_special_tokens=False)
    undo = None
    fed = 0
    for token in answer:
        fed += 1
        settled = checked.settle([token], forced=0, logprob=None, allowed=2)
        if settled.undo is not None:
            undo = settled.undo
            break
    assert undo is not None, "the answer's call was not checked"
    assert undo.tokens <= fed  # only the answer's own tokens are taken back
    assert undo.failure.keyword == "not" and "the arguments of paint_wall (call 0)" in undo.failure.describe()
