"""The compile worker: ``python -m thinkstruct.grammar.service.worker_process``.

A worker reads the tokenizer, the JSON format and the one backend it serves, builds that
backend's vocabulary view (only that one), says it is ready, then compiles requests until
stdin closes. Most workers are forked, already built, from a
:mod:`~thinkstruct.grammar.service.zygote`; started as a module it reads its setup from
stdin first (the zygote's fallback). Kept apart from ``workers`` so that running it does
not re-run a module the package has already imported.
"""

from __future__ import annotations

import os
import pickle
import sys
import time
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

from thinkstruct.errors import InvalidConstraint
from thinkstruct.grammar.constraint import Constraint
from thinkstruct.grammar.service.messages import read_message, write_message

if TYPE_CHECKING:
    from thinkstruct.grammar.base import GrammarBackend
    from thinkstruct.grammar.compiled import CompileResult
    from thinkstruct.grammar.json_format import JsonFormat
    from thinkstruct.tokenizer import Tokenizer


@dataclass
class Setup:
    """What a worker compiles with: one backend's view of one tokenizer, by leniency."""

    tokenizer: Tokenizer
    json_format: JsonFormat
    backend_name: str
    backends: dict[bool, GrammarBackend] = field(default_factory=dict)

    def backend(self, lenient: bool) -> GrammarBackend:
        """The backend for strict (``False``) or lenient compiles, built on first use."""
        from thinkstruct.grammar.backends import create_backend

        built = self.backends.get(lenient)
        if built is None:
            built = self.backends[lenient] = create_backend(
                self.backend_name, self.tokenizer, json_format=self.json_format, lenient=lenient
            )
        return built

    def warm(self) -> None:
        """Fill what the first compile would build lazily (the tokenizer's encoder, the
        backend's vocabulary tables: about 1.5 s for the 129k tokenizer), so that every
        worker forked from here has them. Starts no thread (each backend's compile joins
        its own), so forking after it is safe."""
        self.backend(False).compile(_WARM_UP, checked=True)


#: What :meth:`Setup.warm` compiles.
_WARM_UP = Constraint.json_schema({"type": "integer"})


def build(setup: bytes) -> Setup:
    """A worker's setup from the pool's message (pickled tokenizer, JSON format, backend
    name), its strict backend built."""
    tokenizer, json_format, backend_name = pickle.loads(setup)
    built = Setup(tokenizer, json_format, backend_name)
    built.backend(False)
    return built


def serve(stdin: IO[bytes], stdout: IO[bytes], setup: Setup) -> None:
    """The worker's loop: say it is ready, then compile requests until stdin closes."""
    from thinkstruct.grammar.compiled import InvalidGrammar

    write_message(stdout, pickle.dumps("ready"))
    while True:
        try:
            lenient, constraint = pickle.loads(read_message(stdin))
        except EOFError:
            return
        start = time.perf_counter()
        try:
            backend = setup.backend(lenient)
            result: CompileResult = backend.compile(constraint, checked=True)
            if isinstance(result, InvalidGrammar):
                reply: tuple[str, Any, float] = ("invalid", result.error, time.perf_counter() - start)
            else:
                row = result.start_row
                kept = b"" if row is None else row.numpy().tobytes()
                reply = ("ok", (backend.export(result), kept), time.perf_counter() - start)
        except Exception as e:  # noqa: BLE001 - one bad request must not take the worker down
            reply = (
                "invalid",
                InvalidConstraint(
                    f"{setup.backend_name} failed: {e}",
                    backend=setup.backend_name,
                    kind=constraint.kind.value,
                ),
                time.perf_counter() - start,
            )
        write_message(stdout, pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL))


if __name__ == "__main__":
    # Keep the protocol stream clean: anything the libraries print goes to stderr, which
    # the parent forwards to its logger.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(sys.stdin.buffer, out, build(read_message(sys.stdin.buffer)))
