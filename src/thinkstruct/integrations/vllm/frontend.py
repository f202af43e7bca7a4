"""Request validation in vLLM's API server: :func:`validate_request`.

vLLM validates each request's structured-output fields before it reaches the engine, and
a ``VLLMValidationError`` raised there is the client's HTTP 400. For the thinkstruct
backend that validation is thinkstruct's compile: the constraint is built, compiled in this
process's :class:`~.service.PluginCompiler` (the engine compiles it again in its own
process; compiles are cached in each) and refused with thinkstruct's message, which names
the offending part (a JSON pointer, a regex position), before anything is generated.

vLLM calls this on the API server's event loop, so it waits for the compile at most
``THINKSTRUCT_VLLM_FRONTEND_WAIT_S``; a compile still running then goes on, and the
engine's compile (within the deadline) decides. The pre-compile middleware
(:mod:`.middleware`) compiles the common fields off the event loop first, so those are
answered from the cache here.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any

from vllm.exceptions import VLLMValidationError
from vllm.logger import init_logger
from vllm.v1.structured_output.request import get_structured_output_key

from thinkstruct.errors import InvalidConstraint
from thinkstruct.integrations.vllm.service import PluginCompiler, constraint_of, plugin_compiler

logger = init_logger(__name__)


def service_for(model_config: Any) -> PluginCompiler:
    """This process's compile service for the served model."""
    return plugin_compiler(str(model_config.tokenizer), model_config.get_vocab_size())


def validate_request(params: Any, model_config: Any, backend: str) -> None:
    """Validate a request's ``structured_outputs`` with thinkstruct and mark it for the
    thinkstruct backend.

    Raises:
        VLLMValidationError: the constraint is refused (HTTP 400), naming the part at fault.
    """
    outputs = params.structured_outputs
    if outputs._backend not in (None, backend):
        raise VLLMValidationError(
            f"this server's structured-output backend is {backend}, not {outputs._backend}",
            parameter="structured_outputs",
        )
    outputs._backend = backend
    service = service_for(model_config)
    try:
        kind, spec = get_structured_output_key(outputs)
        constraint = constraint_of(kind.name, spec)
        future = service.submit(constraint)
        future.result(timeout=service.settings.frontend_wait_s)
    except concurrent.futures.TimeoutError:
        logger.info("thinkstruct: a %s compile runs on past request validation", constraint.kind.value)
    except InvalidConstraint as error:
        raise VLLMValidationError(str(error), parameter=_parameter(kind.name)) from None
    except ValueError as error:  # vLLM's own key builder: a malformed field
        raise VLLMValidationError(str(error), parameter="structured_outputs") from None


def _parameter(kind: str) -> str:
    """The request field a constraint of ``kind`` came from, as vLLM names it."""
    return {"JSON": "response_format", "JSON_OBJECT": "response_format"}.get(
        kind, f"structured_outputs.{kind.lower()}"
    )


__all__ = ["service_for", "validate_request"]
