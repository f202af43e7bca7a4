"""Where the CPU of the Ray test files goes: runs them (pytest, one process, no xdist)
while sampling every process of the machine's process tree below this one, and prints
each test's wall time, the machine's busy CPU seconds over the run (``/proc/stat``) and
the CPU seconds of each kind of process (the Ray daemons, Serve's controller and proxy,
the engine and ingress replicas, their compile workers, the test process).

A process's CPU is its last sample (taken every second): one that lives less than a
second between two samples is missed, so the kinds' sum is at most the machine's. Run it
alone on the machine (``flock /work/heavy.lock``); other work on the machine shows as the
difference between the machine's CPU seconds and the processes' sum. Arguments replace
the test files; ``RAY_TESTS_CPU_TOP=N`` lists the N processes that took the most.

    flock /work/heavy.lock python benchmarks/ray_tests_cpu.py [pytest args...]
"""

from __future__ import annotations

import collections
import os
import shlex
import subprocess
import sys
import threading
import time

import psutil

RAY_FILES = ("tests/cluster/test_replicas.py", "tests/cluster/test_autoscaling.py")

#: The kind of a process by a piece of its command line, first match wins.
KINDS = (
    ("ServeReplica:thinkstruct:engine", "engine replica"),
    ("ServeReplica:thinkstruct:ingress", "ingress replica"),
    ("ServeController", "serve controller"),
    ("ProxyActor", "serve proxy"),
    ("StatsBoard", "stats board actor"),
    ("ray::IDLE", "idle ray worker"),
    ("ray::", "other ray worker"),
    ("_worker.py", "ray worker (untitled)"),
    ("ray.util.client.server", "ray client server"),
    ("ray start", "ray start"),
    ("dashboard/agent.py", "dashboard agent"),
    ("dashboard/dashboard.py", "dashboard head"),
    ("runtime_env", "runtime env agent"),
    ("log_monitor", "log monitor"),
    ("monitor.py", "autoscaler monitor"),
    ("gcs_server", "gcs"),
    ("raylet", "raylet"),
    ("thinkstruct serve", "serve driver"),
    ("pytest", "test process"),
)


RETITLED = ("ray worker (untitled)", "idle ray worker")


def kind_of(cmd: str) -> str:
    for piece, kind in KINDS:
        if piece in cmd:
            return kind
    return ""


def busy_cpu_s() -> float:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    every = 1.0
    args = sys.argv[1:] or list(RAY_FILES)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=0", *args]
    print("command:", " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]))
    seen: dict[tuple[int, float], tuple[str, float]] = {}  # (pid, create time) -> (kind, cpu s)
    cmds: dict[tuple[int, float], str] = {}
    stop = threading.Event()
    timeline: list[tuple[float, float, dict[str, float]]] = []
    start_busy, start = busy_cpu_s(), time.monotonic()
    test = subprocess.Popen(command)

    def sample() -> None:
        while True:
            try:
                family = [psutil.Process(test.pid), *psutil.Process(test.pid).children(recursive=True)]
            except psutil.NoSuchProcess:
                family = []
            for p in family:
                try:
                    with p.oneshot():
                        key = (p.pid, p.create_time())
                        if key not in seen or seen[key][0] in RETITLED:
                            # Ray's workers take their title (``ray::...``) after they start.
                            cmds[key] = " ".join(p.cmdline())
                            own = kind_of(cmds[key])
                            parent = p.parent()
                            if not own and parent is not None:
                                pkind = seen.get((parent.pid, parent.create_time()), ("?", 0.0))[0]
                                own = pkind if pkind.startswith("child of") else f"child of {pkind}"
                            seen[key] = (own or "other", seen.get(key, ("", 0.0))[1])
                        t = p.cpu_times()
                        seen[key] = (seen[key][0], t.user + t.system)
                except psutil.NoSuchProcess:
                    pass
            totals: dict[str, float] = collections.defaultdict(float)
            for kind, cpu in list(seen.values()):
                totals[kind] += cpu
            timeline.append((time.monotonic() - start, busy_cpu_s() - start_busy, dict(totals)))
            if stop.wait(every):
                return

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    status = test.wait()
    stop.set()
    sampler.join()
    wall, busy = time.monotonic() - start, busy_cpu_s() - start_busy
    by_kind: dict[str, list[float]] = collections.defaultdict(list)
    for kind, cpu in seen.values():
        by_kind[kind].append(cpu)
    print(
        f"\npytest exit {status}; wall {wall:.0f} s; machine busy CPU {busy:.0f} s "
        f"({os.cpu_count()} cores); sampled processes {sum(sum(v) for v in by_kind.values()):.0f} s"
    )
    for kind, cpus in sorted(by_kind.items(), key=lambda kv: -sum(kv[1])):
        print(f"  {sum(cpus):7.1f} CPU-s  {len(cpus):3d} processes  {kind}")
    print("\nevery 15 s: machine busy CPU-s, then the kinds that took the most")
    last = (0.0, 0.0, {})
    for t, b, totals in timeline:
        if t - last[0] >= 15 or (t, b, totals) == timeline[-1]:
            deltas = {k: v - last[2].get(k, 0.0) for k, v in totals.items()}
            top = sorted(deltas.items(), key=lambda kv: -kv[1])[:4]
            print(
                f"  {last[0]:4.0f}-{t:4.0f} s {b - last[1]:5.1f}  "
                + ", ".join(f"{k} {v:.1f}" for k, v in top)
            )
            last = (t, b, totals)
    if os.environ.get("RAY_TESTS_CPU_TOP"):
        top = sorted(seen.items(), key=lambda kv: -kv[1][1])[: int(os.environ["RAY_TESTS_CPU_TOP"])]
        for key, (kind, cpu) in top:
            print(f"  {cpu:7.1f}  {kind:22s} {cmds[key][:150]}")


if __name__ == "__main__":
    main()
