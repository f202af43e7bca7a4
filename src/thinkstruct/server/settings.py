"""What an operator configures about the HTTP server: :class:`ServerSettings`."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from thinkstruct.engine.core.thinking_budget import DEFAULT_REASONING_SHARE, check_reasoning_share
from thinkstruct.engine.request import MAX_STOP_STRINGS
from thinkstruct.server.response_store import StoreLimits

#: Environment variable read for the API key when ``--api-key`` is not given.
API_KEY_ENV = "THINKSTRUCT_API_KEY"


@dataclass(frozen=True, kw_only=True)
class ServerSettings:
    """Limits and defaults of one server.

    The model, dtype, batch size and queue length belong to the engine
    (:class:`~thinkstruct.engine.EngineConfig`), the default grammar backend and strict
    mode to its compiler (:class:`~thinkstruct.grammar.service.compiler.CompilerConfig`); these
    are the HTTP layer's own.

    Attributes:
        host, port: where :func:`~thinkstruct.server.serve` listens.
        api_key: when set, every endpoint except the unauthenticated ones
            (:attr:`public_paths`) needs ``Authorization: Bearer <api_key>``.
        served_model_name: the model id clients pass as ``model``; ``None`` takes the
            loaded model's name. ``model_aliases`` are accepted as well.
        max_body_bytes: largest request body, in bytes (413 beyond it).
        max_prompt_tokens: longest prompt, in tokens, after the chat template; ``None``
            leaves only the model's context as the limit.
        max_n: most choices one request may ask for (``n``, times the prompts of a
            completions request).
        default_max_tokens: ``max_tokens`` when a request gives none, capped by the room
            left in the context.
        reasoning_share: the fraction of a request's ``max_tokens`` (as given, or
            ``default_max_tokens``) its thought may take, its end tag included, when it
            thinks and sets no ``max_reasoning_tokens``; the answer keeps the rest. In (0, 1).
        max_stop_sequences: most entries of ``stop`` (at most the engine's
            :data:`~thinkstruct.engine.request.MAX_STOP_STRINGS`, the default).
        retry_after_s: the least ``Retry-After`` of a 429 answered when the engine's queue
            is full, in whole seconds (the engine's own estimate is used when longer).
        public_paths: paths answered without the API key.
        responses_store: the bounds of the responses kept for ``previous_response_id``
            (entries, bytes, seconds).
    """

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    served_model_name: str | None = None
    model_aliases: tuple[str, ...] = ()
    max_body_bytes: int = 8 << 20
    max_prompt_tokens: int | None = None
    max_n: int = 16
    default_max_tokens: int = 512
    reasoning_share: float = DEFAULT_REASONING_SHARE
    max_stop_sequences: int = MAX_STOP_STRINGS
    retry_after_s: int = 1
    public_paths: frozenset[str] = field(default_factory=lambda: frozenset({"/health"}))
    responses_store: StoreLimits = field(default_factory=StoreLimits)

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_n", "default_max_tokens", "max_stop_sequences"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_stop_sequences > MAX_STOP_STRINGS:
            raise ValueError(
                f"max_stop_sequences must be at most {MAX_STOP_STRINGS} (the engine's limit), got {self.max_stop_sequences}"
            )
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens must be at least 1, got {self.max_prompt_tokens}")
        check_reasoning_share(self.reasoning_share)
        if self.retry_after_s < 0:
            raise ValueError(f"retry_after_s must not be negative, got {self.retry_after_s}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must not be empty (leave it unset for no key)")

    @staticmethod
    def api_key_from_env(explicit: str | None = None) -> str | None:
        """``explicit`` if given, else ``$THINKSTRUCT_API_KEY`` (empty counts as unset)."""
        if explicit:
            return explicit
        return os.environ.get(API_KEY_ENV) or None
