"""GPT-2's byte-level spelling: the printable character each of the 256 bytes is written
as in a byte-level BPE vocabulary (GPT-2, Llama 3, Qwen, DeepSeek), and back."""

from __future__ import annotations

import functools


@functools.cache
def byte_to_char() -> dict[int, str]:
    """Each byte's character: printable Latin-1 bytes stand for themselves, the other 68
    bytes take the characters from U+0100 on, in byte order."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("\xa1"), ord("\xac") + 1),
        *range(ord("\xae"), 256),
    ]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


@functools.cache
def char_to_byte() -> dict[str, int]:
    """The inverse of :func:`byte_to_char`: a vocabulary's character back to its byte."""
    return {char: byte for byte, char in byte_to_char().items()}
