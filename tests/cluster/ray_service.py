"""`thinkstruct serve --replicas N` as a real process for the cluster tests.

:class:`RayCluster` is one local Ray cluster (``ray start --head --block``: GCS, raylet
and the workers, all its descendants) for the whole test session; each
:class:`RayService` joins it (``--ray-address``), deploys its Serve application there
(Serve's controller and proxy, the replicas) and removes it when it stops, so Ray's
own processes start once a session, not once a service. :meth:`RayService.stop` sends
SIGTERM and waits for the exit;
:meth:`RayCluster.stop` ends the cluster and any descendant still alive, so no Ray
process outlives the session.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Self

import httpx
import openai
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from alone import free_port  # a port below the ephemeral range (see its doc)

#: Seconds a local Ray instance with the tiny model's replicas may take to come up on a
#: loaded 2-core machine (`make test` may start two such services at once: up to ~190 s
#: seen with other work on the machine).
START_S = 300.0


#: The tiny model's end-of-sequence token, kept out of answers that must run to max_tokens.
NO_EOS = {"1": -100}
#: Ray's own OOM killer watches the whole machine's memory, which the other test workers
#: share; a replica it killed would fail a test for a reason not its own. One torch
#: thread per process: two cores. No token authentication: ``ray start`` turns it on
#: when ~/.ray/auth_token exists, and a driver given an address does not (it then
#: cannot connect). No idle workers started ahead (the raylet starts one per CPU when
#: the first driver connects; the services' actors carry their own environment, so
#: none of those would ever serve) and no Ray metrics (the tests read thinkstruct's
#: /metrics, which comes from the replicas, not from Ray's): CPU the replicas need.
RAY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_memory_monitor_refresh_ms": "0",
    "OMP_NUM_THREADS": "1",
    "RAY_AUTH_MODE": "disabled",
    "RAY_enable_worker_prestart": "0",
    "RAY_prestart_worker_first_driver": "0",
    "RAY_enable_metrics_collection": "0",
}
#: The options of every test service: grammars compile in threads, so no replica starts
#: compile processes (no test here sends a constraint that compiles; a constraint that
#: does not compile is answered by the ingress, the same as a single process's).
SERVICE_OPTIONS = ("--compile-workers", "0")
#: Ray Serve's processes of a service, by the titles Ray gives them (``ray::ServeReplica:
#: <app>:<deployment>``, ``ray::ServeController``, ``ray::ProxyActor``).
SERVE_TITLES = ("ServeReplica:thinkstruct:", "ServeController", "ProxyActor")


def _end(family: list[psutil.Process]) -> None:
    """Kill whatever of ``family`` is still alive 10 s on."""
    _gone, alive = psutil.wait_procs(family, timeout=10)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _titled(processes: list[psutil.Process], *titles: str) -> list[psutil.Process]:
    found = []
    for p in processes:
        try:
            if any(title in " ".join(p.cmdline()) for title in titles):
                found.append(p)
        except psutil.NoSuchProcess:
            pass
    return found


class _Child:
    """A child process (``what``) whose output lines (stdout and stderr) are kept; as a
    context manager it waits for the first line containing ``ready`` and stops on exit."""

    def __init__(self, command: list[str], env: dict[str, str], *, ready: str, what: str) -> None:
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        self.log: list[str] = []
        self._what = what
        self._ready_line = ready
        self._ready = threading.Event()
        threading.Thread(target=self._read_log, daemon=True).start()

    def _read_log(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.log.append(line)
            if self._ready_line in line:
                self._ready.set()

    def __enter__(self) -> Self:
        deadline = time.monotonic() + START_S
        while not self._ready.wait(timeout=0.5):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self._what} did not start:\n" + "".join(self.log[-40:]))
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def family(self) -> list[psutil.Process]:
        """The processes it started: ended with it."""
        return _descendants(self.process.pid)

    def stop(self, *, timeout_s: float = 60.0) -> int | None:
        """SIGTERM, wait for the exit; the exit status (``None``: it had to be killed).
        Any of :meth:`family` still alive 10 s on is killed."""
        family = self.family()
        status: int | None = None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            status = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        _end(family)
        return status


class RayCluster(_Child):
    """A local Ray head node on a free port, for the services to join (``ray start
    --block`` stops what it started on SIGTERM)."""

    def __init__(self) -> None:
        self.address = f"127.0.0.1:{free_port()}"
        port = self.address.split(":")[1]
        # Its sessions and its address file apart from /tmp/ray, where ``ray.init()`` with
        # no address would look for a cluster to join (a short path: Ray's sockets live
        # there).
        self.temp_dir = tempfile.mkdtemp(prefix="ray-tests-")
        # What the service sets for a Ray instance of its own that only the raylet reads
        # (a joined cluster's job cannot set it): the replicas at nice 0.
        env = {**os.environ, **RAY_ENV, "RAY_worker_niceness": "0"}
        ray = str(Path(sys.executable).parent / "ray")
        super().__init__(
            [
                *(ray, "start", "--head", "--block", "--port", port),
                *("--num-cpus", str(os.cpu_count()), "--include-dashboard", "false"),
                *("--object-store-memory", str(100 << 20), "--disable-usage-stats"),
                *("--temp-dir", self.temp_dir),
            ],
            env,
            ready="Ray runtime started",
            what="the Ray cluster",
        )

    def stop(self, *, timeout_s: float = 60.0) -> int | None:
        status = super().stop(timeout_s=timeout_s)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        return status


class RayService(_Child):
    """``thinkstruct serve`` with the given options, on a free port, joining ``cluster``
    (it removes its application from the cluster when it stops)."""

    def __init__(self, cluster: RayCluster, model_dir: Path, *options: str) -> None:
        self.cluster = cluster
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [str(Path(sys.executable).parent / "thinkstruct"), "serve", "--model", str(model_dir)]
        super().__init__(
            [*command, "--port", str(self.port), "--log-level", "warning", "--ray-address", cluster.address]
            + [*SERVICE_OPTIONS, *options],
            {**os.environ, **RAY_ENV},
            ready="thinkstruct: listening on",
            what="the service",
        )

    def family(self) -> list[psutil.Process]:
        """Its descendants and its Serve processes in the cluster."""
        return _descendants(self.process.pid) + _titled(self.cluster.family(), *SERVE_TITLES)

    def engine_replicas(self) -> list[psutil.Process]:
        """The engine replicas' processes (Ray titles them ``ray::ServeReplica:<app>:engine``)."""
        return _titled(self.cluster.family(), "ServeReplica:thinkstruct:engine")

    def stats_board(self) -> list[psutil.Process]:
        """The process of its stats board actor (Ray titles it ``ray::StatsBoard``)."""
        return _titled(self.cluster.family(), "ray::StatsBoard")

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
