"""Literal text inside a regex, for the backends whose regex engines are Rust's (llguidance,
outlines-core): :func:`escape_regex`."""

from __future__ import annotations

_REGEX_META = set("\\.+*?()|[]{}^$#&-~/")


def escape_regex(text: str) -> str:
    """``text`` as a regex matching exactly it: metacharacters escaped, characters that are
    not printable (NUL, control characters) written as ``\\x{..}``."""
    out = []
    for ch in text:
        if ch in _REGEX_META:
            out.append("\\" + ch)
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(f"\\x{{{ord(ch):x}}}")
    return "".join(out)


def alternation(options: list[str]) -> str:
    """One regex matching exactly one of ``options``."""
    return "(" + "|".join(escape_regex(o) for o in options) + ")"
