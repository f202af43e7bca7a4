"""Fill-in-the-middle (FIM) prompts for code-completion models.

A :class:`CompletionTemplate` holds a model's three FIM markers and where the *middle*
marker goes (:class:`FimPosition`):

- ``MIDDLE``: ``begin + prefix + middle + suffix + end``. DeepSeek-Coder style, where the
  "middle" marker is the hole (``<｜fim▁hole｜>``) and generation follows ``end``.
- ``END``: ``begin + prefix + end + suffix + middle``. StarCoder / Qwen-Coder / CodeGemma
  (PSM) style: ``<fim_prefix>…<fim_suffix>…<fim_middle>``, generation follows ``middle``.
- ``SUFFIX_FIRST``: ``begin + suffix + end + prefix + middle``, for models trained
  suffix-first (Codestral: ``[SUFFIX]…[PREFIX]…``), which neither of the others can express.

With no suffix (``None`` or ``""``) there is nothing to fill in: the prompt is the prefix,
unchanged. Templates live in a registry (:func:`completion_templates`) and can be loaded
from JSON (:func:`load_completion_templates`).
"""

from __future__ import annotations

import enum
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thinkstruct.parsers.errors import InvalidTemplateSpec
from thinkstruct.registry import Registry


class FimPosition(enum.Enum):
    """Where a template's *middle* marker goes (see the module docstring)."""

    MIDDLE = "middle"
    END = "end"
    SUFFIX_FIRST = "suffix_first"


@dataclass(frozen=True, slots=True)
class CompletionTemplate:
    """One model's FIM markers.

    Attributes:
        name: registry name, e.g. ``"deepseek_coder"``.
        begin, middle, end: the marker texts (``middle`` may be ``""`` for a model that
            generates right after the prefix, as Codestral does).
        position: where ``middle`` goes.
    """

    name: str
    begin: str
    middle: str
    end: str
    position: FimPosition

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidTemplateSpec(f"a completion template needs a non-empty name, got {self.name!r}")
        for label in ("begin", "middle", "end"):
            value = getattr(self, label)
            if not isinstance(value, str):
                raise InvalidTemplateSpec(
                    f"completion template {self.name!r}: {label} must be a string, got {type(value).__name__}"
                )
        if not isinstance(self.position, FimPosition):
            raise InvalidTemplateSpec(
                f"completion template {self.name!r}: position must be a FimPosition, got {self.position!r}"
            )

    def format(self, prefix: str, suffix: str | None = None) -> str:
        """The FIM prompt for ``prefix`` and ``suffix``; the bare prefix when there is no suffix."""
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
        if suffix is None or suffix == "":
            return prefix
        if not isinstance(suffix, str):
            raise TypeError(f"suffix must be a str or None, got {type(suffix).__name__}")
        if self.position is FimPosition.MIDDLE:
            return self.begin + prefix + self.middle + suffix + self.end
        if self.position is FimPosition.END:
            return self.begin + prefix + self.end + suffix + self.middle
        return self.begin + suffix + self.end + prefix + self.middle

    def to_dict(self) -> dict[str, str]:
        """The JSON form read by :func:`load_completion_templates`."""
        return {
            "name": self.name,
            "begin": self.begin,
            "middle": self.middle,
            "end": self.end,
            "position": self.position.value,
        }


_templates: Registry[CompletionTemplate] = Registry("completion template", CompletionTemplate)
register_completion_template = _templates.register
unregister_completion_template = _templates.unregister
get_completion_template = _templates.get
completion_templates = _templates.snapshot


def fim_prompt(template: str | CompletionTemplate, prefix: str, suffix: str | None = None) -> str:
    """The prompt that asks a code model to fill in between ``prefix`` and ``suffix``.

    Args:
        template: a registered template name or a :class:`CompletionTemplate`.
        prefix: the code before the hole (the request's ``prompt``).
        suffix: the code after it; ``None`` or ``""`` gives ``prefix`` unchanged.

    Raises:
        UnknownName: unknown template name (the message lists the known ones).
    """
    return get_completion_template(template).format(prefix, suffix)


