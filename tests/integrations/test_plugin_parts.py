"""The vLLM plugin's parts that need no vLLM: where a family's thought ends on token ids,
the plugin's settings, vLLM's structured-output keys as constraints, strict mode's
refusal of what cannot be enforced without undo, and one request's grammar (reasoning
wrapper and closing-token rule together). SmolLM2's real tokenizer, real compiles."""

from __future__ import annotations

import functools

import pytest

from thinkstruct import Constraint, InvalidConstraint, Tokenizer
from thinkstruct.grammar.api import first_rejected
from thinkstruct.grammar.base import CompiledGrammar
from thinkstruct.grammar.runtime.bitmask import allocate_bitmask, is_allowed
from thinkstruct.integrations.vllm.grammar import RequestGrammar
from thinkstruct.integrations.vllm.service import PluginCompiler, constraint_of, enforceable
from thinkstruct.integrations.vllm.settings import PluginSettings
from thinkstruct.integrations.vllm.thought_bounds import ThoughtBounds
from thinkstruct.parsers import get_reasoning_family
from thinkstruct.tokenizer import smollm2_gguf_path

SMOLLM2 = get_reasoning_family("smollm2-think")
QWEN3 = get_reasoning_family("qwen3")


@functools.cache
def tokenizer() -> Tokenizer:
    return Tokenizer.from_pretrained(smollm2_gguf_path())


@functools.cache
def service() -> PluginCompiler:
    """The plugin's compile service as vLLM's processes build it (from SmolLM2's GGUF,
    whose tokenizer the converted directory holds)."""
    return PluginCompiler(
        str(smollm2_gguf_path()), tokenizer().vocab_size, PluginSettings(compile_timeout_s=60)
    )


def decode(ids: list[int]) -> str:
    return tokenizer().decode(ids)


def bounds(family: object = SMOLLM2, *, enabled: bool = True) -> ThoughtBounds:
    return ThoughtBounds(family, lambda ids: tokenizer().decode(list(ids)), enabled=enabled)  # type: ignore[arg-type]


def test_the_end_tag_spelled_in_several_tokens_is_found_where_it_completes() -> None:
    ids = tokenizer().encode("I think so</think>\n{}")
    end = bounds().end_index(ids)
    assert end is not None
    assert decode(ids[:end]).endswith("</think>")
    assert not decode(ids[: end - 1]).endswith("</think>")
    for length in range(1, len(ids) + 1):
        # The step whose last id completes the tag, and no other, ends the thought.
        assert bounds().ends_within(ids[:length], 1) == (length == end)
    assert bounds().ends_within(ids[: end + 2], 3)  # three new ids, the tag's last among them


def test_a_prompt_says_whether_the_output_starts_in_a_thought() -> None:
    opened = tokenizer().encode(
        "<|im_start|>system\nThink between <think> and </think>.<|im_end|>\n<think>\n"
    )
    assert not bounds().has_ended(opened)
    assert bounds().has_ended(tokenizer().encode("<|im_start|>assistant\n<think>\nhmm</think>"))
    plain = tokenizer().encode("<|im_start|>assistant\n")
    assert bounds(enabled=False).has_ended(plain)  # thinking off: no thought
    assert bounds(SMOLLM2).has_ended(plain)  # forced family: its template would have opened it
    assert not bounds(QWEN3).has_ended(plain)  # the model opens the thought itself


def test_settings_from_the_environment() -> None:
    settings = PluginSettings.from_env(
        {
            "THINKSTRUCT_VLLM_STRICT": "0",
            "THINKSTRUCT_VLLM_COMPILE_TIMEOUT_S": "5",
            "THINKSTRUCT_VLLM_CACHE_BYTES": "1024",
        }
    )
    assert (settings.strict, settings.compile_timeout_s, settings.cache_bytes) == (False, 5.0, 1024)
    config = settings.compiler_config()
    assert (config.strict, config.timeout_s, config.cache_bytes, config.json_format.max_whitespace) == (
        False,
        5.0,
        1024,
        0,
    )
    with pytest.raises(ValueError, match="THINKSTRUCT_VLLM_STRICT"):
        PluginSettings.from_env({"THINKSTRUCT_VLLM_STRICT": "perhaps"})
    with pytest.raises(ValueError, match="THINKSTRUCT_VLLM_REASONING_SHARE"):
        PluginSettings.from_env({"THINKSTRUCT_VLLM_REASONING_SHARE": "2"})


