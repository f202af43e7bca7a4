"""Fixtures for the parsers tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """The embedded SmolLM2 model's tokenizer (converted from its GGUF once, then cached)."""
    from thinkstruct.tokenizer import Tokenizer, smollm2_gguf_path

    return Tokenizer.from_pretrained(smollm2_gguf_path())
