"""Command line.

- ``thinkstruct check`` lints a schema against every backend.
- ``thinkstruct serve`` runs the OpenAI-compatible server (foreground; Ctrl-C stops it).
- ``thinkstruct generate`` answers one prompt through the engine, no HTTP: the reasoning
  on stderr as it is written, the answer (validated against ``--schema``) on stdout.
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Sequence

from thinkstruct.cli.check import check
from thinkstruct.cli.generate import generate
from thinkstruct.cli.parsing import build_parser
from thinkstruct.cli.serve import serve


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv`` (default: the process's arguments) asks for; its exit status."""
    args = build_parser(__doc__ or "").parse_args(argv)
    command = {"serve": serve, "generate": generate, "check": check}[args.command]
    return command(args)


def run() -> None:
    """The ``thinkstruct`` command: :func:`main`, then exit with its status.

    The exit skips the interpreter's teardown, and only that: exit handlers run and the
    output is flushed as ``sys.exit`` would (every command has closed its engine, compile
    workers and sockets by then). The teardown has nothing left to release and prints,
    after every Ctrl-C of ``serve``, dozens of lines of nanobind's leak report for
    triton's bindings (torch imports triton where it is installed; xgrammar depends on it).
    """
    code = main()
    atexit._run_exitfuncs()  # logging.shutdown among them
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
