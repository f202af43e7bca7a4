"""The compile worker process: ``python -m thinkstruct.grammar.service.worker_process``.

Started by :class:`~thinkstruct.grammar.service.workers.WorkerPool`; reads the tokenizer,
the JSON format and the one backend it serves, builds that backend's vocabulary view
(only that one), says it is ready, then compiles requests until stdin closes. Kept apart
from ``compile_workers`` so that running it does not re-run a module the package has
already imported.
"""

from __future__ import annotations

import os
import pickle
import sys
import time
from typing import IO, TYPE_CHECKING, Any

from thinkstruct.errors import InvalidConstraint
from thinkstruct.grammar.service.workers import read_message, write_message

if TYPE_CHECKING:
    from thinkstruct.grammar.base import GrammarBackend
    from thinkstruct.grammar.compiled import CompileResult


def serve(stdin: IO[bytes], stdout: IO[bytes]) -> None:
    """The worker's loop: compile requests until stdin closes."""
    from thinkstruct.grammar.backends import create_backend
    from thinkstruct.grammar.compiled import InvalidGrammar

    tokenizer, json_format, backend_name = pickle.loads(read_message(stdin))
    backends: dict[bool, GrammarBackend] = {
        False: create_backend(backend_name, tokenizer, json_format=json_format)
    }
    write_message(stdout, pickle.dumps("ready"))
    while True:
        try:
            lenient, constraint = pickle.loads(read_message(stdin))
        except EOFError:
            return
        start = time.perf_counter()
        try:
            backend = backends.get(lenient)
            if backend is None:
                backend = backends[lenient] = create_backend(
                    backend_name, tokenizer, json_format=json_format, lenient=lenient
                )
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
                    f"{backend_name} failed: {e}", backend=backend_name, kind=constraint.kind.value
                ),
                time.perf_counter() - start,
            )
        write_message(stdout, pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL))


if __name__ == "__main__":
    # Keep the protocol stream clean: anything the libraries print goes to stderr, which
    # the parent forwards to its logger.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(sys.stdin.buffer, out)
