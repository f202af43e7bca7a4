"""Waiting for a condition with a deadline: how a test waits for something another
thread, process or server does (never a fixed sleep).

The deadline is a hang check, not a performance assertion: it fails the test naming what
never happened, however long the machine took.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

#: Seconds after which a wait fails as a hang: far above anything a loaded 2-core machine
#: takes for the conditions the tests wait on.
HANG_S = 120.0


def wait_until(condition: Callable[[], object], what: str, *, timeout_s: float = HANG_S) -> None:
    """Poll ``condition`` (every 10 ms) until it is true; fail naming ``what`` after
    ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g} s"
        time.sleep(0.01)


async def wait_until_async(condition: Callable[[], object], what: str, *, timeout_s: float = HANG_S) -> None:
    """:func:`wait_until` on an event loop: the loop runs other tasks between polls."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g} s"
        await asyncio.sleep(0.01)
