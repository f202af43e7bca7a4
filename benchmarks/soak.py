"""Soak: memory over a long run of streaming clients against a real ``thinkstruct serve``.

Starts the server as its own process (the embedded SmolLM2 by default) with its memory
budgets set small enough to fill within the run (``--kv-cache-bytes``,
``--prefix-cache-bytes``, ``--grammar-cache-bytes``), warms it up, then runs
``--clients`` streaming clients for ``--duration`` seconds, each sending one request after
another from a fixed mix: JSON-schema answers over 16 real-world schemas (``strict``:
every answer that finishes with ``stop`` must validate), plain chat, and multi-turn chats
over a shared system prompt (each turn the conversation so far, the model's answers
included, four turns then a new chat: the prefix cache fills and evicts). A 429 is
honoured (the client waits ``Retry-After``) and counted.

Every ``--interval`` seconds it samples the server's RSS and ``/metrics`` (each budget's
bytes used and allowed, the KV pools' bytes). The *base* is what the server holds apart
from the budgets, measured after the warm-up: RSS minus the KV pools' bytes and the
grammar cache's; the *bound* is base + the KV budget + the prefix cache's + the grammar
cache's. Prints RSS over time (one row a minute), start / max / end, and a verdict per
target:

- zero 5xx, zero requests without an answer, every constrained answer valid;
- RSS within the bound at every sample;
- RSS flat at the end: it grew at most 2 % over the last quarter of the run.

    python benchmarks/soak.py [--duration 1200] [--clients 16] [--max-batch 16] [--kv-cache-bytes 384M]
        [--prefix-cache-bytes 256M] [--grammar-cache-bytes 128M]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

import alone
from load import QUESTIONS, Result, pct, pick_schemas, rss_bytes, server, streamed

#: What the clients send, by weight.
MIX = {"schema": 40, "chat": 30, "turn": 30}
#: Turns of a multi-turn chat before the client starts a new one.
TURNS = 4
SYSTEM = (
    "You are a concise assistant for a travel agency. Answer in one or two sentences, "
    "name concrete places, and never invent prices. "
) * 6
FOLLOW_UPS = ["Tell me more.", "Why is that?", "Give one example.", "Say it more simply."]
_MIB = 1 << 20


@dataclass
class Sample:
    """One sample: seconds since the run started, the server's RSS (alone and with its
    compile workers) and its ``/metrics`` memory gauges."""

    at: float
    rss: int
    rss_total: int
    gauges: dict[str, float]


async def memory_gauges(client: httpx.AsyncClient) -> dict[str, float]:
    """``thinkstruct_memory_{used,allowed}_bytes`` by budget and ``thinkstruct_kv_pool_bytes``."""
    text = (await client.get("/metrics")).text
    found = re.findall(r'^thinkstruct_memory_(used|allowed)_bytes\{budget="(\w+)"\} (\S+)$', text, re.M)
    gauges = {f"{budget}_{kind}": float(value) for kind, budget, value in found}
    pool = re.search(r"^thinkstruct_kv_pool_bytes (\S+)$", text, re.M)
    gauges["kv_pool"] = float(pool.group(1)) if pool else 0.0
    return gauges


async def client_loop(
    k: int, client: httpx.AsyncClient, stop_at: float, schemas: list[dict], model: str, out: list[Result]
) -> None:
    """One client: requests back to back until ``stop_at`` (monotonic)."""
    rng = random.Random(2000 + k)
    kinds, weights = zip(*MIX.items())
    chat: list[dict] = []
    while time.monotonic() < stop_at:
        kind = rng.choices(kinds, weights)[0]
        common = {
            "model": model,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": 96,
            "temperature": 0.7,
            "seed": rng.randrange(1 << 30),
            "chat_template_kwargs": {"enable_thinking": False},
        }
        schema = None
        if kind == "schema":
            schema = rng.choice(schemas)
            body = {
                **common,
                "messages": [{"role": "user", "content": f"{rng.choice(QUESTIONS)} Answer as JSON."}],
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "answer", "schema": schema, "strict": True},
                },
            }
        elif kind == "turn":
            if len(chat) >= 2 * TURNS + 1 or not chat:
                chat = [{"role": "system", "content": SYSTEM}]
            question = rng.choice(QUESTIONS) if len(chat) == 1 else rng.choice(FOLLOW_UPS)
            chat.append({"role": "user", "content": question})
            body = {**common, "messages": list(chat)}
        else:
            body = {**common, "messages": [{"role": "user", "content": rng.choice(QUESTIONS)}]}
        try:
            result = await streamed(client, kind, "/v1/chat/completions", body, schema)
        except httpx.HTTPError as e:
            result = Result(kind, -1, 0.0, detail=f"{type(e).__name__}: {e}")
        out.append(result)
        if kind == "turn":
            if result.status == 200:
                chat.append({"role": "assistant", "content": result.content})
            else:
                chat.pop()
        if result.status == 429:
            await asyncio.sleep(float(result.retry_after or 1))


async def run(args: argparse.Namespace) -> int:
    schemas = pick_schemas(16)
    print(f"{len(schemas)} schemas picked (strict, compile < 1 s)")
    print(alone.header())
    serve = server(args)
    limits = httpx.Limits(max_connections=args.clients + 8, max_keepalive_connections=args.clients + 8)
    samples: list[Sample] = []
    results: list[Result] = []
    with serve:
        proc = serve.proc
        if proc is None:
            raise RuntimeError("the server did not start")
        async with httpx.AsyncClient(
            base_url=serve.url, limits=limits, timeout=httpx.Timeout(300.0)
        ) as client:
            model = (await client.get("/v1/models")).json()["data"][0]["id"]
            warm: list[Result] = []
            warm_until = time.monotonic() + args.warmup
            await asyncio.gather(
                *(client_loop(k, client, warm_until, schemas, model, warm) for k in range(args.clients))
            )
            started = time.monotonic()
            stop_at = started + args.duration

            async def sample() -> None:
                while True:
                    own, total = rss_bytes(proc.pid)
                    samples.append(
                        Sample(time.monotonic() - started, own, total, await memory_gauges(client))
                    )
                    if time.monotonic() >= stop_at:
                        return
                    await asyncio.sleep(min(args.interval, max(0.0, stop_at - time.monotonic())))

            await asyncio.gather(
                sample(),
                *(client_loop(k, client, stop_at, schemas, model, results) for k in range(args.clients)),
            )
            elapsed = time.monotonic() - started
            health = (await client.get("/health")).status_code
    exit_code = proc.returncode  # after SIGTERM: 0 when it stopped gracefully
    return report(args, results, samples, elapsed, health, exit_code)


def report(
    args: argparse.Namespace,
    results: list[Result],
    samples: list[Sample],
    elapsed: float,
    health: int,
    exit_code: int,
) -> int:
    first, last = samples[0], samples[-1]
    g = first.gauges
    allowed = g["kv_cache_allowed"] + g["prefix_cache_allowed"] + g["grammar_cache_allowed"]
    base = first.rss - g["kv_pool"] - g["grammar_cache_used"]
    bound = base + allowed
    by_status: dict[int, int] = {}
    for r in results:
        by_status[r.status] = by_status.get(r.status, 0) + 1
    kinds: dict[str, int] = {}
    for r in results:
        kinds[r.kind] = kinds.get(r.kind, 0) + 1
    ok = [r for r in results if r.status == 200]
    five_xx = [r for r in results if r.status >= 500 or r.status < 0]
    unanswered = [r for r in results if not r.answered]
    constrained = [r for r in ok if r.valid is not None]
    invalid = [r for r in constrained if not r.valid]
    tokens = sum(r.tokens for r in ok)
    print(
        f"\n## soak: {args.clients} streaming clients for {elapsed:.0f} s (max batch {args.max_batch}, "
        f"{args.quantize}; kv {args.kv_cache_bytes}, prefix cache {args.prefix_cache_bytes}, "
        f"grammar cache {args.grammar_cache_bytes})"
    )
    print(
        "command: python benchmarks/soak.py "
        f"--duration {args.duration:g} --clients {args.clients} --max-batch {args.max_batch} "
        f"--kv-cache-bytes {args.kv_cache_bytes} --prefix-cache-bytes {args.prefix_cache_bytes} "
        f"--grammar-cache-bytes {args.grammar_cache_bytes} --quantize {args.quantize}"
    )
    print(f"requests sent               {len(results)} {kinds}")
    print(f"answers by status           {dict(sorted(by_status.items()))}")
    print(
        f"latency p50 / p99 (200s)    {pct([r.latency for r in ok], 0.5):.2f} s / {pct([r.latency for r in ok], 0.99):.2f} s"
    )
    print(f"tokens generated            {tokens} ({tokens / elapsed:.1f} tok/s)")
    print(f"constrained answers (stop)  {len(constrained)}, invalid {len(invalid)}")
    print(
        f"budgets (MiB)               kv {g['kv_cache_allowed'] / _MIB:.0f} + prefix cache "
        f"{g['prefix_cache_allowed'] / _MIB:.0f} + grammar cache {g['grammar_cache_allowed'] / _MIB:.0f}"
    )
    print(
        f"base (MiB)                  {base / _MIB:.0f} = RSS after warm-up {first.rss / _MIB:.0f} - KV pools "
        f"{g['kv_pool'] / _MIB:.0f} - grammar cache {g['grammar_cache_used'] / _MIB:.0f}"
    )
    print(f"bound (MiB)                 {bound / _MIB:.0f} = base + budgets")
    print("\n    min  RSS MiB  +workers  KV pools  reserved  prefix cache  grammar cache")
    shown = -60.0
    for s in samples:
        if s.at - shown >= 60.0 or s is last:
            shown = s.at
            sg = s.gauges
            print(
                f"  {s.at / 60:5.1f}  {s.rss / _MIB:7.0f}  {s.rss_total / _MIB:8.0f}  {sg['kv_pool'] / _MIB:8.0f}  "
                f"{sg['kv_cache_used'] / _MIB:8.0f}  {sg['prefix_cache_used'] / _MIB:12.0f}  "
                f"{sg['grammar_cache_used'] / _MIB:13.0f}"
            )
    peak = max(samples, key=lambda s: s.rss)
    quarter = next(s for s in samples if s.at >= 0.75 * last.at)
    growth = last.rss / quarter.rss - 1
    print(
        f"\nRSS start / max / end       {first.rss / _MIB:.0f} / {peak.rss / _MIB:.0f} (at {peak.at / 60:.1f} min) / "
        f"{last.rss / _MIB:.0f} MiB; bound {bound / _MIB:.0f} MiB"
    )
    print(f"RSS over the last quarter   {growth * 100:+.2f} %")
    print(f"health after / exit code    {health} / {exit_code}")
    checks = {
        "zero 5xx": not five_xx,
        "every request answered": not unanswered,
        "constrained answers valid": not invalid,
        f"RSS within base + budgets at every sample (max {peak.rss / _MIB:.0f} <= {bound / _MIB:.0f} MiB)": all(
            s.rss <= bound for s in samples
        ),
        f"RSS flat at the end ({growth * 100:+.2f} % over the last quarter, <= 2 %)": growth <= 0.02,
        "healthy after, clean exit": health == 200 and exit_code == 0,
    }
    for name, passed in checks.items():
        print(f"  [{'x' if passed else ' '}] {name}")
    for r in (five_xx + unanswered + invalid)[:10]:
        print(f"    {r.kind} {r.status} {r.finish} {r.detail}")
    return 0 if all(checks.values()) else 1


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--duration", type=float, default=1200.0, help="seconds of the measured run")
    parser.add_argument("--warmup", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--max-queue", type=int, default=256)
    parser.add_argument("--prefill-chunk", type=int, default=None, help="default: the server's")
    parser.add_argument("--quantize", default="int8-weights", help="serve's --quantize")
    parser.add_argument("--model", default=None)
    parser.add_argument("--kv-cache-bytes", default="384M")
    parser.add_argument("--prefix-cache-bytes", default="256M")
    parser.add_argument("--grammar-cache-bytes", default="128M")
    alone.add_arguments(parser)
    args = parser.parse_args()
    sys.exit(asyncio.run(run(args)))


if __name__ == "__main__":
    main()