def load_completion_templates(
    source: str | os.PathLike[str], *, register: bool = False, override: bool = False
) -> list[CompletionTemplate]:
    """Read completion templates from a JSON file.

    The file holds a list of objects, or one object, or an object mapping names to objects
    (the name then comes from the key), each with ``begin``, ``middle``, ``end`` (strings)
    and ``position`` (``"middle"``, ``"end"`` or ``"suffix_first"``).

    Args:
        source: path of the JSON file.
        register: also add them to the registry.
        override: with ``register``, replace templates of the same name.

    Raises:
        InvalidTemplateSpec: unreadable file or bad entry; the message names the file, the
            entry and the field.
    """
    path = Path(source)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InvalidTemplateSpec(f"{path}: cannot read completion templates: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise InvalidTemplateSpec(f"{path}: not valid JSON: {exc}") from exc
    entries: list[tuple[str, Any, str | None]]
    if isinstance(raw, list):
        entries = [(f"entry {i}", item, None) for i, item in enumerate(raw)]
    elif isinstance(raw, dict) and "begin" in raw:
        entries = [("the template", raw, None)]
    elif isinstance(raw, dict):
        entries = [(f"entry {key!r}", item, key) for key, item in raw.items()]
    else:
        raise InvalidTemplateSpec(
            f"{path}: expected a JSON list or object of templates, got {type(raw).__name__}"
        )
    templates = [
        _template_from_json(item, where=f"{path}: {label}", name=name) for label, item, name in entries
    ]
    if register:
        for template in templates:
            register_completion_template(template, override=override)
    return templates


def _template_from_json(item: Any, *, where: str, name: str | None) -> CompletionTemplate:
    if not isinstance(item, dict):
        raise InvalidTemplateSpec(f"{where}: expected an object, got {type(item).__name__}")
    unknown = sorted(set(item) - {"name", "begin", "middle", "end", "position"})
    if unknown:
        raise InvalidTemplateSpec(f"{where}: unknown field(s) {', '.join(map(repr, unknown))}")
    if name is None:
        name = item.get("name")
    elif "name" in item and item["name"] != name:
        raise InvalidTemplateSpec(f"{where}: field 'name' is {item['name']!r} but the key is {name!r}")
    if not isinstance(name, str) or not name:
        raise InvalidTemplateSpec(f"{where}: field 'name' must be a non-empty string")
    values: dict[str, str] = {}
    for field_name in ("begin", "middle", "end"):
        value = item.get(field_name)
        if not isinstance(value, str):
            raise InvalidTemplateSpec(
                f"{where} ({name!r}): field {field_name!r} must be a string, got {value!r}"
            )
        values[field_name] = value
    position = item.get("position")
    try:
        fim_position = FimPosition(position.lower() if isinstance(position, str) else position)
    except ValueError:
        known = ", ".join(repr(p.value) for p in FimPosition)
        raise InvalidTemplateSpec(
            f"{where} ({name!r}): field 'position' must be one of {known}, got {position!r}"
        ) from None
    return CompletionTemplate(name, values["begin"], values["middle"], values["end"], fim_position)


for _template in (
    # DeepSeek-Coder's documented FIM: <｜fim▁begin｜>prefix<｜fim▁hole｜>suffix<｜fim▁end｜>.
    CompletionTemplate(
        "deepseek_coder", "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>", FimPosition.MIDDLE
    ),
    # The same three tokens are in DeepSeek-V4's tokenizer (ids 128801, 128800, 128802).
    CompletionTemplate(
        "deepseek-v4", "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>", FimPosition.MIDDLE
    ),
    CompletionTemplate("star_coder", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", FimPosition.END),
    CompletionTemplate("qwen_coder", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", FimPosition.END),
    # Code Llama infilling: "<PRE> {prefix} <SUF>{suffix} <MID>" (the spaces are part of it).
    CompletionTemplate("codellama", "<PRE> ", " <MID>", " <SUF>", FimPosition.END),
    # Codestral: "[SUFFIX]{suffix}[PREFIX]{prefix}", the completion follows the prefix.
    CompletionTemplate("codestral", "[SUFFIX]", "", "[PREFIX]", FimPosition.SUFFIX_FIRST),
    CompletionTemplate("codegemma", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", FimPosition.END),
):
    register_completion_template(_template)
del _template
