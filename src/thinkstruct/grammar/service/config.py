"""How a :class:`~thinkstruct.grammar.service.compiler.GrammarCompiler` compiles: :class:`CompilerConfig`.

Every limit of the compile service is a field here (none is a hidden constant), so the
server can build one from its command line. The limits and why they have these values:

- ``timeout_s`` 30 s: xgrammar's slowest MaskBench compiles take 10-20 s on 2 cores; a
  request never waits longer than this in all (queue, worker start, fallbacks).
- ``inline_compile_bytes`` 64 KiB: llguidance compiles in a thread (about 1 ms at the
  median) only up to this size; its compile time grows with the grammar text, about
  quadratically for long alternations (30,000 options: 1.2 s; 300,000: over a minute),
  and a thread cannot be stopped, so larger constraints compile in a killable worker.
  The largest MaskBench schema below 64 KiB compiles in 25 ms; 11 of its 791 schemas
  are larger.
- ``max_constraint_bytes`` 4 MiB: a constraint's text is parsed and walked in this
  process before any backend sees it (4 MiB of JSON parses in about 50 ms).
- ``max_answer_tokens`` 2**20: a schema whose shortest valid instance provably needs more
  tokens than this is refused up front (``minItems: 1000000000``); set it to the model's
  context length.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from thinkstruct.grammar.backends import BACKEND_NAMES
from thinkstruct.grammar.json_format import JsonFormat


@dataclass(frozen=True, kw_only=True)
class CompilerConfig:
    """How a :class:`~thinkstruct.grammar.service.compiler.GrammarCompiler` compiles.

    Args:
        backend: ``"auto"`` (per constraint, see :mod:`thinkstruct.grammar.service.auto`) or one of
            ``xgrammar``, ``llguidance``, ``outlines``; a call may ask for another.
        strict: with ``auto``, enforce every keyword: where no backend's grammar can,
            fall back to one whose grammar skips them and check them as each value
            closes (the result's ``checks``); without it, such a fallback ignores them
            (named on the result's ``ignored_keywords``).
        json_format: the JSON text format every backend is configured to.
        cache_entries: most compiled grammars kept.
        cache_bytes: most bytes of compiled grammars kept, as measured per backend (each
            grammar's ``memory_bytes``).
        timeout_s: seconds one compile may take in all, from the call: waiting in a queue
            or for a worker to start, fallbacks and checks included.
        failure_ttl_s: seconds an invalid or timed-out constraint is answered from memory
            before it may be tried again (never for internal errors or queue waits).
        threads: in-process compile work (thinkstruct's checks, small llguidance compiles,
            loading what a worker compiled) that may run at once. Worker compiles never
            hold one of these threads.
        worker_processes: compile processes per backend that compiles out of process;
            0 compiles everything in threads instead (faster to start, but a compile past
            its time limit then runs on).
        inline_compile_bytes: constraints up to this size compile in a thread when their
            backend allows it; larger ones in a killable worker (see the module docstring).
        max_constraint_bytes: larger constraints are refused before any work.
        max_answer_tokens: schemas whose shortest valid instance needs more tokens are
            refused (the model's context length).
    """

    backend: str = "auto"
    strict: bool = False
    json_format: JsonFormat = field(default_factory=JsonFormat)
    cache_entries: int = 1024
    cache_bytes: int = 2 << 30
    timeout_s: float = 30.0
    failure_ttl_s: float = 30.0
    threads: int = 4
    worker_processes: int = 1
    inline_compile_bytes: int = 64 << 10
    max_constraint_bytes: int = 4 << 20
    max_answer_tokens: int = 1 << 20

    def __post_init__(self) -> None:
        check_backend_name(self.backend)
        if self.cache_entries < 1 or self.cache_bytes < 1:
            raise ValueError("cache_entries and cache_bytes must be positive")
        if not self.timeout_s > 0:
            raise ValueError("timeout_s must be positive")
        if self.failure_ttl_s < 0:
            raise ValueError("failure_ttl_s must not be negative")
        if self.threads < 1 or self.worker_processes < 0:
            raise ValueError("threads must be positive and worker_processes not negative")
        if self.inline_compile_bytes < 0 or self.max_constraint_bytes < 1 or self.max_answer_tokens < 1:
            raise ValueError(
                "inline_compile_bytes, max_constraint_bytes and max_answer_tokens must be positive"
            )


def check_backend_name(name: str) -> None:
    """Raise ``ValueError`` listing the known names unless ``name`` is ``auto`` or a backend."""
    if name != "auto" and name not in BACKEND_NAMES:
        raise ValueError(f"unknown backend {name!r}; known backends: auto, {', '.join(BACKEND_NAMES)}")
