"""A model's reasoning family, found by data: :func:`detect_family`.

Each :class:`~thinkstruct.parsers.ReasoningFamily` of the registry lists
``model_patterns`` matched against the model's names, then its architecture; a model no
family claims gets :data:`PLAIN_FAMILY`. The FIM template for ``/v1/completions`` is the
one whose markers the vocabulary holds (:func:`completion_template_for`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from thinkstruct.parsers import (
    CompletionTemplate,
    ReasoningFamily,
    ThinkingSwitch,
    completion_templates,
    get_reasoning_family,
    reasoning_families,
)

if TYPE_CHECKING:
    from thinkstruct.tokenizer import Tokenizer

PLAIN_FAMILY = ReasoningFamily(
    name="plain",
    think_start="<think>",
    think_end="</think>",
    forced=False,
    switch=ThinkingSwitch("enable_thinking", default=False),
    description="A model no reasoning family claims: it answers directly; with enable_thinking=true "
    "(also handed to its own chat template) a <think>…</think> it writes itself is reasoning.",
)
"""The family of a model that no registered family's ``model_patterns`` match.

Thinking is off unless a request turns it on, so a constrained request to an unknown model
is constrained from its first token; it has no built-in chat template (the model's own is
used, or chat is unavailable). Not registered (the registry lists real protocols);
``load_model(reasoning_parser="plain")`` selects it.
"""


@dataclass(frozen=True, slots=True)
class FamilyChoice:
    """The reasoning family chosen for a model and why (for the log and ``/v1/models``)."""

    family: ReasoningFamily
    reason: str


def detect_family(*, names: Sequence[str], architectures: Sequence[str] = ()) -> FamilyChoice:
    """The reasoning family whose ``model_patterns`` best match a model.

    Names (served id, directory, GGUF ``general.name``...) are tried first; only when no
    pattern matches any name are the architectures (``model_type``, ``architectures``)
    tried. Within a tier the longest match wins (``qwen3.*thinking`` over ``qwen3``), a tie
    goes to the earlier registered family. No match gives :data:`PLAIN_FAMILY`.
    """
    families = list(reasoning_families().values())
    for tier, candidates in (("name", names), ("architecture", architectures)):
        best: tuple[int, ReasoningFamily, str, str] | None = None
        for family in families:
            for pattern in family.model_patterns:
                for candidate in candidates:
                    found = re.search(pattern, candidate, re.IGNORECASE)
                    if found and (best is None or len(found.group()) > best[0]):
                        best = (len(found.group()), family, candidate, pattern)
        if best is not None:
            _, family, candidate, pattern = best
            return FamilyChoice(family, f"{tier} {candidate!r} matches {pattern!r}")
    tried = ", ".join(repr(c) for c in [*names, *architectures])
    return FamilyChoice(
        PLAIN_FAMILY,
        f"no reasoning family's model_patterns match {tried}; using {PLAIN_FAMILY.name!r} "
        "(answers directly; pass reasoning_parser= / --reasoning-parser to choose a family)",
    )


def completion_template_for(tokenizer: Tokenizer, family: ReasoningFamily) -> CompletionTemplate | None:
    """The FIM template whose markers are all single tokens of ``tokenizer``'s vocabulary.

    A template named like the family is preferred (DeepSeek-V4's FIM tokens are also
    DeepSeek-Coder's), then the first registered. ``None`` when none fits: SmolLM2's
    vocabulary has StarCoder's repository tokens but no ``<fim_*>`` tokens.
    """
    vocabulary = frozenset(tokenizer.hf.get_vocab())
    fitting = [t for t in completion_templates().values() if _markers_are_tokens(vocabulary, t)]
    for template in fitting:
        if template.name == family.name:
            return template
    return fitting[0] if fitting else None


def _markers_are_tokens(vocabulary: frozenset[str], template: CompletionTemplate) -> bool:
    # Stripped: Code Llama's markers carry a space that its tokenizer folds into the token.
    markers = [m.strip() for m in (template.begin, template.middle, template.end) if m.strip()]
    return bool(markers) and all(m in vocabulary for m in markers)


def family_by_name(name: str | ReasoningFamily) -> ReasoningFamily:
    """The family called ``name`` in the registry, or :data:`PLAIN_FAMILY` for ``"plain"``.

    Raises:
        UnknownName: no such family; the message lists the known ones.
    """
    if isinstance(name, ReasoningFamily):
        return name
    if name == PLAIN_FAMILY.name:
        return PLAIN_FAMILY
    return get_reasoning_family(name)
