"""What goes wrong loading a model: :class:`ModelLoadError` and its kinds."""

from __future__ import annotations

from thinkstruct.errors import ThinkstructError


class ModelLoadError(ThinkstructError):
    """A model could not be loaded; the message names the path and the problem."""


class ModelNotFoundError(ModelLoadError, FileNotFoundError):
    """No model directory or GGUF file at the given path (nothing is downloaded)."""


class UnsupportedModelError(ModelLoadError, ValueError):
    """The path holds something that is not a causal LM thinkstruct can run."""
