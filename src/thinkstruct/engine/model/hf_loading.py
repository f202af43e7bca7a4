"""Loading with transformers, locally: a model's config, its weights
(:func:`load_weights`), the context it runs with (:func:`context_length`), and
transformers' progress bars (:func:`transformers_progress`).

Nothing is ever fetched from a model hub: every call is ``local_files_only`` (and
:func:`~thinkstruct.engine.model.loading.load_model` sets ``HF_HUB_OFFLINE``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from thinkstruct.engine.model.errors import UnsupportedModelError

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)

_progress_lock = threading.Lock()


def context_length(model: Any, config: Any, *, shown: Path) -> int:
    """The most tokens (prompt and output) the engine runs ``model`` with: its config's
    maximum sequence length, or its sliding window where that is shorter and only
    transformers' modules run it (:func:`_exact_context`)."""
    return _exact_context(model, _configured_context(config, shown=shown), shown=shown)


def _exact_context(model: Any, context_length: int, *, shown: Path) -> int:
    """``context_length``, or the model's sliding window where only transformers' modules
    run it: the transformers runner gives every layer one causal mask, so past the window
    its sliding layers would attend to tokens the model never sees; within the window the
    two are the same (the decoder runner applies windows per layer and keeps the context)."""
    from thinkstruct.engine.runners.decoder_runner import supports

    window = attention_window(model.config)
    if window is None or window >= context_length or supports(model, context_length=context_length) is None:
        return context_length
    log.warning(
        "%s: runs on transformers' modules, which apply no sliding window: context limited to its "
        "window of %d tokens (the config says %d)",
        shown,
        window,
        context_length,
    )
    return window


def attention_window(config: Any) -> int | None:
    """The sliding window (tokens) some attention layers of a model with this config use,
    or ``None`` when every layer attends to the whole context."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    window = getattr(text, "sliding_window", None)
    if not isinstance(window, int) or window <= 0:
        return None
    layer_types = getattr(text, "layer_types", None)
    if layer_types is not None:
        return window if "sliding_attention" in layer_types else None
    return window if getattr(text, "use_sliding_window", True) else None


def _configured_context(config: Any, *, shown: Path) -> int:
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(text_config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    log.warning("%s: the config gives no maximum sequence length; assuming 2048 tokens", shown)
    return 2048


def load_config(weights_dir: Path, *, shown: Path) -> Any:
    """The model's transformers config (``shown``: the path errors name).

    Raises:
        UnsupportedModelError: transformers cannot read it.
    """
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(weights_dir), local_files_only=True, trust_remote_code=False)
    except (ValueError, OSError, KeyError) as exc:
        raise UnsupportedModelError(f"{shown}: transformers cannot read this model's config: {exc}") from None


def _torch_dtype(name: str) -> torch.dtype:
    import torch

    return {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}[name]


def load_weights(
    weights_dir: Path, *, dtype: str, quantize: str | None, shown: Path
) -> tuple[PreTrainedModel, torch.dtype]:
    """The causal LM in ``weights_dir`` in eval mode, gradients off, and the dtype it computes
    in (float32 under any ``quantize``, which is applied later).

    Raises:
        UnsupportedModelError: not a causal LM transformers can load locally.
    """
    import torch
    from transformers import AutoModelForCausalLM

    compute = torch.float32 if quantize is not None else _torch_dtype(dtype)
    if quantize is not None and dtype != "float32":
        log.info("%s quantization computes in float32; dtype=%s does not apply", quantize, dtype)
    try:
        # Reading a plain directory takes well under a second: no bar for it.
        with transformers_progress(False):
            model = AutoModelForCausalLM.from_pretrained(
                str(weights_dir), dtype=compute, local_files_only=True, trust_remote_code=False
            )
    except (ValueError, OSError, KeyError) as exc:
        raise UnsupportedModelError(
            f"{shown}: not a causal language model transformers can load: {exc}"
        ) from None
    model.eval()
    model.requires_grad_(False)
    return model, compute


@contextlib.contextmanager
def transformers_progress(enabled: bool) -> Iterator[None]:
    """Show or hide transformers' own progress bars for the duration.

    transformers' GGUF reader uses ``tqdm`` directly rather than its logging helpers, so
    hiding it means swapping that module's ``tqdm`` for a silent one; both are restored.
    """
    if enabled:
        yield
        return
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    with _progress_lock:
        was_enabled = hf_logging.is_progress_bar_enabled()
        original = getattr(gguf_utils, "tqdm", None)
        hf_logging.disable_progress_bar()
        if original is not None:
            gguf_utils.tqdm = functools.partial(original, disable=True)
        try:
            yield
        finally:
            if original is not None:
                gguf_utils.tqdm = original
            if was_enabled:
                hf_logging.enable_progress_bar()
