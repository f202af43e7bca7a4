"""How long ``thinkstruct serve`` takes to be ready, this tree against another source tree
(``--baseline-src``), side by side: seconds from the process's start to ``/health``
answering 200, and the CPU seconds its processes (the server and its compile workers)
spent until then. Each start runs alone on a quiet machine (see ``alone.py``); the sides
alternate round by round.

    PYTHONPATH=src python benchmarks/serve_start.py --baseline-src /tmp/old/src \\
        --rounds 3 -- --model MODEL_DIR --backend llguidance
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import alone
from serve_process import free_port, start_serve, wait_healthy

SRC = str(Path(__file__).resolve().parents[1] / "src")


def start_once(src: str, args: list[str], rule: alone.QuietRule) -> tuple[float, float]:
    """(seconds to healthy, CPU seconds of the server's processes until then)."""
    alone.wait_quiet(rule)
    mark = f"serve-start-{os.getpid()}-{time.monotonic_ns()}"
    port = free_port()
    started = time.monotonic()
    proc = start_serve(port, *args, pythonpath=src, env={alone.MARK: mark})
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
        seconds = time.monotonic() - started
        cpu = alone.marked_cpu_s(mark)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
        alone.end_marked(mark, grace_s=10.0)
    return seconds, cpu


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--baseline-src", required=True, help="the other tree's src directory")
    parser.add_argument("--rounds", type=int, default=3)
    alone.add_arguments(parser)
    parser.add_argument("serve_args", nargs="*", help="after --: the options of thinkstruct serve")
    args = parser.parse_args()
    rule = alone.quiet_rule(args)
    print(alone.header())
    sides = {"this tree": SRC, "baseline": str(Path(args.baseline_src).resolve())}
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
    for round_ in range(args.rounds):
        for name in alone.rotation(list(sides), round_):
            seconds, cpu = start_once(sides[name], args.serve_args, rule)
            results[name].append((seconds, cpu))
            print(f"round {round_ + 1}, {name}: healthy in {seconds:.2f} s, {cpu:.2f} CPU-s", flush=True)
    medians = {
        name: (statistics.median(s for s, _ in runs), statistics.median(c for _, c in runs))
        for name, runs in results.items()
    }
    for name, (seconds, cpu) in medians.items():
        print(f"{name}: median {seconds:.2f} s, {cpu:.2f} CPU-s")
    (ours_s, ours_cpu), (base_s, base_cpu) = medians["this tree"], medians["baseline"]
    print(f"this tree / baseline: {ours_s / base_s:.2f}x the time, {ours_cpu / base_cpu:.2f}x the CPU")


if __name__ == "__main__":
    main()
