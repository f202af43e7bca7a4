"""The one place the plugin reaches into vLLM: three seams where vLLM 0.32 has no
extension point for a structured-output backend.

vLLM chooses its structured-output backend by name from a closed list, in three places:

1. ``StructuredOutputsConfig.backend`` is a pydantic ``Literal`` of vLLM's own backends:
   ``thinkstruct`` is added to it, so that vLLM's own flag
   (``--structured-outputs-config.backend thinkstruct``) selects this backend.
2. ``SamplingParams._validate_structured_outputs`` validates each request in the API
   server with vLLM's own libraries: for this backend it validates with thinkstruct's
   (:mod:`.frontend`: a refusal is vLLM's HTTP 400, naming the JSON pointer).
3. ``StructuredOutputManager`` builds its backend by name and compiles from the request's
   key alone: for this backend it builds :class:`~.backend.ThinkstructBackend` as the
   engine starts (its compile workers start then, not on the first request) and compiles
   with the whole request (:meth:`~.backend.ThinkstructBackend.grammar_for`).
   With one of thinkstruct's reasoning parsers the grammar follows the thought itself (its
   end tag, budget and bans), so the manager's own reasoning gate is turned off for it.

Each seam wraps vLLM's function and calls it unchanged for every other backend.
:func:`install` checks first that the vLLM installed is the version these seams were
written against and that each wrapped attribute is where it was; otherwise it raises
:class:`SeamMoved` naming what moved, and vLLM stops at start-up rather than run
without the backend it was asked for.
"""

from __future__ import annotations

import functools
import typing
from typing import Any

#: vLLM releases whose internals these seams were written against.
SUPPORTED_VLLM = ("0.32.",)


class SeamMoved(RuntimeError):
    """vLLM's internals are not where this plugin's seams expect them."""


def _require(condition: bool, what: str) -> None:
    if not condition:
        raise SeamMoved(
            f"thinkstruct's vLLM plugin supports vLLM {', '.join(v + 'x' for v in SUPPORTED_VLLM)}; "
            f"in the vLLM installed, {what}"
        )


def install() -> bool:
    """Install the three seams (once per process; later calls do nothing). Returns
    whether this call installed them.

    Raises:
        SeamMoved: the installed vLLM is another version, or a seam moved.
    """
    from vllm.config.structured_outputs import StructuredOutputsConfig
    from vllm.sampling_params import SamplingParams
    from vllm.v1.structured_output import StructuredOutputManager

    import vllm
    from thinkstruct.integrations.vllm.backend import BACKEND_NAME

    if getattr(StructuredOutputManager, "_thinkstruct_seam", False):
        return False
    version = str(getattr(vllm, "__version__", "?"))
    _require(version.startswith(SUPPORTED_VLLM), f"the version is {version}")
    for owner, name in (
        (SamplingParams, "_validate_structured_outputs"),
        (StructuredOutputManager, "__init__"),
        (StructuredOutputManager, "grammar_init"),
        (StructuredOutputManager, "_create_grammar"),
    ):
        _require(callable(getattr(owner, name, None)), f"{owner.__name__}.{name} is gone")
    _allow_backend_name(StructuredOutputsConfig, BACKEND_NAME)
    _wrap_validation(SamplingParams, BACKEND_NAME)
    _wrap_manager(StructuredOutputManager, BACKEND_NAME)
    StructuredOutputManager._thinkstruct_seam = True
    return True


def _allow_backend_name(config_cls: Any, name: str) -> None:
    """Seam 1: add ``name`` to the ``Literal`` of ``StructuredOutputsConfig.backend``."""
    import dataclasses

    import pydantic

    fields = (
        {f.name: f for f in dataclasses.fields(config_cls)} if dataclasses.is_dataclass(config_cls) else {}
    )
    _require("backend" in fields, "StructuredOutputsConfig is not a dataclass with a backend field")
    annotation = fields["backend"].type
    _require(
        typing.get_origin(annotation) is typing.Literal, "StructuredOutputsConfig.backend is not a Literal"
    )
    choices = typing.get_args(annotation)
    if name in choices:
        return
    widened = typing.Literal[(*choices, name)]  # type: ignore[valid-type]
    # pydantic builds a dataclass's validator from its dataclass fields' types.
    fields["backend"].type = widened
    config_cls.__annotations__["backend"] = widened
    pydantic.dataclasses.rebuild_dataclass(config_cls, force=True)


def _wrap_validation(params_cls: Any, name: str) -> None:
    """Seam 2: validate this backend's requests with thinkstruct in the API server."""
    original = params_cls._validate_structured_outputs

    @functools.wraps(original)
    def validate(self: Any, model_config: Any, structured_outputs_config: Any, tokenizer: Any) -> None:
        if (
            structured_outputs_config is None
            or self.structured_outputs is None
            or structured_outputs_config.backend != name
        ):
            original(self, model_config, structured_outputs_config, tokenizer)
            return
        from thinkstruct.integrations.vllm.frontend import validate_request

        validate_request(self, model_config, name)

    params_cls._validate_structured_outputs = validate


def _wrap_manager(manager_cls: Any, name: str) -> None:
    """Seam 3: the manager builds this backend and compiles with the whole request."""
    original_new = manager_cls.__init__
    original_init = manager_cls.grammar_init
    original_create = manager_cls._create_grammar

    def build(self: Any) -> None:
        from thinkstruct.integrations.vllm.backend import ThinkstructBackend

        self.backend = ThinkstructBackend(
            self.vllm_config,
            tokenizer=self.tokenizer,
            vocab_size=self.vllm_config.model_config.get_vocab_size(),
        )
        if self.backend.family is not None:
            # The grammar follows the thought itself (ReasoningGrammar).
            self.enable_in_reasoning = True

    @functools.wraps(original_new)
    def new(self: Any, vllm_config: Any) -> None:
        original_new(self, vllm_config)
        config = vllm_config.structured_outputs_config
        if config.backend == name and not vllm_config.model_config.skip_tokenizer_init:
            build(self)

    @functools.wraps(original_init)
    def grammar_init(self: Any, request: Any) -> None:
        params = request.sampling_params
        if (
            self.backend is None
            and request.structured_output_request is not None
            and params is not None
            and params.structured_outputs is not None
            and params.structured_outputs._backend == name
        ):
            build(self)  # after clear_backend()
        original_init(self, request)

    @functools.wraps(original_create)
    def create_grammar(self: Any, request: Any) -> Any:
        from thinkstruct.integrations.vllm.backend import ThinkstructBackend

        if isinstance(self.backend, ThinkstructBackend):
            return self.backend.grammar_for(request)
        return original_create(self, request)

    manager_cls.__init__ = new
    manager_cls.grammar_init = grammar_init
    manager_cls._create_grammar = create_grammar


__all__ = ["SUPPORTED_VLLM", "SeamMoved", "install"]
