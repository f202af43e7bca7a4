import pytest

from thinkstruct import Tokenizer


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    """The default DeepSeek-V4 tokenizer (129,280 tokens), loaded once per test run."""
    return Tokenizer.default()
