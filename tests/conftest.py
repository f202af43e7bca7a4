import os

# libgomp's spinning workers collapse torch throughput when the cores are shared (the
# compile workers, a server under test): measured 20x slower. Set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# `make test` runs two pytest workers on two cores: one torch thread each (and in the
# servers they start), or four threads fight over two cores.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest

from thinkstruct import Tokenizer


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    """The default DeepSeek-V4 tokenizer (129,280 tokens), loaded once per test run."""
    return Tokenizer.default()
