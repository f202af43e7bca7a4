"""Replicas on Ray Serve against the single process, over HTTP, on the embedded model.

``--parts overhead``: two sides, each alone on the machine (``alone.py``: started after
the machine is quiet, stopped with everything it started, its Ray instance included,
before the other side starts): ``thinkstruct serve`` (one process, no Ray) and
``thinkstruct serve --ray-address local`` (one engine replica on a local Ray instance,
Ray's ingress deployment and DeploymentHandle streaming in the path). Each of ``--rounds``
rounds starts each side in turn, their order alternating round by round, and runs the same
closed loop on it (after ``--warmup`` seconds of it, not measured): ``--clients`` clients each
sending streamed chat requests (``--max-tokens``, thinking off) one after another for
``--seconds``. Reported per side: generated tokens
per second (``usage.completion_tokens`` summed over the wall time) and the median time to
first token (the first streamed chunk with text), over all rounds.

Then, alone too (``--parts replicas``), ``--replicas 2`` (one CPU per
replica) for: the same loop (two cores bound it), the share of chats, one after another,
whose second turn lands on the first turn's replica (``x-thinkstruct-replica``) and is
served from its prefix cache (``cached_tokens`` cover the first turn's whole prompt, to
the cache's block), and a grammar's cold compile on a replica: a request with a schema
neither the ingress nor any replica has seen, against the same request again (both
caches hit).

Concurrent conversations (``--parts concurrent``), two replicas, each routing alone on
the machine (``--routing prefix`` and ``--routing queue``, a fresh service for each side
and round, the sides' order alternating round by round): ``--conversations`` chats at
once (12 and 64), each a 300-word system prompt (its own, or one that all share: a
popular prefix) and a short question, then at once its second turn. Reported per side:
the second turns on their first turn's replica (sticky), those whose cached tokens cover
the first turn's whole prompt (to the prefix cache's block: prefix reuse), generated
tokens per second over the pattern's wall time, and how the first turns split between
the replicas (the popular prefix must spread); then prefix / queue tok/s.
``--conversation-first queue`` starts with the other routing (one round each way).

    python benchmarks/cluster.py [--parts overhead,replicas,concurrent] [--rounds 3] [--seconds 20] [--clients 8]
    python benchmarks/cluster.py --parts concurrent --conversation-rounds 2 --conversations 12,64

Targets: Ray with one replica >= 0.9x the single process's tok/s and <= 15 ms added to
the median first token; >= 95 % of sequential second turns on their replica's prefix
cache; concurrent conversations on 2 replicas: sticky >= 95 %, prefix reuse >= 90 %,
tok/s >= 0.95x queue-length routing, a shared system prompt on both replicas.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import statistics
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx

from thinkstruct.engine.kv.prefix_cache import BLOCK_TOKENS

sys.path.insert(0, str(Path(__file__).resolve().parent))

import alone

MODEL = "SmolLM2-135M-Instruct"
OFF = {"chat_template_kwargs": {"enable_thinking": False}}
DOCUMENT = " ".join(
    f"Article {i}: the lessee shall keep the premises in good repair and pay rent on day {i}."
    for i in range(20)
)


ENV = {"OMP_WAIT_POLICY": "PASSIVE", "RAY_USAGE_STATS_ENABLED": "0"}


def _service(name: str, *options: str, rule: alone.QuietRule) -> alone.Server:
    """``thinkstruct serve OPTIONS`` as a side (enter it to start it)."""
    port = alone.free_port()
    argv = alone.thinkstruct_serve("--log-level", "warning", *options, port=port)
    return alone.Server(name, argv, port=port, rule=rule, env=ENV)


def _wait_answering(service: alone.Server, timeout_s: float = 900.0) -> None:
    """Until a chat request answers 200 (a replica answers ``/health`` before its engine
    does); the service's own error if its process ends first."""
    deadline = time.monotonic() + timeout_s
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **OFF}
    while time.monotonic() < deadline:
        service.check_running()
        try:
            if httpx.post(f"{service.url}/v1/chat/completions", json=body, timeout=60).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"{service.url} did not answer a chat request")


def _stream(
    client: httpx.Client, messages: list[dict[str, str]], max_tokens: int
) -> tuple[float | None, int]:
    """(seconds to the first text chunk, completion tokens) of one streamed request."""
    body = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.7,
        **OFF,
    }
    start = time.perf_counter()
    first = None
    tokens = 0
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices", []):
                delta = choice.get("delta", {})
                if first is None and (delta.get("content") or delta.get("reasoning_content")):
                    first = time.perf_counter() - start
    return first, tokens