def test_vllm_keys_as_constraints() -> None:
    assert constraint_of("JSON", '{"type": "object"}') == Constraint.json_schema({"type": "object"})
    assert constraint_of("JSON_OBJECT", "") == Constraint.json_object()
    assert constraint_of("REGEX", "[a-z]+") == Constraint.regex("[a-z]+")
    assert constraint_of("CHOICE", '["yes", "no"]') == Constraint.choice(["yes", "no"])
    assert constraint_of("GRAMMAR", 'root ::= "a"') == Constraint.ebnf('root ::= "a"')
    with pytest.raises(InvalidConstraint):
        constraint_of("CHOICE", '[1, "no"]')


def compile_strict(schema: dict[str, object]) -> CompiledGrammar:
    return service().compiler.compile(Constraint.json_schema(schema))


def test_strict_mode_refuses_what_cannot_be_enforced_without_undo() -> None:
    ids = {
        "type": "object",
        "properties": {"ids": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}},
    }
    with pytest.raises(InvalidConstraint) as refused:
        enforceable(compile_strict(ids))
    assert refused.value.pointer == "/properties/ids/uniqueItems"
    tags = {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
    }
    compiled = compile_strict(tags)
    assert enforceable(compiled) is compiled


def test_one_of_told_apart_by_required_is_held_by_the_grammar() -> None:
    # Both branches take {"length":1,"width":2,"radius":3}: the grammar keeps each answer
    # to one branch (no check at run time, nothing refused).
    shapes = {
        "type": "object",
        "properties": {
            "length": {"type": "number"},
            "width": {"type": "number"},
            "radius": {"type": "number"},
        },
        "oneOf": [{"required": ["length", "width"]}, {"required": ["radius"]}],
    }
    compiled = enforceable(compile_strict(shapes))
    assert compiled.checks is None
    assert first_rejected(compiled, '{"length":1,"width":2}') is None
    assert first_rejected(compiled, '{"radius":3}') is None
    assert first_rejected(compiled, '{"length":1,"width":2,"radius":3}') is not None


def test_a_request_grammar_thinks_then_holds_the_answer() -> None:
    schema = {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
        "required": ["tags"],
        "additionalProperties": False,
    }
    compiled = compile_strict(schema)
    grammar = RequestGrammar(
        compiled, lambda: compiled.matcher(reasoning=True, end_tag="</think>", max_reasoning_tokens=50)
    )
    thought = tokenizer().encode("a tag or two</think>")
    assert grammar.accept_tokens("r", thought)
    answer = tokenizer().encode('{"tags":["x","x')
    assert grammar.validate_tokens(answer) == answer
    assert grammar.accept_tokens("r", answer)
    bitmask = allocate_bitmask(1, tokenizer().vocab_size)
    grammar.fill_bitmask(bitmask, 0)
    quote = tokenizer().encode('"')[0]
    assert not is_allowed(bitmask, 0, quote)  # "x" again cannot close
    assert not grammar.accept_tokens("r", [quote])
    assert grammar.validate_tokens([quote]) == []
    grammar.rollback(1)  # back to '["x","' : an empty string is new
    grammar.fill_bitmask(bitmask, 0)
    assert is_allowed(bitmask, 0, quote)
    grammar.reset()
    assert not grammar.is_terminated()
    assert grammar.accept_tokens("r", thought + tokenizer().encode('{"tags":[]}'))
    assert grammar.accept_tokens("r", list(tokenizer().eos_token_ids[:1]))
    assert grammar.is_terminated()
