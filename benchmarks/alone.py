"""Each side of a side-by-side benchmark alone on the machine.

A side is its own process: a **worker** (a command that reads one JSON job on stdin and
prints one JSON object as its last line of stdout, then exits) or a **server** (an HTTP
server on a loopback port, healthy when ``GET /health`` answers 200, stopped with
SIGTERM). Before a side starts, the machine must be quiet: the busy cores, sampled from
``/proc/stat`` every second, below ``--quiet-below`` for ``--quiet-settle`` seconds in a
row (at most ``--quiet-timeout`` seconds of waiting; a side that starts on a busy machine
says so), and no process left of another side. Every process a side starts carries a
mark in its environment (``THINKSTRUCT_BENCH_SIDE``), so whatever it leaves behind (compile
workers, a Ray instance) is found by its mark, waited for and then ended by its id before
the next side starts.

While a side runs, the CPU time of the machine's other processes is counted (the
machine's busy CPU seconds from ``/proc/stat`` less the side's and this process's own): a
run reports the cores others took from it, so a figure taken beside someone else's work
shows it.

Usage (one round of two sides; the sides' order rotates round by round)::

    rule = alone.quiet_rule(args)            # after alone.add_arguments(parser)
    print(alone.header())                    # the machine and the command that reproduces the run
    for r in range(rounds):
        for side in alone.rotation(["a", "b"], r):
            worker = alone.Worker(side, [sys.executable, __file__, "--worker", side], rule=rule)
            result, run = worker.run(job)   # the job as JSON on stdin, the result from its last line
            runs.append(run)
        ...
    port = alone.free_port()
    with alone.Server("name", alone.thinkstruct_serve("--quantize", "gguf", port=port), port=port, rule=rule) as server:
        httpx.get(f"{server.url}/v1/models")     # leaving the block stops it and ends what it left
    runs.append(server.record)
    print(alone.summary(runs))

A worker's side of the protocol is :func:`worker_main`. This module imports the standard
library only (a worker may run under another Python, e.g. one with ``llama_cpp``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

#: The environment variable that marks every process of a side.
MARK = "THINKSTRUCT_BENCH_SIDE"
_TICK = os.sysconf("SC_CLK_TCK")
T = TypeVar("T")


# ---- the machine ---------------------------------------------------------------------------------


def cpu_seconds() -> tuple[float, float]:
    """(busy, all) CPU seconds of the whole machine since boot, summed over its cores
    (``/proc/stat``: idle and iowait count as not busy)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    total = sum(fields[:8])  # guest time is already inside user time
    return (total - idle) / _TICK, total / _TICK


def busy_cores(window_s: float = 1.0) -> float:
    """Cores busy over the next ``window_s`` seconds (0 to the core count)."""
    busy0, _ = cpu_seconds()
    started = time.monotonic()
    time.sleep(window_s)
    busy1, _ = cpu_seconds()
    return (busy1 - busy0) / (time.monotonic() - started)


def marked(mark: str) -> list[int]:
    """Ids of the live processes whose environment holds ``MARK=mark``."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state != b"Z" and needle in environ.split(b"\0"):
            found.append(int(entry))
    return found


def marked_cpu_s(mark: str) -> float:
    """CPU seconds of the live processes marked ``mark`` (with their reaped children)."""
    total = 0
    for pid in marked(mark):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
    return total / _TICK


def cpu_name() -> str:
    """The CPU's model name and the vector extensions it reports (``/proc/cpuinfo``)."""
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        return "unknown CPU"
    flags = info.get("flags", "").split()
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")
    return (
        f"{info.get('model name', 'unknown CPU')}; {' '.join(w for w in wanted if w in flags) or 'no AVX2'}"
    )


def reproduce_command() -> str:
    """The shell command that runs this benchmark again with the same options."""
    env = [
        f"{k}={os.environ[k]}"
        for k in ("PYTHONPATH", "OMP_WAIT_POLICY", "OMP_NUM_THREADS")
        if k in os.environ
    ]
    return f"cd {shlex.quote(os.getcwd())} && " + shlex.join([*env, sys.executable, *sys.argv])


