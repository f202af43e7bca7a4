"""Checked keywords inside a structural tag (a request's tool calls): each call's
arguments are found in the family's call syntax and checked against that tool's schema,
whatever the pieces; free text around calls is never read as one; rollback is exact; and
auto's strict mode checks what xgrammar's tag grammar skips (or refuses what cannot be
checked, naming its pointer)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thinkstruct import Constraint
from thinkstruct.errors import InvalidConstraint, UnsupportedConstraint
from thinkstruct.grammar.runtime.tag_checks import TagChecker, first_failed_check
from thinkstruct.grammar.schema.tag_checks import TagChecks, plan_tag_checks
from thinkstruct.grammar.service.auto import INEXACT, plan
from thinkstruct.parsers.tool_calls.forms import (
    DEEPSEEK_V3,
    HERMES,
    HERMES_LIST,
    KIMI_K2,
    LLAMA3_JSON,
    MISTRAL,
    QWEN3_CODER,
    CallForm,
    tool_call_structural_tag,
)

PAINT = {
    "type": "object",
    "properties": {
        "colors": {
            "type": "array",
            "items": {"enum": ["red", "green", "blue"]},
            "minItems": 3,
            "maxItems": 3,
            "uniqueItems": True,
        }
    },
    "required": ["colors"],
    "additionalProperties": False,
}
FEEL = {
    "type": "object",
    "properties": {
        "mood": {"type": "string", "not": {"const": "sad"}},
        "day": {"type": "string", "format": "date"},
    },
    "required": ["mood"],
}
TOOLS = [("paint", PAINT), ("feel", FEEL)]
FORMS = {"hermes-list": HERMES_LIST, "hermes": HERMES, "kimi": KIMI_K2, "mistral": MISTRAL, "llama3": LLAMA3_JSON,
         "deepseek-v3": DEEPSEEK_V3}  # fmt: skip


def checks(form: CallForm, mode: str, *, parallel: bool = True) -> TagChecks:
    tag = tool_call_structural_tag(form, TOOLS, mode=mode, parallel=parallel)  # type: ignore[arg-type]
    return plan_tag_checks(tag, inexact=INEXACT["xgrammar"])


def names(form: CallForm) -> dict[str, str]:
    return {form.tag(name, {}, max_whitespace=None)["begin"]: name for name, _ in TOOLS}


def answer(form: CallForm, calls: list[tuple[str, Any]], *, before: str = "", after: str = "") -> str:
    """An answer as the grammar writes ``calls`` (name, arguments) in ``form``."""
    written = []
    for index, (name, arguments) in enumerate(calls):
        begin = form.tag(name, {}, max_whitespace=None)["begin"]
        counter = f"{index}{form.index}" if form.index else ""
        text = arguments if isinstance(arguments, str) else json.dumps(arguments)
        written.append(begin + counter + text + form.end)
    body = form.separator.join(written)
    return before + (form.group_begin + body + form.group_end if form.group_begin else body) + after


def feed(checker: TagChecker, pieces: list[str]) -> Any:
    for piece in pieces:
        failure = checker.feed(piece)
        if failure is not None:
            return failure
    return checker.finish()


@pytest.mark.parametrize("mode", ["required", "auto"])
@pytest.mark.parametrize("form_name", list(FORMS))
def test_each_call_is_checked_against_its_own_tools_schema(form_name: str, mode: str) -> None:
    form = FORMS[form_name]
    plan = checks(form, mode)
    assert plan.needed and plan.runnable, plan.problem
    good = [("feel", {"mood": "ok", "day": "2024-02-29"}), ("paint", {"colors": ["red", "green", "blue"]})]
    assert first_failed_check(plan, answer(form, good)) is None
    # The same JSON is fine under one tool and fails under the other: checked per call.
    bad = [("paint", {"colors": ["blue", "green", "red"]}), ("feel", {"mood": "sad"})]
    text = answer(form, bad)
    checker = TagChecker(plan, names=names(form))
    failure = feed(checker, list(text))  # one character a piece
    assert failure is not None
    assert (failure.keyword, failure.pointer, failure.schema_pointer) == (
        "not",
        "/mood",
        "/properties/mood/not",
    )
    assert text[failure.start : failure.end] == '"sad"'
    assert "the arguments of feel (call 1)" in failure.describe()
    # A whole answer at once finds the same value (no names given: the begin is quoted).
    whole = first_failed_check(plan, text)
    assert whole is not None and (whole.start, whole.end) == (failure.start, failure.end)
    assert repr(form.tag("feel", {}, max_whitespace=None)["begin"]) in whole.describe()


@pytest.mark.parametrize("form", [HERMES_LIST, HERMES, KIMI_K2], ids=["hermes-list", "hermes", "kimi"])
def test_a_repeated_item_fails_where_it_closes(form: CallForm) -> None:
    plan = checks(form, "required")
    text = answer(form, [("paint", {"colors": ["red", "green", "red"]})])
    failure = first_failed_check(plan, text)
    assert failure is not None and failure.keyword == "uniqueItems" and failure.pointer == "/colors"
    assert text[failure.start : failure.end] == '"red"' and text[: failure.start].endswith('"green", ')


def test_free_text_before_the_trigger_is_never_read_as_a_call() -> None:
    form = HERMES_LIST  # the calls' begin does not start with the trigger: a group does
    plan = checks(form, "auto")
    assert plan.gated
    lookalike = 'I would write {"name": "paint", "arguments": {"colors": ["red", "red", "red"]}} here. '
    good = [("paint", {"colors": ["red", "green", "blue"]})]
    assert first_failed_check(plan, answer(form, good, before=lookalike, after=" " + lookalike)) is None
    bad = [("paint", {"colors": ["red", "red", "blue"]})]
    failure = first_failed_check(plan, answer(form, bad, before=lookalike))
    assert failure is not None and failure.start > len(lookalike)


def test_with_one_call_allowed_text_after_it_is_free() -> None:
    form = HERMES  # auto without parallel calls: stop_after_first, then free text
    plan = checks(form, "auto", parallel=False)
    assert plan.first_only
    first = answer(form, [("paint", {"colors": ["red", "green", "blue"]})])
    assert first_failed_check(plan, first + " then " + first.replace('"green"', '"red"')) is None
    assert first_failed_check(plan, first.replace('"green"', '"red"')) is not None


def test_text_that_only_looks_like_a_call_is_let_go() -> None:
    """Where the tag leaves text free (a lookalike in a user-written tag without
    triggers), JSON that does not parse is not a call: the search goes on after it."""
    tag = {"type": "structural_tag", "format": {"type": "sequence", "elements": [
        {"type": "any_text"},
        {"type": "tag", "begin": "<args>", "content": {"type": "json_schema", "json_schema": PAINT}, "end": "</args>"},
    ]}}  # fmt: skip
    plan = plan_tag_checks(tag, inexact=INEXACT["xgrammar"])
    text = '<args> are written so: <args>{"colors": ["red", "red", "blue"]}</args>'
    failure = first_failed_check(plan, text)
    assert failure is not None and text[failure.start : failure.end] == '"red"' and failure.start > 30


def test_a_check_that_cannot_run_is_said_not_taken_for_free_text() -> None:
    remote = {
        "type": "object",
        "properties": {"a": {"uniqueItems": True, "items": {"$ref": "http://example.com/s"}}},
    }
    tag = tool_call_structural_tag(HERMES, [("t", remote)], mode="required", parallel=False)
    plan = plan_tag_checks(tag, inexact=INEXACT["xgrammar"])
    with pytest.raises(InvalidConstraint):
        first_failed_check(plan, answer(HERMES, [("t", {"a": [1, 2]})]))


def test_held_from_covers_only_an_open_checked_value() -> None:
    form = HERMES_LIST
    checker = TagChecker(checks(form, "required"))
    text = answer(form, [("paint", {"colors": ["red", "green", "blue"]}), ("feel", {"mood": "ok"})])
    array = text.index("[", text.index("colors"))
    mood = text.index('"ok"')
    # The checked values, from their first character to their last (then they are settled).
    regions = [(array, text.index("]", array)), (mood, mood + 3)]
    for i, c in enumerate(text):
        assert checker.feed(c) is None
        expected = next((start for start, last in regions if start <= i < last), None)
        assert checker.held_from() == expected, (i, text[: i + 1])
    assert checker.finish() is None


PIECES = st.lists(st.integers(1, 7), min_size=1, max_size=80)


@settings(max_examples=60, deadline=None)
@given(sizes=PIECES, seed=st.integers(0, 2**16))
def test_rollback_then_refeed_is_as_if_never_fed(sizes: list[int], seed: int) -> None:
    form = KIMI_K2  # a counter before the JSON, a group around the calls
    plan = checks(form, "auto")
    text = answer(
        form,
        [
            ("feel", {"mood": "fine"}),
            ("paint", {"colors": ["green", "blue", "red"]}),
            ("feel", {"mood": "sad"}),
        ],
        before="Let me call. ",
    )
    pieces, at = [], 0
    for size in sizes * (len(text) // max(sum(sizes), 1) + 1):
        if at >= len(text):
            break
        pieces.append(text[at : at + size])
        at += size
    rng = random.Random(seed)
    checker = TagChecker(plan)
    fed: list[str] = []
    failure = None
    for piece in pieces:
        failure = checker.feed(piece)
        fed.append(piece)
        if rng.random() < 0.3 and failure is None:
            back = rng.randint(0, len(fed))
            checker.rollback(back)
            redo = fed[len(fed) - back :]
            del fed[len(fed) - back :]
            for again in redo:
                failure = checker.feed(again)
                fed.append(again)
                if failure is not None:
                    break
        if failure is not None:
            break
    assert failure is not None and failure.keyword == "not"
    assert checker.text == text[: len(checker.text)]
    assert text[failure.start : failure.end] == '"sad"'


def test_strict_auto_checks_what_the_tag_grammar_skips() -> None:
    tag = tool_call_structural_tag(HERMES_LIST, TOOLS, mode="required", parallel=True)
    strict = next(plan(Constraint.structural_tag(tag), backend="auto", strict=True))
    assert strict.backend == "xgrammar" and isinstance(strict.checks, TagChecks) and not strict.ignored
    checked = {(e.keyword, e.pointer.rsplit("/json_schema", 1)[1]) for e in strict.checks.enforcement if e.enforcement == "checked"}  # fmt: skip
    assert checked == {
        ("uniqueItems", "/properties/colors/uniqueItems"),
        ("not", "/properties/mood/not"),
        ("format", "/properties/day/format"),
    }
    lenient = next(plan(Constraint.structural_tag(tag), backend="auto", strict=False))
    assert lenient.checks is None and any(
        p.endswith("/properties/colors/uniqueItems") for p in lenient.ignored
    )
    plain = tool_call_structural_tag(HERMES_LIST, [("t", {"type": "object", "properties": {"a": {"enum": [1]}}})],
                                     mode="required", parallel=True)  # fmt: skip
    exact = next(plan(Constraint.structural_tag(plain), backend="auto", strict=True))
    assert exact.checks is None and not exact.ignored


def test_strict_refuses_arguments_it_cannot_check_naming_the_pointer() -> None:
    tag = tool_call_structural_tag(QWEN3_CODER, TOOLS, mode="required", parallel=False)
    with pytest.raises(UnsupportedConstraint) as raised:
        list(plan(Constraint.structural_tag(tag), backend="auto", strict=True))
    assert raised.value.pointer is not None and raised.value.pointer.endswith("/json_schema")
    assert "qwen_xml" in str(raised.value)
    lenient = next(plan(Constraint.structural_tag(tag), backend="auto", strict=False))
    assert lenient.checks is None and lenient.ignored  # said, not silently dropped
