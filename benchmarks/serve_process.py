"""A real ``thinkstruct serve`` as its own process on a free loopback port, for the
benchmarks that measure over HTTP."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_serve(
    port: int, *args: str, pythonpath: str | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``thinkstruct serve --port PORT ARGS`` with sleeping OpenMP threads (as ``make serve``);
    ``pythonpath``: another source tree's ``src`` to serve instead of this one; ``env``:
    variables added to this process's environment."""
    exe = os.path.join(os.path.dirname(sys.executable), "thinkstruct")
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", **(env or {}))
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    return subprocess.Popen(
        [exe, "serve", "--port", str(port), *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 600.0) -> None:
    """Until ``/health`` answers 200; raises if the process exits or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError("the server did not become healthy")
