"""Fill-in-the-middle templates: every registered template, every position, JSON loading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from thinkstruct.parsers import (
    CompletionTemplate,
    DuplicateName,
    FimPosition,
    InvalidTemplateSpec,
    UnknownName,
    completion_templates,
    fim_prompt,
    get_completion_template,
    load_completion_templates,
    register_completion_template,
    unregister_completion_template,
)

PREFIX = "def add(a, b):\n    "
SUFFIX = "\n\nprint(add(1, 2))\n"

# The prompt each model family documents for PREFIX and SUFFIX.
EXPECTED = {
    "deepseek_coder": f"<｜fim▁begin｜>{PREFIX}<｜fim▁hole｜>{SUFFIX}<｜fim▁end｜>",
    "deepseek-v4": f"<｜fim▁begin｜>{PREFIX}<｜fim▁hole｜>{SUFFIX}<｜fim▁end｜>",
    "star_coder": f"<fim_prefix>{PREFIX}<fim_suffix>{SUFFIX}<fim_middle>",
    "qwen_coder": f"<|fim_prefix|>{PREFIX}<|fim_suffix|>{SUFFIX}<|fim_middle|>",
    "codellama": f"<PRE> {PREFIX} <SUF>{SUFFIX} <MID>",
    "codestral": f"[SUFFIX]{SUFFIX}[PREFIX]{PREFIX}",
    "codegemma": f"<|fim_prefix|>{PREFIX}<|fim_suffix|>{SUFFIX}<|fim_middle|>",
}


def test_the_required_templates_are_registered() -> None:
    assert set(EXPECTED) <= set(completion_templates())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_template_builds_its_documented_prompt(name: str) -> None:
    assert fim_prompt(name, PREFIX, SUFFIX) == EXPECTED[name]
    # a template object works as well as its name
    assert fim_prompt(get_completion_template(name), PREFIX, SUFFIX) == EXPECTED[name]


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.parametrize("suffix", [None, ""], ids=["None", "empty"])
def test_no_suffix_gives_the_plain_prompt(name: str, suffix: str | None) -> None:
    prompt = fim_prompt(name, PREFIX, suffix)
    assert prompt == PREFIX
    assert "None" not in prompt


@pytest.mark.parametrize(
    "position, expected",
    [
        (FimPosition.MIDDLE, "<B>pre<M>suf<E>"),
        (FimPosition.END, "<B>pre<E>suf<M>"),
        (FimPosition.SUFFIX_FIRST, "<B>suf<E>pre<M>"),
    ],
)
def test_positions(position: FimPosition, expected: str) -> None:
    template = CompletionTemplate("t", "<B>", "<M>", "<E>", position)
    assert template.format("pre", "suf") == expected
    assert template.format("pre", None) == "pre"
    assert template.format("pre", "") == "pre"


def test_deepseek_v4_fim_tokens_are_single_tokens_of_its_tokenizer(tokenizer) -> None:
    template = get_completion_template("deepseek-v4")
    ids = {}
    for marker in (template.begin, template.middle, template.end):
        encoded = tokenizer.hf.encode(marker, add_special_tokens=False)
        assert len(encoded) == 1, f"{marker!r} is not one token: {encoded}"
        assert tokenizer.hf.convert_ids_to_tokens(encoded[0]) == marker
        ids[marker] = encoded[0]
    prompt_ids = tokenizer.hf.encode(fim_prompt(template, PREFIX, SUFFIX), add_special_tokens=False)
    # DeepSeek's order: begin, prefix, hole, suffix, end — generation follows the end token.
    positions = [prompt_ids.index(ids[m]) for m in (template.begin, template.middle, template.end)]
    assert positions == sorted(positions)
    assert prompt_ids[0] == ids[template.begin] and prompt_ids[-1] == ids[template.end]


def test_unknown_template_lists_the_known_ones() -> None:
    with pytest.raises(UnknownName) as err:
        fim_prompt("santacoder", "a", "b")
    message = str(err.value)
    assert "santacoder" in message
    for name in EXPECTED:
        assert name in message


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match="prefix"):
        fim_prompt("star_coder", None, "x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="suffix"):
        fim_prompt("star_coder", "x", 3)  # type: ignore[arg-type]
    with pytest.raises(InvalidTemplateSpec, match="position"):
        CompletionTemplate("x", "a", "b", "c", "middle")  # type: ignore[arg-type]


# ---- JSON ------------------------------------------------------------------------------


def write(tmp_path: Path, value: object) -> Path:
    path = tmp_path / "templates.json"
    path.write_text(json.dumps(value), encoding="utf-8")
    return path


def test_load_a_list_and_register(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        [
            {"name": "json-psm", "begin": "<P>", "middle": "<M>", "end": "<S>", "position": "end"},
            {"name": "json-hole", "begin": "<B>", "middle": "<H>", "end": "<E>", "position": "MIDDLE"},
        ],
    )
    try:
        loaded = load_completion_templates(path, register=True)
        assert [t.name for t in loaded] == ["json-psm", "json-hole"]
        assert fim_prompt("json-psm", "a", "b") == "<P>a<S>b<M>"
        assert fim_prompt("json-hole", "a", "b") == "<B>a<H>b<E>"
        with pytest.raises(DuplicateName, match="json-psm"):
            load_completion_templates(path, register=True)
        load_completion_templates(path, register=True, override=True)
    finally:
        for name in ("json-psm", "json-hole"):
            if name in completion_templates():
                unregister_completion_template(name)


def test_load_a_mapping_by_name_and_round_trip(tmp_path: Path) -> None:
    original = get_completion_template("codellama")
    data = {"my-llama": {k: v for k, v in original.to_dict().items() if k != "name"}}
    (loaded,) = load_completion_templates(write(tmp_path, data))
    assert loaded == CompletionTemplate(
        "my-llama", original.begin, original.middle, original.end, original.position
    )
    assert "my-llama" not in completion_templates()  # not registered unless asked


@pytest.mark.parametrize(
    "value, message",
    [
        (
            [{"name": "x", "begin": "a", "middle": "b", "end": "c", "position": "start"}],
            "entry 0 .*'position'",
        ),
        ([{"name": "x", "begin": "a", "middle": "b", "position": "end"}], "'end' must be a string"),
        (
            [{"name": "x", "begin": "a", "middle": "b", "end": "c", "position": "end", "fim": 1}],
            "unknown field.*'fim'",
        ),
        ([{"begin": "a", "middle": "b", "end": "c", "position": "end"}], "'name'"),
        ({"k": {"name": "other", "begin": "a", "middle": "b", "end": "c", "position": "end"}}, "key is 'k'"),
        (42, "expected a JSON list or object"),
        (["nope"], "entry 0: expected an object"),
    ],
)
def test_load_errors_name_the_entry_and_field(tmp_path: Path, value: object, message: str) -> None:
    with pytest.raises(InvalidTemplateSpec, match=message):
        load_completion_templates(write(tmp_path, value))


def test_load_errors_for_missing_and_broken_files(tmp_path: Path) -> None:
    with pytest.raises(InvalidTemplateSpec, match="cannot read"):
        load_completion_templates(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json", encoding="utf-8")
    with pytest.raises(InvalidTemplateSpec, match="broken.json: not valid JSON"):
        load_completion_templates(broken)


def test_registering_twice_needs_override() -> None:
    template = CompletionTemplate("dup-test", "a", "b", "c", FimPosition.END)
    register_completion_template(template)
    try:
        with pytest.raises(DuplicateName):
            register_completion_template(template)
        register_completion_template(
            CompletionTemplate("dup-test", "x", "y", "z", FimPosition.END), override=True
        )
        assert fim_prompt("dup-test", "p", "s") == "xpzsy"
    finally:
        unregister_completion_template("dup-test")
