"""An engine assembled from options: :class:`EngineSpec` → :func:`load_model_and_compiler`
→ :func:`build_engine`.

The one place that turns what was asked for (``thinkstruct serve`` and ``generate``'s
options) into a model, its grammar compiler and a started
:class:`~thinkstruct.engine.core.engine.Engine`, whose runner the engine picks on its own
thread (:func:`~thinkstruct.engine.runners.decoder_runner.default_runner`). The command
line builds its engine here; on Ray Serve each engine replica builds its own from the same
spec, and the ingress its model and compiler (the spec travels to Ray's processes as plain
data).
"""

from __future__ import annotations

import gc
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from thinkstruct.engine.core.config import EngineConfig
from thinkstruct.engine.core.engine import Engine
from thinkstruct.engine.model.loading import AUTO, load_model
from thinkstruct.grammar.service.config import CompilerConfig

if TYPE_CHECKING:
    from thinkstruct.engine.model.loading import LoadedModel
    from thinkstruct.grammar.service.compiler import GrammarCompiler

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class EngineSpec:
    """What to serve and how.

    Attributes:
        model: a local Hugging Face model directory or ``.gguf`` file; ``None`` is the
            embedded SmolLM2-135M-Instruct.
        dtype: weights and activations without ``quantize`` (see
            :func:`~thinkstruct.engine.model.loading.load_model`).
        quantize: the Linear layers' format: ``"auto"`` (chosen for the model),
            ``"gguf"``, ``"int8-weights"``, ``"int8"``, or ``None`` (``dtype``'s weights).
        reasoning_parser: the model's reasoning family (``None``: detected).
        engine: how the engine schedules.
        compiler: how the grammar compiler compiles.
    """

    model: Path | None = None
    dtype: str = "bfloat16"
    quantize: str | None = AUTO
    reasoning_parser: str | None = None
    engine: EngineConfig = field(default_factory=EngineConfig)
    compiler: CompilerConfig = field(default_factory=CompilerConfig)


def load_model_and_compiler(
    spec: EngineSpec, *, progress: bool = True
) -> tuple[LoadedModel, GrammarCompiler]:
    """The model and a grammar compiler for its tokenizer, as ``spec`` says (``progress``:
    progress bars while a GGUF converts)."""
    from thinkstruct.grammar.service.compiler import GrammarCompiler

    model = load_model(
        spec.model,
        dtype=spec.dtype,
        quantize=spec.quantize,
        reasoning_parser=spec.reasoning_parser,
        progress=progress,
    )
    return model, GrammarCompiler(model.tokenizer, spec.compiler)


def build_engine(spec: EngineSpec, *, progress: bool = True, warm_up: bool = False) -> Engine:
    """Load the model and start an engine for it (the caller closes it, then its compiler);
    ``warm_up`` starts the grammar compile workers too, so the first constrained requests
    do not wait for them."""
    model, compiler = load_model_and_compiler(spec, progress=progress)
    engine = Engine(model, config=spec.engine, compiler=compiler)
    engine.start()
    if warm_up:
        try:
            compiler.warm_up()
        except Exception:  # the workers start again on demand; serving goes on
            log.warning("grammar compile workers did not warm up", exc_info=True)
    # What loading made lives as long as the process (~380k objects: the tokenizer's
    # vocabularies, the model's modules): a full collection walked them all, ~0.4 s with
    # the GIL held, a stall of every stream at once. Frozen, collections skip them.
    gc.freeze()
    return engine
