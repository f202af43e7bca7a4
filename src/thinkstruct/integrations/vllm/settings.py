"""The plugin's own options: :class:`PluginSettings`, read from the environment.

vLLM's flags configure everything vLLM knows about (which structured-output backend, the
reasoning parser, the chat template); these variables carry only what is thinkstruct's:

==========================================  ==========  =======================================
variable                                    default     meaning
==========================================  ==========  =======================================
``THINKSTRUCT_VLLM_STRICT``                 ``1``       strict mode: every JSON Schema keyword
                                                        enforced, or the request is a 400
                                                        naming its pointer; ``0``: keywords no
                                                        grammar enforces are ignored (named in
                                                        the log)
``THINKSTRUCT_VLLM_COMPILE_TIMEOUT_S``      ``30``      seconds one compile may take in all
``THINKSTRUCT_VLLM_CACHE_BYTES``            ``1 GiB``   bytes of compiled grammars kept per
                                                        process
``THINKSTRUCT_VLLM_FRONTEND_WAIT_S``        ``1``       seconds vLLM's request validation
                                                        (which runs on the API server's event
                                                        loop) waits for a compile the
                                                        pre-compile middleware has not
                                                        finished; past it the engine compiles
``THINKSTRUCT_VLLM_REASONING_SHARE``        ``0.5``     a thought's default budget, as a share
                                                        of the request's ``max_tokens`` (a
                                                        request's ``thinking_token_budget``
                                                        wins)
==========================================  ==========  =======================================

A variable that does not parse stops vLLM at start-up with a message naming it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from thinkstruct.grammar.json_format import JsonFormat
from thinkstruct.grammar.service.config import CompilerConfig

ENV_PREFIX = "THINKSTRUCT_VLLM_"


@dataclass(frozen=True, kw_only=True)
class PluginSettings:
    """What the plugin reads from the environment (see the module docstring).

    Attributes:
        strict: strict mode.
        compile_timeout_s: a compile's deadline, in seconds.
        cache_bytes: bytes of compiled grammars kept per process.
        frontend_wait_s: seconds request validation waits for a compile.
        reasoning_share: a thought's default budget as a share of ``max_tokens``.
    """

    strict: bool = True
    compile_timeout_s: float = 30.0
    cache_bytes: int = 1 << 30
    frontend_wait_s: float = 1.0
    reasoning_share: float = 0.5

    def __post_init__(self) -> None:
        if not self.compile_timeout_s > 0 or self.frontend_wait_s < 0 or self.cache_bytes < 1:
            raise ValueError(
                f"{ENV_PREFIX}COMPILE_TIMEOUT_S and {ENV_PREFIX}CACHE_BYTES must be positive, "
                f"{ENV_PREFIX}FRONTEND_WAIT_S not negative"
            )
        if not 0 < self.reasoning_share <= 1:
            raise ValueError(f"{ENV_PREFIX}REASONING_SHARE must be in (0, 1]")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> PluginSettings:
        """Read the ``THINKSTRUCT_VLLM_*`` variables (unset ones keep their defaults).

        Raises:
            ValueError: a variable that does not parse, named.
        """
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for name, parse in (
            ("strict", _flag),
            ("compile_timeout_s", float),
            ("cache_bytes", int),
            ("frontend_wait_s", float),
            ("reasoning_share", float),
        ):
            raw = env.get(ENV_PREFIX + name.upper())
            if raw is None or raw == "":
                continue
            try:
                values[name] = parse(raw)
            except ValueError:
                raise ValueError(f"{ENV_PREFIX}{name.upper()}={raw!r} does not parse") from None
        return cls(**values)  # type: ignore[arg-type]

    def compiler_config(self) -> CompilerConfig:
        """The compile service's configuration: compact JSON (llguidance 1.7, vLLM's pin,
        repeats a whitespace pattern without bound, so compact is the one format every
        backend holds exactly there), this process's deadline and cache, one worker per
        backend."""
        return CompilerConfig(
            strict=self.strict,
            json_format=JsonFormat(max_whitespace=0),
            cache_bytes=self.cache_bytes,
            timeout_s=self.compile_timeout_s,
        )


def _flag(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)


__all__ = ["ENV_PREFIX", "PluginSettings"]
