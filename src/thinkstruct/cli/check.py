"""``thinkstruct check``: a JSON schema compiled with each backend (and ``auto`` as a strict
server compiles it), and answer files tested against it."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from thinkstruct.errors import InvalidConstraint, ThinkstructError
from thinkstruct.grammar.api import default_compiler, first_rejected, get_backend
from thinkstruct.grammar.backends import BACKEND_NAMES
from thinkstruct.grammar.base import InvalidGrammar
from thinkstruct.grammar.constraint import Constraint
from thinkstruct.grammar.json_format import JsonFormat
from thinkstruct.grammar.runtime.tag_checks import first_failed_check
from thinkstruct.tokenizer import Tokenizer


def check(args: argparse.Namespace) -> int:
    """``thinkstruct check``: the exit status (0 when every backend asked for compiles and
    every text is accepted, 1 otherwise, 2 for a usage error)."""
    names = [*BACKEND_NAMES, "auto"] if args.backend == "all" else [args.backend]
    for name in names:
        if name not in (*BACKEND_NAMES, "auto"):
            print(
                f"error: unknown backend {name!r}; choose from {', '.join(BACKEND_NAMES)}, auto or all",
                file=sys.stderr,
            )
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
        if name == "auto":
            ok = _check_auto(constraint, texts, tokenizer, fmt) and ok
            continue
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


def _check_auto(constraint: Any, texts: list[tuple[Path, str]], tokenizer: Any, fmt: Any) -> bool:
    """``auto`` as a strict server compiles: the backend, what is checked, the texts."""
    start = time.perf_counter()
    try:
        compiled = default_compiler(tokenizer, json_format=fmt).compile(
            constraint, backend="auto", strict=True
        )
    except ThinkstructError as e:
        print(f"auto (strict): does not compile ({(time.perf_counter() - start) * 1000:.1f} ms): {e}")
        return False
    print(f"auto (strict): compiles with {compiled.backend} in {(time.perf_counter() - start) * 1000:.1f} ms")
    for kept in compiled.enforcement():
        if kept.enforcement == "checked":
            print(f"  checked as values close: {kept.keyword} at {kept.pointer} on {kept.location or '/'}")
    ok = True
    for path, text in texts:
        offset = first_rejected(compiled, text)
        failure = (
            None
            if offset is not None or compiled.checks is None
            else first_failed_check(compiled.checks, text)
        )
        if offset is not None:
            print(f"  {path}: rejected at character {offset}: {_context(text, offset)}")
        elif failure is not None:
            print(f"  {path}: fails a check at character {failure.start}: {failure.describe()}")
        else:
            print(f"  {path}: accepted")
        ok = ok and offset is None and failure is None
    return ok


def _context(text: str, offset: int) -> str:
    if offset >= len(text):
        return "the answer ends before it is complete"
    before = text[max(0, offset - 20) : offset]
    after = text[offset : offset + 20]
    return json.dumps(before + "⟨here⟩" + after, ensure_ascii=False)