def header() -> str:
    """Lines that open a benchmark's output: the machine and the command that reproduces it."""
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    return (
        f"# {os.cpu_count()} CPUs ({cpu_name()}), load average {load}, {time.strftime('%Y-%m-%d %H:%M %Z')}\n"
        f"# reproduce: {reproduce_command()}"
    )


# ---- waiting for quiet ---------------------------------------------------------------------------


@dataclass(frozen=True)
class QuietRule:
    """When the machine counts as quiet.

    Attributes:
        below_cores: the busy cores (summed over the machine, a 1 s sample) must stay below this.
        settle_s: for this many seconds in a row.
        timeout_s: the most seconds to wait; then the side starts anyway, marked as not quiet.
        max_others: a worker's run is given up when the machine's other processes use more
            than this many cores for ``noisy_s`` seconds in a row (sampled every 5 s), and
            run again once the machine is quiet.
        noisy_s: see ``max_others``.
        tries: runs of a worker at most; the last one is kept, however noisy.
    """

    below_cores: float = 0.25
    settle_s: float = 3.0
    timeout_s: float = 180.0
    max_others: float = 0.5
    noisy_s: float = 15.0
    tries: int = 3


#: The rule for a worker whose time is not measured (prompt ids, agreement tables): it
#: starts at once and is never given up.
UNTIMED = QuietRule(below_cores=float("inf"), settle_s=0.0, timeout_s=0.0, tries=1)


