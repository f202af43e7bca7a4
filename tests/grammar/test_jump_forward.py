from __future__ import annotations

from thinkstruct import Constraint, Tokenizer

from .conftest import compiled

FIXED_KEYS = {
    "type": "object",
    "properties": {"temperature_celsius": {"type": "number"}, "condition": {"enum": ["sunny", "rainy"]}},
    "required": ["temperature_celsius", "condition"],
    "additionalProperties": False,
}


def test_forced_key_tokens(backend: str, tokenizer: Tokenizer) -> None:
    g = compiled(backend, Constraint.json_schema(FIXED_KEYS)).matcher()
    assert g.accept_tokens(tokenizer.encode('{"')) == len(tokenizer.encode('{"'))
    forced = g.jump_forward()
    text = tokenizer.decode(forced)
    assert len(text) >= len("temperature_celsius") - 2
    assert 'temperature_celsius"'.startswith(text)
    # Forced tokens are accepted as they are, and the rest of the answer still fits.
    assert g.accept_tokens(forced) == len(forced)
    rest = tokenizer.encode('temperature_celsius":21.5,"condition":"sunny"}'[len(text) :])
    assert g.accept_tokens(rest) == len(rest)


def test_second_forced_key(backend: str, tokenizer: Tokenizer) -> None:
    g = compiled(backend, Constraint.json_schema(FIXED_KEYS)).matcher()
    prefix = tokenizer.encode('{"temperature_celsius":21.5,"')
    assert g.accept_tokens(prefix) == len(prefix)
    text = tokenizer.decode(g.jump_forward())
    assert text and 'condition"'.startswith(text)


def test_nothing_forced_where_the_model_has_a_choice(backend: str, tokenizer: Tokenizer) -> None:
    g = compiled(backend, Constraint.json_schema(FIXED_KEYS)).matcher()
    prefix = tokenizer.encode('{"temperature_celsius":')
    assert g.accept_tokens(prefix) == len(prefix)
    assert g.jump_forward() == []
