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


#: A character no byte-level spelling uses and Latin-1 cannot encode.
_NOT_A_BYTE = "\uffff"


@functools.cache
def byte_level_translation() -> dict[int, str]:
    """A :meth:`str.translate` table that turns a byte-level spelling into Latin-1 text
    whose encoding is the bytes it spells: each of the 256 spelling characters becomes
    its byte's character, and every other character up to U+00FF becomes one that Latin-1
    cannot encode, so ``token.translate(table).encode("latin-1")`` fails on any token that
    is not a byte-level spelling (characters above U+00FF fail as they are)."""
    table = {ord(char): chr(byte) for char, byte in char_to_byte().items()}
    for code in range(256):
        table.setdefault(code, _NOT_A_BYTE)
    return table