def closed_loop(url: str, *, clients: int, seconds: float, max_tokens: int) -> tuple[int, float, list[float]]:
    """(tokens, wall seconds, first-token times) of ``clients`` clients for ``seconds``."""
    stop_at = time.perf_counter() + seconds
    firsts: list[float] = []
    totals = [0] * clients
    lock = threading.Lock()

    def client_loop(index: int) -> None:
        with httpx.Client(base_url=url, timeout=300) as client:
            n = 0
            while time.perf_counter() < stop_at:
                question = f"Client {index}, question {n}: write a short poem about the sea."
                first, tokens = _stream(client, [{"role": "user", "content": question}], max_tokens)
                totals[index] += tokens
                if first is not None:
                    with lock:
                        firsts.append(first)
                n += 1

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        list(pool.map(client_loop, range(clients)))
    return sum(totals), time.perf_counter() - start, firsts


def cold_compile(url: str, *, tries: int) -> tuple[float, float]:
    """Median seconds of a one-token request with a never-seen schema, and of the same again."""
    cold, warm = [], []
    with httpx.Client(base_url=url, timeout=300) as client:
        for _ in range(tries):
            field = f"f{uuid.uuid4().hex[:8]}"
            schema = {
                "type": "object",
                "properties": {field: {"type": "string", "maxLength": 12}, "n": {"type": "integer"}},
                "required": [field, "n"],
            }
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": "Fill the record."}],
                "max_tokens": 1,
                "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}},
                **OFF,
            }
            for times in (cold, warm):
                start = time.perf_counter()
                client.post("/v1/chat/completions", json=body).raise_for_status()
                times.append(time.perf_counter() - start)
    return statistics.median(cold), statistics.median(warm)


_SYSTEM_TEXT = (
    "the tenant keeps the garden tidy and pays the rent on the first day of each month while the "
    "landlord repairs the roof and the heating before winter and answers letters within a week"
)


def system_prompt(tag: str, *, words: int = 300) -> str:
    """A system prompt of ``words`` words that starts with ``tag``."""
    text = _SYSTEM_TEXT.split()
    return " ".join([f"You are the assistant of {tag}.", *(text[i % len(text)] for i in range(words))])


@dataclass(frozen=True)
class Conversation:
    """Where a two-turn chat's turns went and what its second turn reused."""

    first_replica: str
    second_replica: str
    first_prompt_tokens: int
    second_cached_tokens: int
    completion_tokens: int

    @property
    def sticky(self) -> bool:
        return self.first_replica == self.second_replica

    @property
    def reused(self) -> bool:
        """The second turn's cached tokens cover the first turn's whole prompt (in the
        prefix cache's whole blocks)."""
        return self.second_cached_tokens >= self.first_prompt_tokens // BLOCK_TOKENS * BLOCK_TOKENS


def two_turns(client: httpx.Client, messages: list[dict[str, str]], *, max_tokens: int) -> Conversation:
    """``messages``, answered, then a second turn after the answer."""
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0, **OFF}
    one = client.post("/v1/chat/completions", json=body)
    one.raise_for_status()
    answer = one.json()["choices"][0]["message"]["content"]
    body["messages"] = [
        *messages,
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "Why?"},
    ]
    two = client.post("/v1/chat/completions", json=body)
    two.raise_for_status()
    first, second = one.json()["usage"], two.json()["usage"]
    return Conversation(
        first_replica=one.headers["x-thinkstruct-replica"],
        second_replica=two.headers["x-thinkstruct-replica"],
        first_prompt_tokens=first["prompt_tokens"],
        second_cached_tokens=(second.get("prompt_tokens_details") or {}).get("cached_tokens") or 0,
        completion_tokens=first["completion_tokens"] + second["completion_tokens"],
    )


def second_turns(url: str, *, chats: int) -> tuple[int, int]:
    """Chats one after another: (second turns on their first turn's replica, of those
    that reused its whole prompt)."""
    with httpx.Client(base_url=url, timeout=300) as client:
        done = [
            two_turns(
                client,
                [
                    {
                        "role": "user",
                        "content": f"Contract {uuid.uuid4().hex[:8]}. {DOCUMENT} Summarise article {i}.",
                    }
                ],
                max_tokens=16,
            )
            for i in range(chats)
        ]
    return sum(c.sticky for c in done), sum(c.sticky and c.reused for c in done)


