"""Command line: ``thinkstruct check`` lints a schema against every backend."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Sequence

from thinkstruct.errors import InvalidConstraint


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="thinkstruct", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser(
        "check",
        help="compile a JSON schema with each backend and test answer files against it",
        description=(
            "For each backend: whether SCHEMA_FILE compiles and how long it took; then, for "
            "each TEXT_FILE, whether it is accepted as a complete answer or the character "
            "offset where it is rejected. Exit status 0 if every backend asked for compiles "
            "and every text is accepted, 1 otherwise, 2 for a usage error."
        ),
    )
    check.add_argument("schema_file", type=Path)
    check.add_argument("text_files", type=Path, nargs="*")
    check.add_argument(
        "--backend", default="all", help="xgrammar, llguidance, outlines or all (default: all)"
    )
    check.add_argument("--tokenizer", type=Path, help="tokenizer directory or .gguf (default: DeepSeek-V4)")
    check.add_argument(
        "--max-whitespace", type=int, default=None,
        help="longest whitespace run allowed between JSON tokens (default 2)",
    )
    args = parser.parse_args(argv)
    return _check(args)


def _check(args: argparse.Namespace) -> int:
    from thinkstruct.grammar.api import first_rejected, get_backend
    from thinkstruct.grammar.backends import BACKEND_NAMES
    from thinkstruct.grammar.base import InvalidGrammar
    from thinkstruct.grammar.constraint import Constraint
    from thinkstruct.grammar.json_format import JsonFormat
    from thinkstruct.tokenizer import Tokenizer

    names = list(BACKEND_NAMES) if args.backend == "all" else [args.backend]
    for name in names:
        if name not in BACKEND_NAMES:
            print(f"error: unknown backend {name!r}; choose from {', '.join(BACKEND_NAMES)} or all", file=sys.stderr)
            return 2
    try:
        schema_text = args.schema_file.read_text(encoding="utf-8")
        texts = [(p, p.read_text(encoding="utf-8")) for p in args.text_files]
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        constraint = Constraint.json_schema(schema_text)
    except InvalidConstraint as e:
        print(f"{args.schema_file}: invalid: {e}")
        return 1
    tokenizer = Tokenizer.from_pretrained(args.tokenizer) if args.tokenizer else Tokenizer.default()
    fmt = JsonFormat(args.max_whitespace) if args.max_whitespace is not None else JsonFormat()
    ok = True
    for name in names:
        backend = get_backend(tokenizer, name, json_format=fmt)
        start = time.perf_counter()
        result = backend.compile(constraint)
        elapsed_ms = (time.perf_counter() - start) * 1000
        if isinstance(result, InvalidGrammar):
            ok = False
            print(f"{name}: does not compile ({elapsed_ms:.1f} ms): {result.error}")
            continue
        print(f"{name}: compiles in {elapsed_ms:.1f} ms")
        for path, text in texts:
            offset = first_rejected(result, text)
            if offset is None:
                print(f"  {path}: accepted")
            else:
                ok = False
                print(f"  {path}: rejected at character {offset}: {_context(text, offset)}")
    return 0 if ok else 1


def _context(text: str, offset: int) -> str:
    if offset >= len(text):
        return "the answer ends before it is complete"
    before = text[max(0, offset - 20):offset]
    after = text[offset:offset + 20]
    return json.dumps(before + "⟨here⟩" + after, ensure_ascii=False)


if __name__ == "__main__":
    sys.exit(main())
