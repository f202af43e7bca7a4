"""A GGUF file converted once into a plain model directory: :func:`converted_gguf`.

transformers' GGUF support dequantizes the file to float32 (about 20 s for SmolLM2-135M);
the converted weights and tokenizer are kept under ``cache_dir()/models/<gguf_cache_key>``
(:mod:`~thinkstruct.engine.model.model_cache`: built aside, renamed into place, one
converter at a time across processes), so later starts load that directory in well under
a second.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

from thinkstruct.engine.model.errors import UnsupportedModelError
from thinkstruct.engine.model.hf_loading import transformers_progress
from thinkstruct.engine.model.model_cache import cached_entry
from thinkstruct.parsers.gguf_metadata import GGUFFormatError, read_gguf_metadata
from thinkstruct.tokenizer import Tokenizer, cache_dir, gguf_cache_key

log = logging.getLogger(__name__)

_GGUF_CONVERSION_DTYPE = "float32"  # lossless for dequantized GGUF weights; every dtype loads from it


def models_cache_dir() -> Path:
    """Where converted GGUF models are kept: ``cache_dir()/models`` (``THINKSTRUCT_CACHE``)."""
    return cache_dir() / "models"


def converted_gguf(path: Path, *, progress: bool) -> tuple[Path, bool]:
    """The cache entry of ``path``'s converted weights and tokenizer, converting if needed;
    whether this call converted it.

    Raises:
        UnsupportedModelError: a GGUF transformers cannot read or convert.
    """
    root = models_cache_dir()
    key = gguf_cache_key(path)

    def waiting() -> None:
        log.warning("waiting for another process converting %s into %s", path.name, root / key)
        if progress:
            print(f"thinkstruct: waiting for another process converting {path.name} ...", file=sys.stderr)

    entry, built = cached_entry(
        root, key, lambda staging: _convert_gguf(path, staging, progress=progress), on_wait=waiting
    )
    return entry, built


def _convert_gguf(path: Path, out: Path, *, progress: bool) -> dict[str, Any]:
    """Dequantize ``path`` with transformers and save a plain model directory into ``out``."""
    import torch
    import transformers
    from tqdm.auto import tqdm

    _check_gguf_architecture(path)
    started = time.perf_counter()
    log.info("converting %s once into %s (later starts read the cache)", path, out.parent)
    steps = ("tokenizer", "dequantize weights", "write weights")
    with tqdm(
        total=len(steps),
        desc=f"thinkstruct: converting {path.name} (first start only)",
        unit="step",
        file=sys.stderr,
        disable=not progress,
        bar_format="{desc}: {n_fmt}/{total_fmt} {postfix} [{elapsed}]",
    ) as bar:
        bar.set_postfix_str(steps[0])
        # Tokenizer.from_pretrained keeps its own cache of GGUF tokenizers: reused if there.
        try:
            tokenizer = Tokenizer.from_pretrained(path)
        except (ValueError, OSError, KeyError) as exc:
            raise UnsupportedModelError(
                f"{path}: transformers cannot read this GGUF's tokenizer: {exc}"
            ) from None
        tokenizer.hf.save_pretrained(str(out))
        bar.update()
        bar.set_postfix_str(steps[1])
        try:
            with transformers_progress(progress):
                model = transformers.AutoModelForCausalLM.from_pretrained(
                    str(path.parent),
                    gguf_file=path.name,
                    dtype=getattr(torch, _GGUF_CONVERSION_DTYPE),
                    local_files_only=True,
                    quantization_config=transformers.GgufConfig(dequantize=True),
                )
        except (ValueError, OSError, KeyError) as exc:
            raise UnsupportedModelError(f"{path}: transformers cannot convert this GGUF: {exc}") from None
        bar.update()
        bar.set_postfix_str(steps[2])
        with transformers_progress(progress):
            model.save_pretrained(str(out))
        bar.update()
    stat = path.stat()
    seconds = time.perf_counter() - started
    log.info("converted %s in %.1f s", path.name, seconds)
    return {
        "source": str(path),
        "source_size": stat.st_size,
        "source_mtime_ns": stat.st_mtime_ns,
        "dtype": _GGUF_CONVERSION_DTYPE,
        "transformers": transformers.__version__,
        "seconds": round(seconds, 2),
    }


# The GGUF architecture names transformers renames before its own support check.
_GGUF_ARCHITECTURE_RENAMES = {
    "qwen2moe": "qwen2_moe",
    "qwen3moe": "qwen3_moe",
    "gpt-oss": "gpt_oss",
    "minimax-m2": "minimax_m2",
}


def _check_gguf_architecture(path: Path) -> None:
    """Refuse, before the slow part, a GGUF whose architecture transformers cannot load."""
    try:
        meta = read_gguf_metadata(path, ("general.architecture",))
    except (GGUFFormatError, OSError) as exc:
        raise UnsupportedModelError(f"{path}: cannot read the GGUF header: {exc}") from None
    architecture = str(meta.get("general.architecture"))
    try:
        from transformers.modeling_gguf_pytorch_utils import (
            GGUF_SUPPORTED_ARCHITECTURES,
        )
    except ImportError:  # moved: let transformers itself refuse
        return
    renamed = _GGUF_ARCHITECTURE_RENAMES.get(architecture, architecture)
    if architecture not in GGUF_SUPPORTED_ARCHITECTURES and renamed not in GGUF_SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"{path}: GGUF architecture {architecture!r} is not supported by transformers' GGUF loader "
            f"(supported: {', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))})"
        )
