"""A model as another server loads it: :func:`model_directory` returns a
:class:`ModelDirectory` (vLLM, through ``make vllm-serve``).

The same resolution as :func:`~thinkstruct.engine.model.loading.load_model` (a local
Hugging Face directory, a ``.gguf`` file converted once into the cache, or the embedded
SmolLM2), without loading any weights.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from thinkstruct.engine.model.families import FamilyChoice, detect_family
from thinkstruct.engine.model.gguf_conversion import converted_gguf
from thinkstruct.engine.model.hf_loading import load_config
from thinkstruct.engine.model.paths import model_names, resolve_path

if TYPE_CHECKING:
    from pathlib import Path


@dataclass(frozen=True, slots=True)
class ModelDirectory:
    """A model's Hugging Face directory, served name and family.

    Attributes:
        weights_dir: a Hugging Face model directory: the model's own, or a GGUF's
            converted cache entry.
        name: the served model id.
        choice: the reasoning family detected for it, and why.
    """

    weights_dir: Path
    name: str
    choice: FamilyChoice


def model_directory(path: str | os.PathLike[str] | None = None, *, progress: bool = True) -> ModelDirectory:
    """The Hugging Face directory of a model (``None``: the embedded SmolLM2), a GGUF
    converted once into the cache as :func:`~thinkstruct.engine.model.loading.load_model`
    converts it, with its served name and family; no weights are loaded.

    Args:
        path: a local Hugging Face model directory or a ``.gguf`` file.
        progress: show progress bars (stderr) while converting a GGUF.

    Raises:
        ModelNotFoundError, UnsupportedModelError: as ``load_model``.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    source = resolve_path(path)
    names = model_names(source)
    weights_dir = converted_gguf(source, progress=progress)[0] if source.suffix == ".gguf" else source
    config = load_config(weights_dir, shown=source)
    architectures = [str(config.model_type), *(getattr(config, "architectures", None) or [])]
    return ModelDirectory(weights_dir, names[0], detect_family(names=names, architectures=architectures))
