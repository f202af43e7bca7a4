"""Decoder architectures as data: :data:`ARCHITECTURES`, :data:`REFUSED`, :func:`architecture_of`.

Each entry says how a transformers model type lays out a decoder layer, in the terms the
decoder runner (:mod:`~thinkstruct.engine.runners.decoder_runner`), its compiled kernels and its
plain-torch path all read: which modules project the attention input (q/k/v separate or
fused) and the MLP input (gate/up separate or fused), whether query and key heads are
RMS-normalized before rotary positions, which layers skip rotary positions, and where a
sliding window comes from. Every entry is pre-norm RMSNorm with gated SiLU and a residual
around attention and MLP; biases are read from the modules themselves (Qwen2's q/k/v,
Llama's ``attention_bias``/``mlp_bias``), rotary tables from the model's own rotary
module (transformers' ``ROPE_INIT_FUNCTIONS``: default, linear, llama3, yarn, longrope's
short factors), partial rotary from its width. Tied embeddings need nothing: the output
layer is whatever ``get_output_embeddings()`` returns.

A model type no entry covers runs on transformers' modules; a type in :data:`REFUSED` is
one whose layers cannot be computed exactly by this layout (the reason says what), never
an approximation of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

#: Rotary variants whose tables are fixed for a model (computed once by transformers'
#: rotary module, read from its ``inv_freq`` and ``attention_scaling``).
STATIC_ROPE_TYPES = frozenset({"default", "linear", "llama3", "yarn"})


@dataclass(frozen=True, kw_only=True)
class Architecture:
    """How one transformers model type lays out its decoder layers.

    Attributes:
        model_type: the config's ``model_type``.
        qkv: the attention module's projections of the layer input, queries then keys
            then values (one name when they are fused: Phi-3's ``qkv_proj``).
        gate_up: the MLP module's projections of its input, gate then up (Phi-3's fused
            ``gate_up_proj``).
        qk_norm: every query and key head is RMS-normalized (``q_norm``/``k_norm`` of
            the attention module, over ``head_dim``) before rotary positions (Qwen3).
        rotary_switch: the attention module's boolean attribute saying whether that layer
            applies rotary positions (SmolLM3's ``use_rope``: every fourth layer does not);
            ``None``: every layer does.
        window: where a sliding window comes from: ``"none"``; ``"config"``: the config's
            ``sliding_window`` for every layer (Mistral, Phi-3); ``"layer"``: the
            attention module's ``sliding_window`` (Qwen2/Qwen3/SmolLM3 ``layer_types``).
    """

    model_type: str
    qkv: tuple[str, ...] = ("q_proj", "k_proj", "v_proj")
    gate_up: tuple[str, ...] = ("gate_proj", "up_proj")
    qk_norm: bool = False
    rotary_switch: str | None = None
    window: Literal["none", "config", "layer"] = "none"

    def rotates(self, attention: Any) -> bool:
        """Whether the layer of this ``attention`` module applies rotary positions."""
        return self.rotary_switch is None or bool(getattr(attention, self.rotary_switch))

    def sliding_window(self, config: Any, attention: Any) -> int | None:
        """The sliding window of the layer of this ``attention`` module (tokens a query
        sees, itself included), or ``None``."""
        if self.window == "config":
            return getattr(config, "sliding_window", None)
        if self.window == "layer":
            return getattr(attention, "sliding_window", None)
        return None


ARCHITECTURES: dict[str, Architecture] = {
    entry.model_type: entry
    for entry in (
        Architecture(model_type="llama"),
        Architecture(model_type="mistral", window="config"),
        Architecture(model_type="qwen2", window="layer"),
        Architecture(model_type="qwen3", qk_norm=True, window="layer"),
        Architecture(model_type="smollm3", rotary_switch="use_rope", window="layer"),
        Architecture(model_type="phi3", qkv=("qkv_proj",), gate_up=("gate_up_proj",), window="config"),
    )
}

#: Model types whose layers this layout cannot compute exactly, and what it lacks.
REFUSED: dict[str, str] = {
    "gemma": "Gemma's RMSNorm scales by (1 + weight) and its MLP is gelu",
    "gemma2": "Gemma 2 soft-caps attention and final logits and adds norms after attention and MLP",
    "gemma3": "Gemma 3 soft-caps logits, adds norms after attention and MLP and alternates rotary bases",
    "gemma3_text": "Gemma 3 soft-caps logits, adds norms after attention and MLP and alternates rotary bases",
    "olmo2": "OLMo 2 normalizes after attention and MLP and over all heads' queries and keys together",
    "phi": "Phi-1/2 use LayerNorm, a parallel attention and MLP, and gelu",
    "qwen3_moe": "Qwen3-MoE routes tokens to experts",
}


def text_config(model: Any) -> Any:
    """The decoder's config of a transformers model (a multimodal one's text part)."""
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def architecture_of(model: Any, *, context_length: int | None = None) -> Architecture | str:
    """The entry that computes ``model`` exactly, or the reason none does.

    Args:
        model: a transformers ``*ForCausalLM``.
        context_length: the most tokens a row will hold (a longrope model is exact only
            within its original context, where transformers keeps its short factors);
            ``None``: not known yet, checked only where it matters.
    """
    text = text_config(model)
    model_type = getattr(text, "model_type", None)
    if model_type in REFUSED:
        return f"model type {model_type!r}: {REFUSED[model_type]}"
    entry = ARCHITECTURES.get(str(model_type))
    if entry is None:
        return f"model type {model_type!r} has no entry in the architecture registry"
    rope = getattr(text, "rope_parameters", None) or {}
    rope_type = rope.get("rope_type", "default")
    if rope_type == "longrope":
        original = rope.get("original_max_position_embeddings") or getattr(
            text, "original_max_position_embeddings", None
        )
        if original is None or context_length is None or context_length > original:
            return (
                f"rope type 'longrope' beyond its original context ({original} positions): transformers "
                "switches its frequencies with the longest row of a batch"
            )
    elif rope_type not in STATIC_ROPE_TYPES:
        return f"rope type {rope_type!r} (the runner takes {', '.join(sorted(STATIC_ROPE_TYPES))}, longrope)"
    if getattr(text, "hidden_act", "silu") != "silu":
        return f"activation {text.hidden_act!r} (the runner computes gated SiLU)"
    if getattr(text, "pretraining_tp", 1) != 1:
        return "tensor-parallel pretraining layout"
    base = model.base_model
    layer = base.layers[0]
    missing = [name for name in entry.qkv if not hasattr(layer.self_attn, name)]
    missing += [name for name in entry.gate_up if not hasattr(layer.mlp, name)]
    if entry.qk_norm:
        missing += [name for name in ("q_norm", "k_norm") if not hasattr(layer.self_attn, name)]
    if not hasattr(base, "rotary_emb"):
        missing.append("rotary_emb")
    if missing:
        return f"model type {model_type!r} lacks the modules its entry names: {', '.join(missing)}"
    return entry
