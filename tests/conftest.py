import os

# libgomp's spinning workers collapse torch throughput when the cores are shared (the
# compile workers, a server under test): measured 20x slower. Set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest

from thinkstruct import Tokenizer


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    """The default DeepSeek-V4 tokenizer (129,280 tokens), loaded once per test run."""
    return Tokenizer.default()
