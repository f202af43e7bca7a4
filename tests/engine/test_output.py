"""The output processor: thought counted from the tokens, stop strings only in the answer,
tool calls read in the engine (streamed pieces join to the whole-text parse)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from thinkstruct.engine.output.detokenizer import TokenTexts
from thinkstruct.engine.output.processor import OutputProcessor
from thinkstruct.engine.request import (
    FinishReason,
    GenerationRequest,
    SamplingParams,
    ToolCallReading,
    join_deltas,
)
from thinkstruct.grammar.runtime.end_tag import end_tag_matcher
from thinkstruct.parsers.tool_calls import ToolCallParser, get_tool_call_syntax
from thinkstruct.parsers.tool_calls.types import ToolSchemas

TOOLS = ToolSchemas({"get_weather": {"type": "object"}, "add": {"type": "object"}})
HERMES = get_tool_call_syntax("hermes")
TWO_CALLS = (
    'Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
)


def _processor(tokenizer, request: GenerationRequest) -> OutputProcessor:
    return OutputProcessor(
        request,
        texts=TokenTexts(tokenizer),
        end_tag=end_tag_matcher(tokenizer, "</think>"),
        stop_ids=frozenset(tokenizer.eos_token_ids),
    )


def _run(processor: OutputProcessor, ids: list[int], cuts: list[int]):
    deltas = []
    start = 0
    for cut in [*sorted(set(cuts)), len(ids)]:
        if cut > start:
            delta = processor.add(ids[start:cut])
            if delta is not None:
                deltas.append(delta)
            start = cut
    deltas.append(
        processor.finish(
            FinishReason.STOP, None, submitted_at=0.0, prompt_tokens=1, cached_tokens=0, backend=None
        )
    )
    return join_deltas(deltas)


def test_without_a_parser_the_thought_is_counted_and_stop_strings_wait_for_the_answer(tokenizer) -> None:
    thought = tokenizer.encode("plan abc")
    ids = [*thought, *tokenizer.think_end_ids, *tokenizer.encode("answer abc more")]
    request = GenerationRequest(prompt_ids=[1], sampling=SamplingParams(stop=("abc",)), reasoning=True)
    out = _run(_processor(tokenizer, request), ids, [])
    assert out.content == "plan abc</think>answer "
    assert out.usage is not None
    assert out.usage.reasoning_tokens == len(thought) + len(tokenizer.think_end_ids)


def test_a_request_that_does_not_reason_counts_no_thought(tokenizer) -> None:
    ids = tokenizer.encode("plan</think>answer")
    out = _run(_processor(tokenizer, GenerationRequest(prompt_ids=[1], reasoning=False)), ids, [])
    assert out.content == "plan</think>answer"
    assert out.usage is not None and out.usage.reasoning_tokens == 0


@settings(max_examples=40, deadline=None)
@given(data=st.data(), parallel=st.booleans())
def test_streamed_calls_join_to_the_whole_text_parse(tokenizer, data: st.DataObject, parallel: bool) -> None:
    ids = tokenizer.encode(TWO_CALLS)
    cuts = data.draw(st.lists(st.integers(0, len(ids)), max_size=12))
    request = GenerationRequest(
        prompt_ids=[1], tool_calls=ToolCallReading(syntax=HERMES, schemas=TOOLS, parallel=parallel)
    )
    out = _run(_processor(tokenizer, request), ids, cuts)
    whole = ToolCallParser(HERMES, tools=TOOLS).parse(TWO_CALLS)
    expected = whole.calls if parallel else whole.calls[:1]
    assert [(c.name, c.arguments) for c in out.tool_calls] == [(c.name, c.arguments) for c in expected]
    assert out.content == whole.content
    assert len(out.tool_calls) == (2 if parallel else 1)
