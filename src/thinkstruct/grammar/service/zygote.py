"""Compile workers forked ready-made: :func:`start_worker`.

A fresh compile worker costs about 2.7 CPU-seconds before it compiles anything (the
imports, torch among them through xgrammar: 1.4 s; the 129k tokenizer unpickled: 1 s; the
backend's vocabulary view), and a worker is started again after every compile killed at
its deadline. So each process that compiles out of process keeps one zygote: a process
(``python -m thinkstruct.grammar.service.zygote``) that has imported the backends and
built each setup it was asked for once (the last :data:`KEPT_SETUPS`), warmed by one small
compile, and forks a worker already holding its setup in about a millisecond.

The zygote never compiles and runs one thread (OpenMP at one thread), so a fork copies
no lock held by another thread. Requests (a setup's pickled bytes) go down its stdin;
each answer comes back on a Unix datagram socket, with the new worker's stdin, stdout
and stderr pipes attached. The worker is the zygote's child, not the caller's: the
caller watches and kills it through a pidfd (:class:`ForkedProcess`), and the zygote,
ignoring SIGCHLD, leaves its reaping to the kernel. The zygote ends when the last pool
of its process closes (:func:`release`) or its stdin closes; its workers, each when its own
stdin closes. Where no zygote can run (it died twice on one request, or the platform
has no pidfd), a worker starts as a process of its own instead
(:mod:`~thinkstruct.grammar.service.worker_process`).
"""

from __future__ import annotations

import collections
import hashlib
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
import weakref
from dataclasses import dataclass
from typing import IO, Any, Protocol

from thinkstruct.grammar.service.messages import forward_stderr, read_message, write_message

#: Most seconds the zygote may take to answer (it may be starting, then building a setup:
#: the imports and the 129k tokenizer take 2-6 s on 2 cores) before it is taken for stuck.
STARTUP_ALLOWANCE_S = 120.0

#: Setups (tokenizer, JSON format, backend) a zygote keeps built, least recently used out.
KEPT_SETUPS = 4

_ANSWER_BYTES = 4096


class WorkerProcess(Protocol):
    """What a pool needs of a worker's process (a :class:`subprocess.Popen` has it)."""

    pid: int

    def poll(self) -> int | None: ...

    def kill(self) -> None: ...

    def wait(self, timeout: float | None = None) -> int: ...


class ForkedProcess:
    """A worker forked by the zygote, watched through a pidfd (it is not our child, so its
    exit status is not ours to read: :meth:`poll` and :meth:`wait` say 0 once it ended)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._fd = os.pidfd_open(pid)
        weakref.finalize(self, os.close, self._fd)

    def poll(self) -> int | None:
        ended, _, _ = select.select([self._fd], [], [], 0)
        return 0 if ended else None

    def kill(self) -> None:
        try:
            signal.pidfd_send_signal(self._fd, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float | None = None) -> int:
        ended, _, _ = select.select([self._fd], [], [], timeout)
        if not ended:
            raise subprocess.TimeoutExpired(f"compile worker {self.pid}", timeout or 0.0)
        return 0


@dataclass
class Started:
    """A compile worker as a pool holds it: its process and its pipes (its stderr is
    forwarded to the ``thinkstruct.grammar`` logger)."""

    process: WorkerProcess
    stdin: IO[bytes]
    stdout: IO[bytes]


class _Zygote:
    """The parent's end of one zygote process."""

    def __init__(self) -> None:
        here, there = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _MAIN, str(there.fileno())],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=_child_env(),
                pass_fds=(there.fileno(),),
            )
        finally:
            there.close()
        self.answers = here
        self.answers.settimeout(STARTUP_ALLOWANCE_S)
        self.requests: IO[bytes] = _opened(self.process.stdin)
        _forward(_opened(self.process.stderr), "zygote")

    def fork(self, setup: bytes, backend: str) -> Started:
        """A worker forked with ``setup``; OSError/EOFError if the zygote is gone."""
        write_message(self.requests, setup)
        data, fds, _, _ = socket.recv_fds(self.answers, _ANSWER_BYTES, 3)
        if not data:
            raise EOFError
        kind, value = pickle.loads(data)
        if kind != "ok":
            for fd in fds:
                os.close(fd)
            raise _SetupFailed(value)
        stdin, stdout, stderr = (
            os.fdopen(fd, mode) for fd, mode in zip(fds, ("wb", "rb", "rb"), strict=True)
        )
        _forward(stderr, backend)
        process: WorkerProcess
        try:
            process = ForkedProcess(value)
        except ProcessLookupError:  # it died at once: the pool sees a worker that never starts
            process = _Ended(value)
        return Started(process, stdin, stdout)

    def close(self) -> None:
        try:
            self.requests.close()
        except OSError:
            pass
        self.answers.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class _SetupFailed(Exception):
    """The zygote could not build the setup (the worker started on its own reports why)."""


