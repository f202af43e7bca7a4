"""The serving engine: continuous batching over a transformers causal LM (see docs/design.md).

Usable without HTTP::

    from thinkstruct.engine import Engine, GenerationRequest, SamplingParams, load_model

    model = load_model()                      # the embedded SmolLM2-135M-Instruct
    with Engine(model) as engine:
        handle = engine.submit(GenerationRequest(prompt_ids=ids, sampling=SamplingParams(max_tokens=64)))
        print(handle.wait().content)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from thinkstruct.engine.core.config import EngineClosed, EngineConfig, EngineOverloaded, EngineStats
from thinkstruct.engine.core.engine import Engine
from thinkstruct.engine.core.handle import RequestHandle
from thinkstruct.engine.request import (
    Completion,
    Delta,
    FinishReason,
    GenerationRequest,
    SamplingParams,
    Usage,
)

if TYPE_CHECKING:
    from thinkstruct.engine.model.loading import LoadedModel, load_model

__all__ = [
    "Completion",
    "Delta",
    "Engine",
    "EngineClosed",
    "EngineConfig",
    "EngineOverloaded",
    "EngineStats",
    "FinishReason",
    "GenerationRequest",
    "LoadedModel",
    "RequestHandle",
    "SamplingParams",
    "Usage",
    "load_model",
]


def __getattr__(name: str) -> Any:
    # Model loading pulls in the GGUF reader and the model cache; import it when asked.
    if name in ("LoadedModel", "load_model"):
        from thinkstruct.engine.model import loading

        return getattr(loading, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