@dataclass(frozen=True)
class Quiet:
    """How a wait for quiet went: seconds waited, the last sample's busy cores, and
    whether the rule was met (``False``: the wait timed out)."""

    waited_s: float
    busy_cores: float
    met: bool


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of :class:`QuietRule` (read back with :func:`quiet_rule`)."""
    rule = QuietRule()
    group = parser.add_argument_group("each side alone")
    options: list[tuple[str, type, float, str]] = [
        ("--quiet-below", float, rule.below_cores, "busy cores under which the machine is quiet before a side starts"),
        ("--quiet-settle", float, rule.settle_s, "seconds it must stay so"),
        ("--quiet-timeout", float, rule.timeout_s, "most seconds to wait for quiet before a side starts anyway"),
        ("--max-others", float, rule.max_others, f"cores other processes may use for {rule.noisy_s:g} s in a row"
         " before a worker's run is given up and run again"),
        ("--tries", int, rule.tries, "runs of a worker at most"),
    ]  # fmt: skip
    for flag, kind, default, text in options:
        group.add_argument(flag, type=kind, default=default, help=f"{text} (default {default:g})")


def quiet_rule(args: argparse.Namespace) -> QuietRule:
    return QuietRule(
        below_cores=args.quiet_below,
        settle_s=args.quiet_settle,
        timeout_s=args.quiet_timeout,
        max_others=args.max_others,
        tries=max(1, args.tries),
    )


def wait_quiet(rule: QuietRule) -> Quiet:
    """Sample the busy cores each second until ``rule`` holds or its timeout passes."""
    if rule.below_cores == float("inf"):
        return Quiet(0.0, 0.0, True)
    started = time.monotonic()
    calm = 0.0
    while True:
        busy = busy_cores(1.0)
        calm = calm + 1.0 if busy < rule.below_cores else 0.0
        waited = time.monotonic() - started
        if calm >= rule.settle_s:
            return Quiet(waited, busy, True)
        if waited >= rule.timeout_s:
            return Quiet(waited, busy, False)


def end_marked(mark: str, *, grace_s: float = 30.0) -> int:
    """Wait up to ``grace_s`` for the processes marked ``mark`` to exit, then end the rest
    (SIGTERM, 10 s, SIGKILL) by id. Returns how many had to be ended."""
    deadline = time.monotonic() + grace_s
    while marked(mark) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = marked(mark)
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        for pid in marked(mark):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while marked(mark) and time.monotonic() < deadline:
            time.sleep(0.2)
    if marked(mark):
        raise RuntimeError(f"processes of a side outlived SIGKILL: {marked(mark)}")
    return len(left)


# ---- a side's process ----------------------------------------------------------------------------


@dataclass
class Run:
    """One side's process, from its start to its last process's end.

    Attributes:
        side: the side's name.
        quiet: the wait before it started.
        wall_s: seconds from its start to its end.
        others_cores: cores the machine's other processes used meanwhile (its busy CPU
            seconds less this process's and the side's, over ``wall_s``).
        ended: leftover processes that had to be ended.
        given_up: runs of the same side before this one, given up for others' load.
    """

    side: str
    quiet: Quiet
    wall_s: float = 0.0
    others_cores: float = 0.0
    ended: int = 0
    given_up: int = 0

    def __str__(self) -> str:
        busy = "" if self.quiet.met else " on a busy machine"
        again = f" (run {self.given_up + 1})" if self.given_up else ""
        return f"{self.side}{again}: {self.wall_s:.0f} s{busy}, others {self.others_cores:.2f} cores"


def _exit_on_sigterm() -> None:
    """SIGTERM raises ``SystemExit`` in this process (where nothing else handles it), so a
    benchmark told to stop still stops its sides on the way out."""

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    if (
        signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        and threading.current_thread() is threading.main_thread()
    ):
        signal.signal(signal.SIGTERM, stop)


def _own_cpu_s() -> float:
    """CPU seconds of this process and of its reaped children."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class _Process:
    """A side's process, started after :func:`wait_quiet`; ending it ends everything it started."""

    def __init__(
        self, name: str, argv: Sequence[str], *, rule: QuietRule, env: dict[str, str] | None
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.rule = rule
        self.env = dict(env or {})
        self._record: Run | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._mark = uuid.uuid4().hex
        self._start = (0.0, 0.0, 0.0)

    @property
    def record(self) -> Run:
        """The side's :class:`Run` (from its start; complete once it has ended)."""
        if self._record is None:
            raise RuntimeError(f"{self.name} has not run")
        return self._record

    def _popen(self, **kwargs: Any) -> subprocess.Popen[bytes]:
        _exit_on_sigterm()
        quiet = wait_quiet(self.rule)
        if not quiet.met:
            print(
                f"# {self.name}: the machine did not become quiet in {quiet.waited_s:.0f} s "
                f"({quiet.busy_cores:.2f} cores busy); starting anyway",
                flush=True,
            )
        self._record = Run(self.name, quiet)
        env = {**os.environ, **self.env, MARK: self._mark}
        self._start = (time.monotonic(), cpu_seconds()[0], _own_cpu_s())
        self.proc = subprocess.Popen(list(self.argv), env=env, start_new_session=True, **kwargs)
        return self.proc

    def _finish(self, *, grace_s: float = 30.0) -> Run:
        self.record.ended = end_marked(self._mark, grace_s=grace_s)
        wall = time.monotonic() - self._start[0]
        machine = cpu_seconds()[0] - self._start[1]
        own = _own_cpu_s() - self._start[2]
        self.record.wall_s = wall
        self.record.others_cores = max(0.0, (machine - own) / wall)
        return self.record


class Worker(_Process):
    """A side that runs one job: ``argv`` reads a JSON object on stdin and prints its
    result, a JSON object, as its last line of stdout (:func:`worker_main`)."""

    def __init__(
        self, name: str, argv: Sequence[str], *, rule: QuietRule, env: dict[str, str] | None = None
    ) -> None:
        super().__init__(name, argv, rule=rule, env=env)

    def run(self, job: dict[str, Any], *, timeout_s: float = 3600.0) -> tuple[dict[str, Any], Run]:
        """(the worker's result, its :class:`Run`). A run during which others take more than
        the rule's ``max_others`` cores is given up and run again (``tries`` in all). Raises
        if the worker fails or runs past ``timeout_s``."""
        attempt = 0
        while (
            outcome := self._attempt(job, timeout_s=timeout_s, last=attempt >= self.rule.tries - 1)
        ) is None:
            attempt += 1
        result, run = outcome
        run.given_up = attempt
        return result, run

    def _attempt(
        self, job: dict[str, Any], *, timeout_s: float, last: bool
    ) -> tuple[dict[str, Any], Run] | None:
        # stdout to a file, not a pipe: a leftover child holding it open cannot stall the read.
        with tempfile.TemporaryFile() as job_file, tempfile.TemporaryFile() as out_file:
            job_file.write(json.dumps(job).encode())
            job_file.seek(0)
            proc = self._popen(stdin=job_file, stdout=out_file)
            try:
                noisy = self._watch(proc, timeout_s=timeout_s, give_up=not last)
            except BaseException:  # a timeout, or this process told to stop: the side goes too
                proc.kill()
                proc.wait()
                self._finish(grace_s=0.0)
                raise
            if noisy is not None:
                proc.kill()
                proc.wait()
                self._finish(grace_s=0.0)
                print(
                    f"# {self.name}: other processes took {noisy:.2f} cores for {self.rule.noisy_s:g} s;"
                    " run again once the machine is quiet",
                    flush=True,
                )
                return None
            run = self._finish()
            out_file.seek(0)
            lines = out_file.read().decode().strip().splitlines()
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"the {self.name} worker exited with {proc.returncode}")
        result: dict[str, Any] = json.loads(lines[-1])
        return result, run

    def _watch(self, proc: subprocess.Popen[bytes], *, timeout_s: float, give_up: bool) -> float | None:
        """Wait for ``proc``; every 5 s, the cores others used meanwhile. Returns their mean
        over the last ``noisy_s`` when it stayed above ``max_others`` (``give_up``), else
        ``None`` once ``proc`` has exited."""
        deadline = time.monotonic() + timeout_s
        windows: list[float] = []
        before = (time.monotonic(), cpu_seconds()[0], marked_cpu_s(self._mark) + _own_cpu_s())
        while True:
            try:
                proc.wait(timeout=5.0)
                return None
            except subprocess.TimeoutExpired:
                if time.monotonic() > deadline:
                    raise
            now = (time.monotonic(), cpu_seconds()[0], marked_cpu_s(self._mark) + _own_cpu_s())
            windows.append(((now[1] - before[1]) - (now[2] - before[2])) / (now[0] - before[0]))
            before = now
            recent = windows[-max(1, round(self.rule.noisy_s / 5.0)) :]
            if give_up and len(recent) * 5.0 >= self.rule.noisy_s and min(recent) > self.rule.max_others:
                return sum(recent) / len(recent)


