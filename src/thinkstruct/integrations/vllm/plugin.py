"""The entry point vLLM calls in each of its processes: :func:`register`.

Declared in thinkstruct's ``pyproject.toml`` under ``vllm.general_plugins``, so installing
thinkstruct next to vLLM is all it takes (``VLLM_PLUGINS`` can leave it out, as any
plugin). vLLM may call it several times per process; only the first call does anything.
"""

from __future__ import annotations

import logging
import threading

_lock = threading.Lock()
_registered = False


def register() -> None:
    """Register thinkstruct's reasoning families as vLLM reasoning parsers and install the
    ``thinkstruct`` structured-output backend (:mod:`.seam`); idempotent.

    Raises:
        SeamMoved: the installed vLLM is not one the backend supports.
    """
    global _registered
    with _lock:
        if _registered:
            return
        from vllm.logger import init_logger

        from thinkstruct.integrations.vllm.reasoning import register_families
        from thinkstruct.integrations.vllm.seam import install

        logger = init_logger(__name__)
        _log_through(logger)
        names = register_families()
        install()
        _registered = True
        logger.debug("thinkstruct: reasoning parsers %s; structured-output backend 'thinkstruct'", names)


def _log_through(vllm_logger: logging.Logger) -> None:
    """Send thinkstruct's own log records (the compile service's) to vLLM's handlers."""
    root = vllm_logger
    while root.parent is not None and root.name != "vllm":
        root = root.parent
    ours = logging.getLogger("thinkstruct")
    if ours.handlers:
        return
    for handler in root.handlers:
        ours.addHandler(handler)
    ours.setLevel(root.level or logging.INFO)
    ours.propagate = False


__all__ = ["register"]
