"""The package's module graph: no import cycle, and each layer imports only those below it.

Every module under ``src/thinkstruct`` is parsed with :mod:`ast`; every import counts,
wherever it is written (module top, inside a function, under ``TYPE_CHECKING``), absolute
or relative. ``from pkg import name`` is an import of the module ``pkg.name`` when there is
one, else of ``pkg``. Importing a module does not count as importing the packages above
it: only a module named in an import statement is an edge.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = "thinkstruct"
SOURCE = Path(__file__).resolve().parents[1] / "src" / PACKAGE

# The layers, bottom to top: (layer, the modules it holds as dotted prefixes under the
# package, the layers it stands on). A layer may import itself, the layers it stands on
# and, through them, every layer below; every allowed edge is derived from this table.
# grammar/ and parsers/ stand side by side on the base (docs/parsers.md: parsers/ imports
# nothing from grammar/); the engine and the vLLM integration use both. Inside the engine,
# its subpackages stand one on the other (docs/design.md, engine/): the compiled kernels,
# keys and values, weight formats, runners, model loading, the request types, sampling,
# the output side, the serving loop, then the engine's public names and its assembly.
LAYERS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("base", ("errors", "registry", "locations", "byte_level", "vocabularies", "tokenizer"), ()),
    ("grammar", ("grammar",), ("base",)),
    ("parsers", ("parsers",), ("base",)),
    ("integrations", ("integrations",), ("grammar", "parsers")),
    # The package's own ``__init__``: the public names of the layers below the engine.
    ("facade", ("",), ("grammar", "parsers")),
    ("engine.kernels", ("engine.kernels",), ("base",)),
    ("engine.kv", ("engine.kv",), ("engine.kernels",)),
    ("engine.weights", ("engine.weights",), ("engine.kv", "parsers")),
    ("engine.runners", ("engine.runners",), ("engine.weights",)),
    ("engine.model", ("engine.model",), ("engine.runners",)),
    ("engine.request", ("engine.request",), ("engine.model", "grammar")),
    ("engine.sampling", ("engine.sampling",), ("engine.request",)),
    ("engine.output", ("engine.output",), ("engine.sampling",)),
    ("engine.core", ("engine.core",), ("engine.output",)),
    ("engine", ("engine",), ("engine.core",)),
    ("server", ("server",), ("engine", "facade")),
    ("cli", ("cli",), ("server",)),
    # ``make vllm-serve``'s launcher: a model's directory and family for vLLM's server.
    ("vllm_serve", ("vllm_serve",), ("engine.model",)),
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SOURCE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(SOURCE.rglob("*.py"))}


def _imported(name: str, path: Path, modules: dict[str, Path]) -> Iterator[str]:
    """The package's modules that the module ``name`` (at ``path``) imports."""

    def known(dotted: str) -> str | None:
        # The module itself, else the nearest package above it that is one of ours.
        while dotted:
            if dotted in modules:
                return dotted
            dotted = dotted.rpartition(".")[0]
        return None

    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if found := known(alias.name):
                    yield found
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base = ".".join(base_parts[: len(base_parts) - (node.level - 1)])
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            for alias in node.names:
                if f"{source}.{alias.name}" in modules:
                    yield f"{source}.{alias.name}"
                elif found := known(source):
                    yield found


@functools.cache
def _graph() -> dict[str, set[str]]:
    """Each module with the package's modules it imports (read-only: shared by the tests)."""
    modules = _modules()
    return {name: set(_imported(name, path, modules)) - {name} for name, path in modules.items()}


def _components(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def _cycle_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest path from the component's first module back to itself."""
    start = min(component)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph[node] & component):
                if target == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if target not in previous:
                    previous[target] = node
                    following.append(target)
        frontier = following
    raise AssertionError(f"{sorted(component)} is not strongly connected")


def _layer_of(module: str) -> str:
    relative = module.removeprefix(PACKAGE).removeprefix(".")
    matches = [
        (len(prefix), layer)
        for layer, prefixes, _ in LAYERS
        for prefix in prefixes
        if relative == prefix or relative.startswith(f"{prefix}.")
    ]
    if not matches:
        raise AssertionError(f"{module} belongs to no layer of LAYERS")
    return max(matches)[1]


def _allowed() -> dict[str, set[str]]:
    """Each layer with the layers it may import: itself and everything below what it stands on."""
    stands_on = {layer: below for layer, _, below in LAYERS}
    allowed: dict[str, set[str]] = {}
    for layer in stands_on:
        reached, pending = {layer}, list(stands_on[layer])
        while pending:
            below = pending.pop()
            if below not in reached:
                reached.add(below)
                pending.extend(stands_on[below])
        allowed[layer] = reached
    return allowed


def test_graph_reads_every_form_of_import(tmp_path: Path) -> None:
    # The reader on a package of its own: each form of import gives the module it names.
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    for name in ("__init__", "a", "b", "c", "d", "e", "sub/__init__", "sub/f", "sub/g"):
        (root / f"{name}.py").write_text("")
    (root / "sub" / "f.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "import pkg.a\n"
        "from pkg import b, not_a_module\n"
        "from . import g\n"
        "from ..c import something\n"
        "if TYPE_CHECKING:\n"
        "    from pkg.d import Thing\n"
        "def late():\n"
        "    from .. import e\n"
        "import json\n"
    )
    modules = {
        ".".join(path.relative_to(tmp_path).with_suffix("").parts).removesuffix(".__init__"): path
        for path in root.rglob("*.py")
    }
    found = set(_imported("pkg.sub.f", root / "sub" / "f.py", modules))
    assert found == {"pkg.a", "pkg.b", "pkg", "pkg.sub.g", "pkg.c", "pkg.d", "pkg.e"}


def test_cycle_finder_names_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": set()}
    assert _components(graph) == [{"a", "b", "c"}]
    assert _cycle_in(graph, {"a", "b", "c"}) == ["a", "b", "c", "a"]
    assert _components({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    graph = _graph()
    found = [
        " -> ".join(_cycle_in(graph, component))
        + (f"  (these reach each other: {', '.join(sorted(component))})" if len(component) > 2 else "")
        for component in _components(graph)
    ]
    assert not found, "import cycles:\n" + "\n".join(found)


def test_every_module_has_a_layer() -> None:
    unplaced = []
    for module in _modules():
        try:
            _layer_of(module)
        except AssertionError as error:
            unplaced.append(str(error))
    assert not unplaced, "\n".join(unplaced)


@pytest.mark.parametrize("layer", [layer for layer, _, _ in LAYERS])
def test_layer_imports_only_layers_below(layer: str) -> None:
    allowed = _allowed()[layer]
    wrong = sorted(
        f"{module} -> {target} ({_layer_of(target)})"
        for module, targets in _graph().items()
        if _layer_of(module) == layer
        for target in targets
        if _layer_of(target) not in allowed
    )
    assert not wrong, f"{layer} may import {sorted(allowed)} only:\n" + "\n".join(wrong)
