"""The generic registry behind the reasoning-family, completion-template and tool-call-syntax
registries."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from thinkstruct.parsers import (
    CompletionTemplate,
    DuplicateName,
    FimPosition,
    UnknownName,
    get_completion_template,
    get_reasoning_family,
    register_completion_template,
    register_reasoning_family,
    unregister_completion_template,
    unregister_reasoning_family,
)
from thinkstruct.parsers.tool_calls import (
    ToolCallSyntax,
    get_tool_call_syntax,
    register_tool_call_syntax,
    tool_call_syntaxes,
    unregister_tool_call_syntax,
)
from thinkstruct.registry import Registry


@dataclass(frozen=True)
class Item:
    name: str
    value: int = 0


def test_register_get_unregister() -> None:
    registry: Registry[Item] = Registry("test item", Item)
    a = Item("a", 1)
    registry.register(a)
    assert registry.get("a") is a
    other = Item("other")
    assert registry.get(other) is other  # an item is returned as is, registered or not
    registry.unregister("a")
    with pytest.raises(UnknownName):
        registry.get("a")


def test_a_taken_name_needs_override() -> None:
    registry: Registry[Item] = Registry("test item", Item)
    registry.register(Item("a", 1))
    with pytest.raises(
        DuplicateName, match=r"^test item 'a' is already registered; pass override=True to replace it$"
    ):
        registry.register(Item("a", 2))
    assert registry.get("a").value == 1
    registry.register(Item("a", 2), override=True)
    assert registry.get("a").value == 2


def test_unknown_names_are_labelled_with_the_kind_and_list_the_known_ones() -> None:
    registry: Registry[Item] = Registry("test item", Item)
    registry.register(Item("b"))
    registry.register(Item("a"))
    with pytest.raises(UnknownName) as err:
        registry.get("c")
    assert str(err.value) == "unknown test item 'c'; known: a, b"
    assert (err.value.kind, err.value.name, err.value.known) == ("test item", "c", ("a", "b"))
    with pytest.raises(UnknownName, match="unknown test item 'c'"):
        registry.unregister("c")
    with pytest.raises(UnknownName, match="unknown test item 3"):
        registry.get(3)  # type: ignore[arg-type]


def test_only_the_item_type_registers() -> None:
    registry: Registry[Item] = Registry("test item", Item)
    with pytest.raises(TypeError, match="^expected a Item, got str$"):
        registry.register("a")  # type: ignore[arg-type]


def test_a_check_refuses_an_entry_before_it_is_registered() -> None:
    def positive(item: Item) -> None:
        if item.value <= 0:
            raise ValueError(f"{item.name} needs a positive value")

    registry: Registry[Item] = Registry("test item", Item, check=positive)
    with pytest.raises(ValueError, match="^a needs a positive value$"):
        registry.register(Item("a", 0))
    assert registry.snapshot() == {}
    registry.register(Item("a", 1))
    with pytest.raises(ValueError, match="^a needs a positive value$"):
        registry.register(Item("a", -1), override=True)  # refused even where override is asked
    assert registry.get("a").value == 1


def test_the_tool_call_syntax_registry_refuses_a_syntax_without_a_start() -> None:
    class Unstartable(ToolCallSyntax):
        name = "test-unstartable"

    class Startable(ToolCallSyntax):
        name = "test-startable"
        starts = ("<call>",)

    with pytest.raises(ValueError, match="needs a name and at least one start marker"):
        register_tool_call_syntax(Unstartable())
    assert "test-unstartable" not in tool_call_syntaxes()
    syntax = Startable()
    register_tool_call_syntax(syntax)
    try:
        assert get_tool_call_syntax("test-startable") is syntax
        assert tool_call_syntaxes()["test-startable"] is syntax
    finally:
        unregister_tool_call_syntax("test-startable")
    with pytest.raises(UnknownName, match="^unknown tool-call syntax 'test-startable'"):
        get_tool_call_syntax("test-startable")


def test_a_snapshot_is_a_copy() -> None:
    registry: Registry[Item] = Registry("test item", Item)
    registry.register(Item("a"))
    snap = registry.snapshot()
    snap["b"] = Item("b")
    assert set(registry.snapshot()) == {"a"}


def test_the_public_registries_keep_their_labels() -> None:
    with pytest.raises(UnknownName, match="^unknown reasoning family 'nope'"):
        get_reasoning_family("nope")
    with pytest.raises(UnknownName, match="^unknown completion template 'nope'"):
        get_completion_template("nope")
    with pytest.raises(UnknownName, match="^unknown reasoning family 'nope'"):
        unregister_reasoning_family("nope")
    with pytest.raises(UnknownName, match="^unknown completion template 'nope'"):
        unregister_completion_template("nope")
    with pytest.raises(TypeError, match="^expected a ReasoningFamily, got str$"):
        register_reasoning_family("qwen3")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="^expected a CompletionTemplate, got str$"):
        register_completion_template("star_coder")  # type: ignore[arg-type]
    template = CompletionTemplate("star_coder", "<a>", "<b>", "<c>", FimPosition.END)
    with pytest.raises(DuplicateName, match="^completion template 'star_coder' is already registered"):
        register_completion_template(template)
    with pytest.raises(DuplicateName, match="^reasoning family 'qwen3' is already registered"):
        register_reasoning_family(get_reasoning_family("qwen3"))
