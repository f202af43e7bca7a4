"""`thinkstruct serve --replicas N` as a real process for the cluster tests.

The service starts its own local Ray instance (raylet, GCS, Serve's controller and proxy,
the replicas: all its descendants); :meth:`RayService.stop` sends SIGTERM, waits for the
exit, and ends any descendant still alive, so no Ray process outlives a test module.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Self

import httpx
import openai
import psutil

#: Seconds a local Ray instance with the tiny model's replicas may take to come up on a
#: loaded 2-core machine (`make test` may start two such services at once: up to ~190 s
#: seen with other work on the machine).
START_S = 300.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RayService:
    """``thinkstruct serve`` with the given options, on a free port."""

    def __init__(self, model_dir: Path, *options: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # Ray's own OOM killer watches the whole machine's memory, which the other test
        # workers share; a replica it killed would fail a test for a reason not its own.
        env = {
            **os.environ,
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_memory_monitor_refresh_ms": "0",
            "OMP_NUM_THREADS": "1",
        }
        command = [str(Path(sys.executable).parent / "thinkstruct"), "serve", "--model", str(model_dir)]
        self.process = subprocess.Popen(
            [*command, "--port", str(self.port), "--log-level", "warning", *options],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.log: list[str] = []
        self._listening = threading.Event()
        threading.Thread(target=self._read_log, daemon=True).start()

    def _read_log(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.log.append(line)
            if "thinkstruct: listening on" in line:
                self._listening.set()

    def __enter__(self) -> Self:
        deadline = time.monotonic() + START_S
        while not self._listening.wait(timeout=0.5):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the service did not start:\n" + "".join(self.log[-40:]))
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def engine_replicas(self) -> list[psutil.Process]:
        """The engine replicas' processes (Ray titles them ``ray::ServeReplica:<app>:engine``)."""
        found = []
        for p in self.descendants():
            try:
                if "ServeReplica:thinkstruct:engine" in " ".join(p.cmdline()):
                    found.append(p)
            except psutil.NoSuchProcess:
                pass
        return found

    def stop(self, *, timeout_s: float = 60.0) -> int | None:
        """SIGTERM, wait for the exit; the exit status (``None``: it had to be killed)."""
        family = self.descendants()
        status: int | None = None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            status = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        _gone, alive = psutil.wait_procs(family, timeout=10)
        for p in alive:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        return status

    def openai(self, *, timeout: float = 120.0) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="none", max_retries=0, timeout=timeout)

    def http(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=120.0, **kwargs)


def metric_values(text: str, name: str) -> dict[str, float]:
    """``name``'s samples in a /metrics body, by their ``replica`` label ("" without one)."""
    values = {}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            labels, _, value = line.rpartition(" ")
            replica = labels.split('replica="')[1].split('"')[0] if 'replica="' in labels else ""
            values[replica] = float(value)
    return values
