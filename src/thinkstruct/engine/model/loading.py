"""Load a causal LM for the engine: :func:`load_model` returns a :class:`LoadedModel`.

One code path for every model: the path is resolved (:mod:`.paths`: a local Hugging Face
model directory, a ``.gguf`` file, or the embedded SmolLM2-135M-Instruct); a GGUF is
converted once into a cached model directory (:mod:`.gguf_conversion`); the weights load
with transformers, offline (:mod:`.hf_loading`); the reasoning family is found by data in
the family registry (:mod:`.families`); the tokenizer is fitted to the model's logits
(:mod:`.tokenizer_loading`); the Linear layers are quantized as ``quantize`` says
(:mod:`thinkstruct.engine.weights`).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from thinkstruct.engine.model.families import (
    FamilyChoice,
    completion_template_for,
    detect_family,
    family_by_name,
)
from thinkstruct.engine.model.gguf_conversion import converted_gguf
from thinkstruct.engine.model.hf_loading import context_length, load_config, load_weights
from thinkstruct.engine.model.paths import model_names, resolve_path
from thinkstruct.engine.model.tokenizer_loading import load_tokenizer
from thinkstruct.parsers import (
    ChatTemplate,
    ChatTemplateError,
    CompletionTemplate,
    ReasoningFamily,
    chat_template_for,
)

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

    from thinkstruct.tokenizer import Tokenizer

log = logging.getLogger(__name__)

DTYPES = ("bfloat16", "float32", "float16")
"""Accepted ``dtype`` names. bfloat16 halves the weight bytes of float32; on CPUs without
AVX512-BF16 its matmuls are slow at batch > 1 (see the README's numbers)."""

QUANTIZATIONS = ("int8", "int8-weights", "gguf")
"""Accepted ``quantize`` values (and :data:`AUTO`): ``"int8"`` is torch's dynamic int8
quantization of the ``nn.Linear`` layers (weights int8 per channel, activations quantized on the fly per tensor,
float32 elsewhere), except layers whose inputs carry outliers (see :func:`load_model`);
``"int8-weights"`` stores the weights as int8 (one scale per output row) and keeps the
activations float32 (:mod:`thinkstruct.engine.weights.int8_weights`): much closer to float32,
slower to prefill; ``"gguf"`` (a GGUF only) multiplies by the file's own Q4_0/Q4_1/Q8_0
blocks on the compiled kernels, activations rounded to int16 per block of 32
(:mod:`thinkstruct.engine.weights.gguf_weights`).
All compute in float32."""

AUTO = "auto"
"""``quantize`` chosen for the model (:func:`default_quantize`)."""


@dataclass(frozen=True)
class LoadedModel:
    """A model ready for the engine.

    Attributes:
        model: the transformers causal LM, in eval mode, on CPU, gradients off.
        tokenizer: its vocabulary, with the family's think tags.
        family: the reasoning family (tags, tool-call start, chat-template switch).
        name: the served model id, e.g. ``"SmolLM2-135M-Instruct"``.
        path: what was loaded: the model directory or the ``.gguf`` file.
        dtype: the dtype activations (and non-quantized weights) are computed in.
        quantize: ``"int8"``, ``"int8-weights"``, ``"gguf"`` or ``None``.
        context_length: the model's maximum sequence length in tokens (prompt + output).
        chat_template: the template chat requests are rendered with; ``None`` when neither
            the model nor its family has one.
        completion_template: the FIM template for ``/v1/completions`` with a suffix;
            ``None`` when the vocabulary has no family's FIM tokens.
        family_reason: why :attr:`family` was chosen.
        weights_dir: the directory the weights were read from (the cache entry of a GGUF).
        converted: whether this load converted a GGUF (first start) rather than read the cache.
        float_modules: under quantization, the Linear layers kept in float32 (``int8``:
            their inputs have outliers a per-tensor int8 scale cannot represent;
            ``int8-weights``: a bias, or an output size the packing cannot take).
        load_seconds: wall time of :func:`load_model`.
    """

    model: PreTrainedModel
    tokenizer: Tokenizer
    family: ReasoningFamily
    name: str
    path: Path
    dtype: torch.dtype
    quantize: str | None
    context_length: int
    chat_template: ChatTemplate | None
    completion_template: CompletionTemplate | None
    family_reason: str = ""
    weights_dir: Path | None = None
    converted: bool = False
    float_modules: tuple[str, ...] = ()
    load_seconds: float = field(default=0.0, compare=False)


def load_model(
    path: str | os.PathLike[str] | None = None,
    *,
    dtype: str = "bfloat16",
    quantize: str | None = None,
    reasoning_parser: str | None = None,
    progress: bool = True,
) -> LoadedModel:
    """Load a model for the engine.

    Args:
        path: a local Hugging Face model directory or a ``.gguf`` file; ``None`` is the
            embedded SmolLM2-135M-Instruct. A GGUF is converted once and cached.
        dtype: ``"bfloat16"``, ``"float32"`` or ``"float16"``.
        quantize: ``None`` or ``"int8"``: torch's dynamic int8 on the ``nn.Linear`` layers,
            quantized from the float32 weights; a layer whose input has outliers (found on
            one calibration forward) stays float32; ``"int8-weights"``: int8 weights on
            every bias-free ``nn.Linear``, float32 activations; ``"gguf"``: a GGUF's own
            Q4_0/Q4_1/Q8_0 blocks (others int8 rows), activations rounded to int16 per
            block of 32 for the integer multiply; ``"auto"``:
            :func:`default_quantize`. The model then computes in float32 whatever
            ``dtype`` says.
        reasoning_parser: a reasoning family name (or ``"plain"``) that overrides detection.
        progress: show progress bars (stderr) while converting a GGUF.

    Raises:
        ModelNotFoundError: nothing at ``path``.
        UnsupportedModelError: not a causal LM transformers can load locally (names the path).
        UnknownName: an unknown ``reasoning_parser``; the message lists the known ones.
        ValueError: a bad ``dtype`` or ``quantize`` (names it).
    """
    started = time.perf_counter()
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if quantize is not None and quantize not in (*QUANTIZATIONS, AUTO):
        raise ValueError(
            f"quantize must be None, {AUTO} or one of {', '.join(QUANTIZATIONS)}, got {quantize!r}"
        )
    forced_family = family_by_name(reasoning_parser) if reasoning_parser is not None else None
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers/huggingface_hub read it
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

    source = resolve_path(path)
    if quantize == AUTO:
        quantize = default_quantize(source)
    if quantize == "gguf" and source.suffix != ".gguf":
        raise ValueError(f"quantize='gguf' runs a GGUF file's own blocks; {source} is not a .gguf file")
    names = model_names(source)
    converted = False
    if source.suffix == ".gguf":
        weights_dir, converted = converted_gguf(source, progress=progress)
    else:
        weights_dir = source
    config = load_config(weights_dir, shown=source)
    architectures = [str(config.model_type), *(getattr(config, "architectures", None) or [])]
    if forced_family is not None:
        choice = FamilyChoice(forced_family, f"reasoning_parser={reasoning_parser!r}")
    else:
        choice = detect_family(names=names, architectures=architectures)
    log.info("reasoning family %r for %s: %s", choice.family.name, source, choice.reason)

    model, compute_dtype = load_weights(weights_dir, dtype=dtype, quantize=quantize, shown=source)
    tokenizer = load_tokenizer(weights_dir, model, family=choice.family, name=names[0], shown=source)
    chat_template: ChatTemplate | None
    try:
        chat_template = chat_template_for(choice.family, tokenizer=tokenizer)
    except ChatTemplateError as exc:
        log.warning("%s has no chat template (%s); chat requests are unavailable", source, exc)
        chat_template = None
    float_modules = _quantize(
        model, quantize, source=source, tokenizer=tokenizer, chat_template=chat_template
    )
    loaded = LoadedModel(
        model=model,
        tokenizer=tokenizer,
        family=choice.family,
        name=names[0],
        path=source,
        dtype=compute_dtype,
        quantize=quantize,
        context_length=context_length(model, config, shown=source),
        chat_template=chat_template,
        completion_template=completion_template_for(tokenizer, choice.family),
        family_reason=choice.reason,
        weights_dir=weights_dir,
        converted=converted,
        float_modules=float_modules,
        load_seconds=time.perf_counter() - started,
    )
    log.info(
        "loaded %s from %s: %s%s, context %d, family %s, completion template %s, in %.2f s",
        loaded.name,
        source,
        str(compute_dtype).removeprefix("torch."),
        f" + {quantize}" if quantize else "",
        loaded.context_length,
        loaded.family.name,
        loaded.completion_template.name if loaded.completion_template else None,
        loaded.load_seconds,
    )
    return loaded


def default_quantize(path: Path) -> str:
    """``quantize`` for the model at ``path`` when none is asked for: ``"gguf"`` for a GGUF
    with quantized tensors of a block format the kernels run (its others int8 rows), else
    ``"int8-weights"`` (int8 weights with float32 activations keep answers as close to
    float32 as bfloat16 does and decode several times faster on a CPU: README, "Serving
    performance")."""
    from thinkstruct.engine.weights.gguf_weights import runs_blocks

    return "gguf" if path.suffix == ".gguf" and runs_blocks(path) else "int8-weights"


def _quantize(
    model: PreTrainedModel,
    quantize: str | None,
    *,
    source: Path,
    tokenizer: Tokenizer,
    chat_template: ChatTemplate | None,
) -> tuple[str, ...]:
    """Quantize ``model``'s Linear layers in place as ``quantize`` says; the names of those
    kept in float32."""
    float_modules: tuple[str, ...] = ()
    if quantize == "int8":
        from thinkstruct.engine.weights.int8 import quantize_int8

        result = quantize_int8(model, _calibration_ids(tokenizer, chat_template))
        float_modules = result.float_modules
        log.info(
            "int8 dynamic quantization of %s: %d Linear layers smoothed, %d kept in float32 "
            "for outlier inputs (%s), %.1f s",
            source,
            result.smoothed,
            len(float_modules),
            ", ".join(float_modules) or "none",
            result.seconds,
        )
    elif quantize == "int8-weights":
        from thinkstruct.engine.weights.int8_weights import quantize_int8_weights

        weights = quantize_int8_weights(model)
        float_modules = weights.kept_float
        log.info(
            "int8 weights for %s: %d Linear layers on %s, %d kept float32 (%s), %.2f s",
            source,
            len(weights.quantized),
            "the compiled kernels" if weights.compiled else "torch's int8 matrix multiply",
            len(float_modules),
            ", ".join(float_modules) or "none",
            weights.seconds,
        )
    elif quantize == "gguf":
        from thinkstruct.engine.weights.gguf_weights import quantize_gguf

        blocks = quantize_gguf(model, source)
        log.info(
            "GGUF blocks for %s: %d Linear layers on the file's blocks (%s), %d on int8 rows (%s), %.2f s",
            source,
            len(blocks.blocks),
            ", ".join(sorted(set(blocks.blocks.values()))) or "none",
            len(blocks.int8),
            ", ".join(blocks.int8) or "none",
            blocks.seconds,
        )
    return float_modules


def _calibration_ids(tokenizer: Tokenizer, chat_template: ChatTemplate | None) -> list[int]:
    from thinkstruct.engine.weights.int8 import CALIBRATION_CHAT

    text = None
    if chat_template is not None:
        try:
            text = chat_template.render(CALIBRATION_CHAT, add_generation_prompt=False)
        except ChatTemplateError:
            text = None
    if text is None:
        text = "\n".join(m["content"] for m in CALIBRATION_CHAT)
    ids: list[int] = tokenizer.hf.encode(text, add_special_tokens=False)
    return ids
