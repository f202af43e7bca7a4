"""A compile worker's start: forked from the zygote against a process of its own.

Every compile that runs to its deadline costs its worker, and the next compile of that
backend waits for a new one. This times, from the request for a worker to its "ready",
the wall seconds and the CPU seconds it took, for the xgrammar setup of the default 129k
tokenizer: a fork from the process's zygote (which built and warmed the setup once,
before the first round) against ``python -m thinkstruct.grammar.service.worker_process``
(imports, the tokenizer unpickled, the vocabulary view built). Then each worker's first
compile (a small schema): the fork holds the warmed caches, the fresh process builds them
lazily. The sides alternate, ``--rounds`` each; medians.

    python benchmarks/worker_start.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import time
from collections.abc import Callable

import psutil

from thinkstruct.grammar.constraint import Constraint
from thinkstruct.grammar.json_format import JsonFormat
from thinkstruct.grammar.service import zygote
from thinkstruct.grammar.service.messages import read_message, write_message
from thinkstruct.tokenizer import Tokenizer


def _cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def _one(start: Callable[[], zygote.Started], first: Constraint) -> tuple[float, float, float]:
    """(wall s to ready, CPU s to ready, wall s of the first compile) of one worker."""
    parent = zygote.zygote_pid()
    before = _cpu([parent]) if parent is not None else 0.0
    began = time.perf_counter()
    worker = start()
    if pickle.loads(read_message(worker.stdout)) != "ready":
        raise RuntimeError("the worker did not start")
    ready = time.perf_counter() - began
    cpu = _cpu([worker.process.pid]) + ((_cpu([parent]) - before) if parent is not None else 0.0)
    began = time.perf_counter()
    write_message(worker.stdin, pickle.dumps((False, first)))
    status, _, _ = pickle.loads(read_message(worker.stdout))
    compiled = time.perf_counter() - began
    if status != "ok":
        raise RuntimeError(f"the first compile failed: {status}")
    worker.stdin.close()
    worker.process.wait(timeout=30)
    return ready, cpu, compiled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    setup = pickle.dumps((Tokenizer.default(), JsonFormat(), "xgrammar"), protocol=pickle.HIGHEST_PROTOCOL)
    zygote.hold()
    try:
        _one(
            lambda: zygote.start_worker(setup, "xgrammar"), Constraint.regex("warm")
        )  # the zygote's own start
        sides: dict[str, Callable[[], zygote.Started]] = {
            "forked": lambda: zygote.start_worker(setup, "xgrammar"),
            "own process": lambda: zygote.own_process(setup, "xgrammar"),
        }
        seen: dict[str, list[tuple[float, float, float]]] = {side: [] for side in sides}
        for round in range(args.rounds):
            for side, start in sides.items():
                schema = {"type": "object", "properties": {f"r{round}": {"type": "integer"}}}
                seen[side].append(_one(start, Constraint.json_schema(schema)))
    finally:
        zygote.release()
    print(f"python benchmarks/worker_start.py --rounds {args.rounds}")
    print(f"{'worker':12} {'to ready (ms)':>14} {'CPU to ready (s)':>17} {'first compile (ms)':>19}")
    for side, rows in seen.items():
        ready, cpu, first = (statistics.median(column) for column in zip(*rows, strict=True))
        print(f"{side:12} {ready * 1e3:14.1f} {cpu:17.3f} {first * 1e3:19.1f}")
    fork, own = (statistics.median(r[0] + r[2] for r in seen[side]) for side in sides)
    print(f"ready and compiled: forked {fork * 1e3:.0f} ms against {own * 1e3:.0f} ms ({own / fork:.1f}x)")


if __name__ == "__main__":
    main()
