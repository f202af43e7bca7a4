"""Length-prefixed pickles over pipes, between a pool, its zygote and its workers; and
the forwarding of what a worker's libraries print."""

from __future__ import annotations

import logging
import struct
from typing import IO

logger = logging.getLogger("thinkstruct.grammar")

_HEADER = struct.Struct("<Q")


def write_message(stream: IO[bytes], payload: bytes) -> None:
    """``payload`` after its length (8 bytes, little-endian), flushed."""
    stream.write(_HEADER.pack(len(payload)))
    stream.write(payload)
    stream.flush()


def read_message(stream: IO[bytes]) -> bytes:
    """The next payload; EOFError where the stream ends first."""
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError
    (size,) = _HEADER.unpack(header)
    payload = stream.read(size)
    if len(payload) < size:
        raise EOFError
    return payload


def forward_stderr(stream: IO[bytes], backend: str) -> None:
    """Each line of ``stream`` (a worker's stderr) as a warning of the
    ``thinkstruct.grammar`` logger, until it ends. xgrammar writes C++ warnings ("oneOf
    with overlapping ...") straight to fd 2."""
    with stream:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip()
            if line:
                logger.warning("%s compile worker: %s", backend, line)