def _conversation(url: str, system: str, question: str, max_tokens: int) -> Conversation:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    with httpx.Client(base_url=url, timeout=900) as client:
        return two_turns(client, messages, max_tokens=max_tokens)


def concurrent_conversations(
    url: str, *, chats: int, shared: bool, max_tokens: int
) -> tuple[list[Conversation], float]:
    """``chats`` two-turn chats at once (each its own system prompt, or one for all):
    what each did, and the wall seconds of all."""
    run = uuid.uuid4().hex[:8]  # prompts no replica has seen
    systems = [system_prompt(f"firm {run}" if shared else f"firm {run}-{i}") for i in range(chats)]
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(chats) as pool:
        done = list(
            pool.map(
                lambda i: _conversation(url, systems[i], f"Question {i}: when is rent due?", max_tokens),
                range(chats),
            )
        )
    return done, time.perf_counter() - start


@dataclass
class PatternTotals:
    """One side's results of one pattern over the rounds."""

    conversations: list[Conversation]
    wall_s: float = 0.0

    def add(self, done: list[Conversation], wall_s: float) -> None:
        self.conversations += done
        self.wall_s += wall_s

    @property
    def tok_s(self) -> float:
        return sum(c.completion_tokens for c in self.conversations) / self.wall_s

    def line(self) -> str:
        n = len(self.conversations)
        sticky = sum(c.sticky for c in self.conversations)
        reused = sum(c.sticky and c.reused for c in self.conversations)
        split = sorted(Counter(c.first_replica for c in self.conversations).values(), reverse=True)
        return (
            f"sticky {sticky}/{n} ({100 * sticky / n:.0f} %), prefix reuse {reused}/{n} ({100 * reused / n:.0f} %), "
            f"{self.tok_s:6.1f} tok/s, first turns per replica {'/'.join(map(str, split))}"
        )


def concurrent_part(args: argparse.Namespace, runs: list[alone.Run]) -> None:
    """Both routings, each alone on the machine, rounds alternating (see the docstring)."""
    rule = alone.quiet_rule(args)
    sides = ["prefix", "queue"] if args.conversation_first == "prefix" else ["queue", "prefix"]
    patterns = [(n, shared) for n in args.conversations for shared in (False, True)]
    totals = {(side, p): PatternTotals([]) for side in sides for p in patterns}
    print(
        f"concurrent conversations on 2 replicas, {args.conversation_rounds} rounds, load {_load()}",
        flush=True,
    )
    for r in range(args.conversation_rounds):
        for side in sides if r % 2 == 0 else sides[::-1]:
            with _service(
                side, "--replicas", "2", "--replica-cpus", "1", "--routing", side, rule=rule
            ) as service:
                _wait_answering(service)
                concurrent_conversations(service.url, chats=4, shared=False, max_tokens=8)  # warm-up
                for p in patterns:
                    done, wall = concurrent_conversations(
                        service.url, chats=p[0], shared=p[1], max_tokens=args.conversation_tokens
                    )
                    totals[side, p].add(done, wall)
                    print(
                        f"  round {r + 1} {side:<6} {p[0]:>3} chats {'shared' if p[1] else 'own':<6} {wall:6.1f} s: "
                        f"{PatternTotals(done, wall).line()}; load {_load()}",
                        flush=True,
                    )
            runs.append(service.record)
    for n, shared in patterns:
        prompt = "one shared system prompt" if shared else "a system prompt each"
        print(f"{n} conversations, {prompt}:")
        for side in sides:
            print(f"  {side:<6} {totals[side, (n, shared)].line()}")
        ratio = totals["prefix", (n, shared)].tok_s / totals["queue", (n, shared)].tok_s
        print(f"  prefix / queue: {ratio:.3f}x tok/s")


def _load() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3])


