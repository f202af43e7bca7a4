"""docs/keyword_support.md states what the backend registry declares, and auto's tables are
derived from it."""

from __future__ import annotations

from pathlib import Path

from thinkstruct.grammar.backends import backend_classes
from thinkstruct.grammar.base import NO_BACKEND_ENFORCES
from thinkstruct.grammar.constraint import ConstraintKind
from thinkstruct.grammar.service import auto

from .conformance_support import capability_table, vllm_keyword_table

DOC = Path(__file__).resolve().parents[2] / "docs" / "keyword_support.md"


def test_the_doc_holds_the_registry_table() -> None:
    assert capability_table() in DOC.read_text(encoding="utf-8"), (
        "docs/keyword_support.md is out of date with the backend registry; paste the table "
        "printed by `python -m tests.grammar.conformance_support --report`"
    )


def test_the_doc_holds_the_vllm_table() -> None:
    assert vllm_keyword_table() in DOC.read_text(encoding="utf-8"), (
        "docs/keyword_support.md is out of date with thinkstruct.grammar.schema.dead_ends; paste the "
        "table printed by `python -m tests.grammar.conformance_support --report`"
    )


def test_auto_tables_come_from_the_declarations() -> None:
    classes = {cls.name: cls for cls in backend_classes()}
    assert {name: cls.inexact_keywords for name, cls in classes.items()} == auto.INEXACT
    assert auto.JSON_ORDER == ("llguidance", "xgrammar", "outlines")
    assert auto.KIND_ORDER[ConstraintKind.STRUCTURAL_TAG] == ("xgrammar", "llguidance")
    assert auto.KIND_ORDER[ConstraintKind.JSON_OBJECT] == ("llguidance", "xgrammar")  # outlines: minutes
    assert auto.LENIENT_ORDER == ("llguidance", "xgrammar")
    # The keywords schema rewrites look for: every keyword some backend cannot enforce,
    # format, additionalItems and $dynamicRef included.
    assert {"format", "additionalItems", "$dynamicRef"} <= auto.HARD_KEYWORDS
    assert NO_BACKEND_ENFORCES <= auto.HARD_KEYWORDS