class _Ended:
    """A forked worker that had ended before it could be watched."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def poll(self) -> int | None:
        return 0

    def kill(self) -> None:
        pass

    def wait(self, timeout: float | None = None) -> int:
        return 0


_lock = threading.Lock()
_zygote: _Zygote | None = None
_users = 0


def hold() -> None:
    """A pool will start workers: keep the zygote (once started) until :func:`release`."""
    global _users
    with _lock:
        _users += 1


def release() -> None:
    """A pool is closed; the last one's release stops the zygote (the workers it forked
    end with their pools)."""
    global _users, _zygote
    with _lock:
        _users -= 1
        if _users > 0 or _zygote is None:
            return
        ending, _zygote = _zygote, None
    ending.close()


def start_worker(setup: bytes, backend: str) -> Started:
    """A compile worker for ``setup`` (the pool's pickled tokenizer, JSON format and
    backend name): forked by this process's zygote (started on first use, again if it
    died), or started as its own process where the zygote cannot serve (or no pool holds
    it: :func:`hold`).

    Blocks while the zygote starts or builds a setup it has not seen (seconds: the cost a
    worker of its own would pay); call it off any thread that must stay responsive.
    """
    global _zygote
    if hasattr(os, "pidfd_open") and hasattr(socket, "recv_fds"):
        with _lock:
            for _ in range(2 if _users > 0 else 0):
                try:
                    if _zygote is None or _zygote.process.poll() is not None:
                        _zygote = _Zygote()
                    return _zygote.fork(setup, backend)
                except _SetupFailed:
                    break
                except (OSError, EOFError, pickle.UnpicklingError):
                    if _zygote is not None:
                        _zygote.close()
                    _zygote = None
    return own_process(setup, backend)


def own_process(setup: bytes, backend: str) -> Started:
    """A compile worker as a process of its own (``python -m``
    :mod:`~thinkstruct.grammar.service.worker_process`), its setup written to its stdin."""
    process = subprocess.Popen(
        [sys.executable, "-m", "thinkstruct.grammar.service.worker_process"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_child_env(),
    )
    stdin = _opened(process.stdin)
    _forward(_opened(process.stderr), backend)
    write_message(stdin, setup)
    return Started(process, stdin, _opened(process.stdout))


def _child_env() -> dict[str, str]:
    """A compile process's environment: this one's, OpenMP at one thread (a compile is
    one thread; a zygote must hold no thread pool when it forks), output unbuffered."""
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def _opened(stream: IO[bytes] | None) -> IO[bytes]:
    if stream is None:
        raise OSError("could not open a pipe to a compile process")
    return stream


def zygote_pid() -> int | None:
    """The process id of this process's zygote, if one runs."""
    with _lock:
        return None if _zygote is None or _zygote.process.poll() is not None else _zygote.process.pid


def _forward(stream: IO[bytes], backend: str) -> None:
    threading.Thread(
        target=forward_stderr, args=(stream, backend), name=f"thinkstruct-{backend}-stderr", daemon=True
    ).start()


# ---- the zygote process --------------------------------------------------------------


def _serve(requests: IO[bytes], answers: socket.socket) -> None:
    from thinkstruct.grammar.service.worker_process import Setup, build, serve

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the workers
    built: collections.OrderedDict[bytes, Setup] = collections.OrderedDict()
    while True:
        try:
            setup = read_message(requests)
        except EOFError:
            return
        key = hashlib.sha256(setup).digest()
        try:
            ready = built.pop(key, None)
            if ready is None:
                ready = build(setup)
                ready.warm()
        except Exception as e:  # noqa: BLE001 - the worker started on its own says it again
            answers.send(pickle.dumps(("error", f"{type(e).__name__}: {e}")))
            continue
        built[key] = ready
        while len(built) > KEPT_SETUPS:
            built.popitem(last=False)
        ends: list[tuple[int, int]] = [os.pipe(), os.pipe(), os.pipe()]  # stdin, stdout, stderr
        pid = os.fork()
        if pid == 0:
            _become_worker(ends, answers, ready, serve)
        (in_r, in_w), (out_r, out_w), (err_r, err_w) = ends
        for fd in (in_r, out_w, err_w):
            os.close(fd)
        socket.send_fds(answers, [pickle.dumps(("ok", pid))], [in_w, out_r, err_r])
        for fd in (in_w, out_r, err_r):
            os.close(fd)


def _become_worker(ends: list[tuple[int, int]], answers: socket.socket, ready: Any, serve: Any) -> None:
    """In the forked child: the worker's loop on its own pipes, then exit."""
    code = 0
    try:
        (in_r, in_w), (out_r, out_w), (err_r, err_w) = ends
        answers.close()
        for fd in (in_w, out_r, err_r, 0):
            os.close(fd)
        os.dup2(err_w, 1)
        os.dup2(err_w, 2)
        os.close(err_w)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        serve(os.fdopen(in_r, "rb"), os.fdopen(out_w, "wb"), ready)
    except BaseException:  # noqa: BLE001 - never return into the zygote's loop
        code = 1
    finally:
        os._exit(code)


def main() -> None:
    """The zygote process: ``python -c`` :data:`_MAIN` ``FD`` (the answers socket's fd)."""
    # Anything the libraries print goes to stderr, forwarded by the parent.
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    _serve(sys.stdin.buffer, socket.socket(fileno=int(sys.argv[1])))


#: Run with ``-c`` (not ``-m``: the package imports this module before ``-m`` would run it).
_MAIN = "from thinkstruct.grammar.service.zygote import main; main()"
