"""Session fixtures for the engine tests: the embedded SmolLM2 model and a tiny model.

``smollm2`` reads the user cache (``THINKSTRUCT_CACHE`` or ``~/.cache/thinkstruct``): the
first test run on a machine converts the GGUF once (about 20 s), later runs load the
cache in about a second. Only tests that must exercise the conversion point the cache
at a temporary directory.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_model import build_tiny_model

from thinkstruct.engine.model.loading import LoadedModel, load_model


@pytest.fixture(scope="session")
def smollm2() -> LoadedModel:
    """The embedded SmolLM2-135M-Instruct in bfloat16, loaded once per test run."""
    return load_model(progress=False)


@pytest.fixture(scope="session")
def smollm2_gguf() -> LoadedModel:
    """SmolLM2-135M-Instruct on its GGUF file's own blocks, as ``thinkstruct serve`` runs it
    by default (decodes about 5x faster here than in bfloat16)."""
    return load_model(quantize="gguf", progress=False)


@pytest.fixture(scope="session")
def smollm2_int8() -> LoadedModel:
    """SmolLM2-135M-Instruct with dynamic int8 Linear layers (about 6 s to quantize)."""
    return load_model(quantize="int8", progress=False)


@pytest.fixture(scope="session")
def smollm2_int8_weights() -> LoadedModel:
    """SmolLM2-135M-Instruct with int8 weights and float32 activations (about 2 s)."""
    return load_model(quantize="int8-weights", progress=False)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny random Llama over the DeepSeek-V4 tokenizer (see tiny_model.py)."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir: Path) -> LoadedModel:
    """The tiny model loaded through ``load_model`` in float32 (family deepseek-v4)."""
    return load_model(tiny_model_dir, dtype="float32", progress=False)