def free_port() -> int:
    """A free TCP port on the loopback interface, below the kernel's ephemeral range and
    above Ray's worker ports (10002-19999): a port from the ephemeral range (what binding
    port 0 gives) can be taken between the choice and the server's bind by any process's
    own port-0 bind or outgoing connection (seen: a Ray Serve ingress that could not bind
    its port while Ray's processes started)."""
    ranges = Path("/proc/sys/net/ipv4/ip_local_port_range")
    low = int(ranges.read_text().split()[0]) if ranges.exists() else 32768
    for port in random.sample(range(20000, low), min(200, low - 20000)):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port between 20000 and {low}")


class Server(_Process):
    """A side that serves HTTP on ``127.0.0.1:port`` (``argv`` must make it listen there),
    healthy when ``GET health`` answers 200. A context manager: entering starts it (after
    quiet) and waits until healthy, leaving stops it with SIGTERM and ends whatever it left;
    :attr:`record` then holds its :class:`Run`. Its stderr is kept in a temporary file and
    shown if it fails to start."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        port: int,
        rule: QuietRule,
        env: dict[str, str] | None = None,
        health: str = "/health",
        ready_timeout_s: float = 900.0,
    ) -> None:
        super().__init__(name, argv, rule=rule, env=env)
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self._health = health
        self._ready_timeout_s = ready_timeout_s
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in stop())

    def __enter__(self) -> Server:
        self._popen(stdout=subprocess.DEVNULL, stderr=self._log)
        deadline = time.monotonic() + self._ready_timeout_s
        try:
            while True:
                self.check_running()
                try:
                    with urllib.request.urlopen(self.url + self._health, timeout=5) as reply:
                        if reply.status == 200:
                            return self
                except (urllib.error.URLError, OSError):
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name} was not healthy in {self._ready_timeout_s:.0f} s")
                time.sleep(0.5)
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def check_running(self) -> None:
        """Raises RuntimeError, with the end of its stderr, where the process has ended."""
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: {self._tail()}")

    def _tail(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-2000:]

    def stop(self) -> Run:
        """SIGTERM (the server finishes in-flight requests), then end whatever is left."""
        if self.proc is None:
            raise RuntimeError(f"{self.name} was never started")
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self._finish()


def thinkstruct_serve(*args: str, port: int) -> list[str]:
    """``thinkstruct serve --port PORT ARGS`` of this Python's environment."""
    exe = os.path.join(os.path.dirname(sys.executable), "thinkstruct")
    return [exe, "serve", "--port", str(port), *args]


