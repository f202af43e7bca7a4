"""uniqueItems is checked as each item closes: a repeated item fails at once, naming the
item, so the engine undoes the item and not the whole array."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thinkstruct import Constraint
from thinkstruct.grammar.runtime.tag_checks import first_failed_check
from thinkstruct.grammar.runtime.value_checks import ValueChecker
from thinkstruct.grammar.service.compiler import GrammarCompiler


@pytest.fixture(scope="module")
def compiler(tokenizer) -> Iterator[GrammarCompiler]:
    with GrammarCompiler(tokenizer) as c:
        yield c


SCHEMA = {"type": "array", "items": {"enum": ["red", "green", "blue", 1, 1.0, True]}, "uniqueItems": True}


def _plan(compiler):
    grammar = compiler.compile(Constraint.json_schema(SCHEMA), strict=True)
    assert grammar.checks is not None
    return grammar.checks


def test_a_repeated_item_fails_when_it_closes(compiler) -> None:
    checker = ValueChecker(_plan(compiler))
    text = '["red", "green", "red", "blue"]'
    failure = None
    fed = 0
    while failure is None and fed < len(text):
        failure = checker.feed(text[fed])
        fed += 1
    assert failure is not None and fed == text.index('"red"', 2) + 5  # through item 2's closing quote
    assert failure.keyword == "uniqueItems"
    assert failure.value_pointer == "/2" and failure.pointer == ""
    assert text[failure.start : failure.end] == '"red"'


@settings(max_examples=80, deadline=None)
@given(items=st.lists(st.sampled_from(['"red"', '"green"', '"blue"', "1", "1.0", "true"]), max_size=6))
def test_the_verdict_is_the_validators(compiler, items: list[str]) -> None:
    """Fed whole, a text fails exactly when the array repeats an item (1 and 1.0 are the
    same number, true is not 1); the failure names the first repeated item."""
    import json

    plan = _plan(compiler)
    text = "[" + ", ".join(items) + "]"
    values = json.loads(text)
    failure = first_failed_check(plan, text)
    seen: list[object] = []
    first_repeat = None
    for i, v in enumerate(values):
        if any(v == s and isinstance(v, bool) == isinstance(s, bool) for s in seen):
            first_repeat = i
            break
        seen.append(v)
    if first_repeat is None:
        assert failure is None
    else:
        assert failure is not None and failure.value_pointer == f"/{first_repeat}"
