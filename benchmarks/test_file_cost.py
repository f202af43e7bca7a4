"""What each test file costs run alone: wall seconds and CPU seconds (the pytest process
and every process it started and reaped: servers, compile workers, subprocesses).

Each file runs in its own ``python -m pytest`` with one torch thread (``OMP_NUM_THREADS=1``,
as in a ``make test`` worker). Before each file the machine must be quiet (see
``alone.py``); while it runs, the CPU seconds the machine's other processes used are
counted and printed beside it (``others``), so a figure taken on a shared machine says so.

    PYTHONPATH=src python benchmarks/test_file_cost.py tests/engine/test_models.py [more files]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import alone


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_file(path: str, rule: alone.QuietRule, durations: int) -> str:
    quiet = alone.wait_quiet(rule)
    mark = f"test-file-cost-{os.getpid()}-{time.monotonic_ns()}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", alone.MARK: mark}
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--durations={durations}",
        path,
    ]
    busy0, _ = alone.cpu_seconds()
    own0, children0 = own_cpu_s(), children_cpu_s()
    started = time.monotonic()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.monotonic() - started
    left = alone.marked_cpu_s(mark)
    ended = alone.end_marked(mark, grace_s=5.0)
    cpu = children_cpu_s() - children0 + left
    busy1, _ = alone.cpu_seconds()
    others = max(0.0, (busy1 - busy0) - cpu - (own_cpu_s() - own0))
    tail = [line for line in done.stdout.splitlines() if line.strip()]
    slowest = [line for line in tail if line.split()[:1] and line.split()[0].endswith("s") and "::" in line]
    verdict = tail[-1] if tail else f"exit {done.returncode}"
    lines = [
        f"{path}: {cpu:.1f} CPU-s in {wall:.1f} s wall; others {others / wall:.2f} cores"
        f"{'' if quiet.met else ' (machine busy at start)'}"
        f"{f'; {ended} leftover processes ended' if ended else ''} -- {verdict}",
        *(f"    {line}" for line in slowest),
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("files", nargs="+", help="test files, each run alone")
    parser.add_argument("--durations", type=int, default=8, help="slowest phases shown per file (default 8)")
    alone.add_arguments(parser)
    args = parser.parse_args()
    rule = alone.quiet_rule(args)
    print(alone.header(), flush=True)
    for path in args.files:
        print(run_file(path, rule, args.durations), flush=True)


if __name__ == "__main__":
    main()