# ---- rounds and the report -----------------------------------------------------------------------


def rotation(sides: Sequence[T], round_: int) -> list[T]:
    """``sides`` in round ``round_``'s order: rotated by one each round, so every side
    goes first, second, ... equally often over ``len(sides)`` rounds."""
    shift = round_ % len(sides) if sides else 0
    return [*sides[shift:], *sides[:shift]]


def round_report(number: int, runs: Sequence[Run]) -> str:
    """One line on a round's runs (``number`` counts from 1) and the load average after it."""
    return f"  round {number}: {'; '.join(map(str, runs))} (load average {os.getloadavg()[0]:.2f})"


def rate(rounds: Sequence[tuple[float, float]]) -> float:
    """Amount per second over ``rounds`` of (amount, seconds): summed amounts over summed seconds."""
    return sum(a for a, _ in rounds) / sum(s for _, s in rounds)


def ratio(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> str:
    """``a``'s :func:`rate` over ``b``'s, rounds paired, and the lowest and highest round's
    ratio: ``"1.68x (1.60-1.75)"``."""
    rounds = [rate([x]) / rate([y]) for x, y in zip(a, b, strict=True)]
    return f"{rate(a) / rate(b):.2f}x ({min(rounds):.2f}-{max(rounds):.2f})"


def summary(runs: Sequence[Run]) -> str:
    """Lines on how alone the sides were (waits for quiet, others' cores, leftovers) and
    the load average after."""
    if not runs:
        return "# no side ran"
    loud = sum(not r.quiet.met for r in runs)
    return (
        f"# each side alone: {len(runs)} runs, waited for quiet {sum(r.quiet.waited_s for r in runs):.0f} s in all"
        f" ({loud} started on a busy machine); other processes used {max(r.others_cores for r in runs):.2f} cores"
        f" at most (mean {sum(r.others_cores for r in runs) / len(runs):.2f}) while a side ran;"
        f" {sum(r.ended for r in runs)} leftover processes ended; {sum(r.given_up for r in runs)} runs given up"
        " for others' load and run again\n"
        f"# load average after: {', '.join(f'{v:.2f}' for v in os.getloadavg())}"
    )


# ---- the worker's end ----------------------------------------------------------------------------


def worker_main(handle: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """Read one JSON job from stdin, print ``handle(job)`` as one JSON line on stdout.
    Anything else ``handle`` prints goes to stderr, so the last stdout line is the result."""
    job = json.loads(sys.stdin.read())
    stdout = sys.stdout
    sys.stdout = sys.stderr
    try:
        result = handle(job)
    finally:
        sys.stdout = stdout
    print(json.dumps(result), flush=True)