def _report(name: str, tokens: int, wall: float, firsts: list[float]) -> dict[str, float]:
    row = {
        "tok_s": tokens / wall,
        "ttft_median_ms": 1000 * statistics.median(firsts),
        "requests": len(firsts),
    }
    print(
        f"  {name:<22} {row['tok_s']:7.1f} tok/s   median TTFT {row['ttft_median_ms']:6.1f} ms   ({len(firsts)} requests)"
    )
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--chats", type=int, default=20, help="two-turn chats on two replicas")
    p.add_argument("--warmup", type=float, default=15.0, help="seconds of the same loop on each side first")
    p.add_argument(
        "--replica-cpus",
        default="2",
        help="the 1-replica side's --replica-cpus: its engine's threads (default 2, as the single process)",
    )
    p.add_argument(
        "--parts",
        type=lambda text: text.split(","),
        default=list(PARTS),
        help=f"what to measure, comma-separated (default {','.join(PARTS)})",
    )
    p.add_argument(
        "--conversations",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[12, 64],
        help="concurrent conversations per pattern, comma-separated (default 12,64)",
    )
    p.add_argument("--conversation-rounds", type=int, default=2, help="services started per routing")
    p.add_argument("--conversation-tokens", type=int, default=32, help="max_tokens of each turn")
    p.add_argument(
        "--conversation-first",
        choices=("prefix", "queue"),
        default="prefix",
        help="the routing that goes first in odd rounds (default prefix)",
    )
    alone.add_arguments(p)
    args = p.parse_args()
    unknown = set(args.parts) - set(PARTS)
    if unknown:
        p.error(f"--parts: unknown {sorted(unknown)}; choose from {','.join(PARTS)}")
    print(alone.header())
    runs: list[alone.Run] = []
    for part in args.parts:
        PARTS[part](args, runs)
    if runs:
        print(alone.summary(runs))
    return 0


def overhead_part(args: argparse.Namespace, runs: list[alone.Run]) -> None:
    """The single process against one replica on Ray, each alone (see the docstring)."""
    rule = alone.quiet_rule(args)
    # The replica's engine on as many threads as the single process's (2 here): like with like.
    sides = {
        "single process": (),
        "Ray, 1 replica": ("--ray-address", "local", "--replicas", "1", "--replica-cpus", args.replica_cpus),
    }
    print(
        f"{args.clients} clients, {args.max_tokens} tokens per request, {args.rounds} x {args.seconds:.0f} s per side"
    )
    results: dict[str, list[tuple[int, float, list[float]]]] = {name: [] for name in sides}
    for r in range(args.rounds):
        for name in alone.rotation(list(sides), r):
            with _service(name, *sides[name], rule=rule) as server:
                _wait_answering(server)
                # Warm-up, not measured: a replica's compile workers and first passes warm
                # up through its first minute (measured 485 tok/s and 102 ms in a first
                # 10 s loop, 519 and 72 ms in the next).
                closed_loop(server.url, clients=args.clients, seconds=args.warmup, max_tokens=args.max_tokens)
                results[name].append(
                    closed_loop(
                        server.url, clients=args.clients, seconds=args.seconds, max_tokens=args.max_tokens
                    )
                )
            runs.append(server.record)
    rows = {}
    for name, measured in results.items():
        rows[name] = _report(
            name,
            sum(t for t, _, _ in measured),
            sum(w for _, w, _ in measured),
            [f for _, _, fs in measured for f in fs],
        )
    a, b = rows["single process"], rows["Ray, 1 replica"]
    print(
        f"  Ray / single: {b['tok_s'] / a['tok_s']:.3f}x tok/s, "
        f"{b['ttft_median_ms'] - a['ttft_median_ms']:+.1f} ms median TTFT"
    )


def replicas_part(args: argparse.Namespace, runs: list[alone.Run]) -> None:
    """Two replicas: the closed loop, sequential two-turn chats, a grammar's cold compile."""
    rule = alone.quiet_rule(args)
    with _service("Ray, 2 replicas", "--replicas", "2", "--replica-cpus", "1", rule=rule) as ray2:
        _wait_answering(ray2)
        tokens, wall, firsts = closed_loop(
            ray2.url, clients=args.clients, seconds=args.seconds, max_tokens=args.max_tokens
        )
        _report(ray2.name, tokens, wall, firsts)
        same, cached = second_turns(ray2.url, chats=args.chats)
        print(
            f"  second turns on their first turn's replica: {same}/{args.chats}; from its prefix cache: {cached}/{args.chats} ({100 * cached / args.chats:.0f} %)"
        )
        cold, warm = cold_compile(ray2.url, tries=5)
        print(
            f"  new schema (compiled at the ingress and on the replica): {1000 * cold:.0f} ms; same schema again: {1000 * warm:.0f} ms (medians of 5)"
        )
    runs.append(ray2.record)


#: The parts ``--parts`` names, in their default order.
PARTS = {"overhead": overhead_part, "replicas": replicas_part, "concurrent": concurrent_part}


if __name__ == "__main__":
    sys.exit(main())
