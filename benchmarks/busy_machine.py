"""The engine's two threads on a machine where another process wants a core too.

The decoder stack's threads split each phase of a pass; a thread the system preempts
holds up whatever waits on it. This runs 8 requests at once on the embedded model,
in-process (no HTTP), at 1 and 2 threads, on a quiet machine and beside ``--hogs``
processes that each spin on a core for the whole run, for this tree and optionally
another (``--other ROOT``: a checkout before a change, its kernels built from its own
source), every side in its own process (``OMP_WAIT_POLICY=PASSIVE`` as the server runs),
the sides interleaved round by round. Prints tokens/s per side and condition and the
ratios.

    python benchmarks/busy_machine.py [--other /tmp/wt-base] [--rounds 2] [--hogs 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

WORKER = r"""
import json, sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
from thinkstruct.engine import Engine, EngineConfig, GenerationRequest, SamplingParams, load_model
from thinkstruct.parsers import render_chat
model = load_model(quantize="auto", progress=False)  # as thinkstruct serve picks it
engine = Engine(model, config=EngineConfig(prefix_cache_bytes=0)).start()
questions = ["Tell me about the history of Rome.", "Write a poem about autumn.", "Explain photosynthesis.",
             "What is machine learning?", "Describe Paris.", "How do airplanes fly?", "Why is the sea salty?",
             "Give advice for a job interview."]
def ids(q):
    text = render_chat([{"role": "user", "content": q}], family=model.family, tokenizer=model.tokenizer,
                       chat_template=model.chat_template, chat_template_kwargs={"enable_thinking": False}).text
    return list(model.tokenizer.hf.encode(text, add_special_tokens=False))
prompts = [ids(q) for q in questions]
def run(max_tokens):
    handles = [engine.submit(GenerationRequest(prompt_ids=p, sampling=SamplingParams(max_tokens=max_tokens, temperature=0.7, seed=k)))
               for k, p in enumerate(prompts)]
    return sum(len(h.wait().token_ids) for h in handles)
run(8)
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    start = time.perf_counter()
    tokens = run(int(line))
    print(json.dumps({"tokens": tokens, "seconds": time.perf_counter() - start}), flush=True)
engine.close()
"""

HOG = "while True: pass"


class Side:
    """One tree at one thread count: a worker process answering a line per run."""

    def __init__(self, label: str, src: Path, threads: int) -> None:
        self.label = label
        # Idle OpenMP threads sleep on every side, as in the server (another tree's
        # import may not set it).
        env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": str(threads)}
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        self.process = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(threads)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self._read()

    def _read(self) -> dict[str, float]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.label}: the worker exited")
        reply: dict[str, float] = json.loads(line)
        return reply

    def run(self, max_tokens: int) -> tuple[int, float]:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{max_tokens}\n")
        self.process.stdin.flush()
        reply = self._read()
        return int(reply["tokens"]), reply["seconds"]

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=60)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--other", default=None, help="another checkout's root, as more sides")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--hogs", type=int, default=1, help="spinning processes beside the engine when busy")
    parser.add_argument("--max-tokens", type=int, default=160)
    args = parser.parse_args()
    trees = {"this": Path(__file__).resolve().parent.parent / "src"}
    if args.other:
        trees["other"] = Path(args.other) / "src"
    sides = [Side(f"{tree} {threads}t", src, threads) for tree, src in trees.items() for threads in (1, 2)]
    results: dict[tuple[str, str], list[tuple[int, float]]] = {}
    print(f"# load average before: {os.getloadavg()}; 8 requests at once, {args.max_tokens} tokens each")
    try:
        for r in range(args.rounds):
            for busy in (False, True) if r % 2 == 0 else (True, False):
                hogs = [
                    subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(args.hogs if busy else 0)
                ]
                try:
                    order = sides if r % 2 == 0 else sides[::-1]
                    for side in order:
                        results.setdefault((side.label, "busy" if busy else "quiet"), []).append(
                            side.run(args.max_tokens)
                        )
                finally:
                    for hog in hogs:
                        hog.kill()
                        hog.wait()
    finally:
        for side in sides:
            side.close()
    rate = {key: sum(t for t, _ in runs) / sum(s for _, s in runs) for key, runs in results.items()}
    print(f"{'side':<10} {'quiet tok/s':>12} {f'{args.hogs} hog(s) tok/s':>16} {'busy/quiet':>11}")
    for side in sides:
        quiet, busy = rate[(side.label, "quiet")], rate[(side.label, "busy")]
        print(f"{side.label:<10} {quiet:>12.1f} {busy:>16.1f} {busy / quiet:>10.2f}x")
    for tree in trees:
        for cond in ("quiet", "busy"):
            print(
                f"# {tree}, {cond}: 2 threads / 1 thread {rate[(f'{tree} 2t', cond)] / rate[(f'{tree} 1t', cond)]:.2f}x"
            )
    if args.other:
        for cond in ("quiet", "busy"):
            print(
                f"# 2 threads, {cond}: this / other {rate[('this 2t', cond)] / rate[('other 2t', cond)]:.2f}x"
            )
    print(f"# load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
