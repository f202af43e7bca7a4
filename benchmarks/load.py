"""Load: many concurrent streaming clients against a real ``thinkstruct serve`` on loopback.

Starts the server as its own process once the machine is quiet (``alone.py``; the
embedded SmolLM2 by default), warms it up, then
lets ``--clients`` concurrent clients join one by one over ``--ramp`` seconds (a load
test's spawn rate; 0 starts them all at once) and run for ``--duration`` seconds more. Each client sends one
request after another, drawn from a fixed mix: JSON-schema answers over 16 real-world
schemas (``strict: true``, so every answer that finishes with ``stop`` must validate),
plain chat, chat with reasoning on, code completion with a suffix (FIM; a 400 on a model
without a completion template, which is the right answer), and a share of hostile
requests that must each get a 4xx with an OpenAI error object.

Prints requests sent, answers by status, latency and time-to-first-token percentiles,
tokens/s, peak RSS, and a verdict per target:

- zero 5xx and zero requests without an answer;
- every constrained answer that finished with ``stop`` validates against its schema;
- RSS after the run within 20 % of RSS after warm-up;
- p99 time to first token of simple requests (plain chat) <= 2 s, over the requests sent
  after the ramp (printed with the ramp too).

    python benchmarks/load.py [--clients 64] [--ramp 10] [--duration 60] [--max-batch 64] [--quantize int8-weights]
        [--prefill-chunk N] [--kv-cache-bytes B] [--prefix-cache-bytes B] [--grammar-cache-bytes B]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import jsonschema
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

import alone
from maskbench_sample import load_maskbench

#: What the clients send, by weight.
MIX = {"schema": 40, "chat": 20, "reasoning": 12, "fim": 5, "hostile": 23}

QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "Give me a short tip for learning to cook.",
    "What is 12 times 7?",
    "Say hello in Spanish.",
    "Describe the sea in one sentence.",
    "Suggest a name for a cat.",
    "What do bees make?",
]


def hostile_requests() -> list[tuple[str, bytes | None, dict]]:
    """(label, raw body or None, JSON body) of requests that must be refused with a 4xx."""
    msg = [{"role": "user", "content": "hi"}]
    # The model id is left out on purpose in most: each case must fail on its own defect
    # first or on the missing model, a 400 either way.
    return [
        ("malformed JSON", b'{"model": "x", "messages": [', {}),
        ("invalid UTF-8", b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', {}),
        ("empty messages", None, {"messages": []}),
        ("wrong type", None, {"messages": "hello"}),
        ("negative max_tokens", None, {"messages": msg, "max_tokens": -5}),
        ("huge max_tokens", None, {"messages": msg, "max_tokens": 10**9}),
        ("huge n", None, {"messages": msg, "n": 100000}),
        ("temperature NaN", b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', {}),
        ("unknown model", None, {"model": "no-such-model", "messages": msg}),
        (
            "unsatisfiable schema",
            None,
            {
                "messages": msg,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "x",
                        "schema": {"type": "string", "minLength": 10, "maxLength": 2},
                    },
                },
            },
        ),
        (
            "dangling $ref",
            None,
            {
                "messages": msg,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"$ref": "#/$defs/missing"}},
                },
            },
        ),
        ("unbalanced regex", None, {"messages": msg, "regex": "(ab[c"}),
        ("undefined EBNF rule", None, {"messages": msg, "ebnf": "root ::= foo"}),
        ("lone surrogate", b'{"messages": [{"role": "user", "content": "\\ud800"}]}', {}),
        ("10 MB prompt", None, {"messages": [{"role": "user", "content": "a " * 5_000_000}]}),
    ]


@dataclass
class Result:
    kind: str
    status: int
    latency: float
    ttft: float | None = None
    tokens: int = 0
    finish: str | None = None
    answered: bool = False
    valid: bool | None = None
    detail: str = ""
    #: When it was sent (``time.monotonic()``).
    sent_at: float = 0.0
    #: The answer's text (a stream's content deltas joined).
    content: str = ""
    #: A refusal's ``Retry-After`` header.
    retry_after: str | None = None


def pick_schemas(count: int) -> list[dict]:
    """``count`` schemas of the sample that compile exactly (strict) and quickly."""
    from thinkstruct import Constraint, Tokenizer
    from thinkstruct.grammar.service.compiler import CompilerConfig, GrammarCompiler
    from thinkstruct.tokenizer import smollm2_gguf_path

    tok = Tokenizer.from_pretrained(smollm2_gguf_path())
    chosen: list[dict] = []
    rng = random.Random(7)
    sample = list(load_maskbench())
    rng.shuffle(sample)
    with GrammarCompiler(tok, CompilerConfig(strict=True, timeout_s=5)) as compiler:
        for item in sample:
            schema = json.loads(item.schema)
            if not isinstance(schema, dict) or len(item.schema) > 4000:
                continue
            try:
                started = time.perf_counter()
                compiler.compile(Constraint.json_schema(schema))
                if time.perf_counter() - started < 1.0:
                    chosen.append(schema)
            except Exception:
                continue
            if len(chosen) == count:
                break
    return chosen


def server(args: argparse.Namespace) -> alone.Server:
    """``thinkstruct serve`` with the options of ``args``, as a side (enter it to start it
    once the machine is quiet)."""
    port = alone.free_port()
    cmd = [
        sys.executable,
        "-m",
        "thinkstruct.cli",
        "serve",
        "--port",
        str(port),
        "--max-batch",
        str(args.max_batch),
        "--max-queue",
        str(args.max_queue),
        "--log-level",
        "warning",
    ]
    if args.quantize:
        cmd += ["--quantize", args.quantize]
    if args.prefill_chunk:
        cmd += ["--prefill-chunk", str(args.prefill_chunk)]
    if args.model:
        cmd += ["--model", args.model]
    for flag in ("kv_cache_bytes", "prefix_cache_bytes", "grammar_cache_bytes"):
        value = getattr(args, flag, None)
        if value:
            cmd += [f"--{flag.replace('_', '-')}", value]
    return alone.Server("serve", cmd, port=port, rule=alone.quiet_rule(args))


def rss_bytes(pid: int) -> tuple[int, int]:
    """(server process RSS, server + compile workers RSS)."""
    proc = psutil.Process(pid)
    own = proc.memory_info().rss
    children = sum(c.memory_info().rss for c in proc.children(recursive=True) if c.is_running())
    return own, own + children


def body_for(kind: str, rng: random.Random, schemas: list[dict], model: str) -> tuple[str, dict, dict | None]:
    """(path, JSON body, schema to validate against) of one request of ``kind``."""
    question = rng.choice(QUESTIONS)
    common = {
        "model": model,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 96,
        "temperature": 0.7,
        "seed": rng.randrange(1 << 30),
    }
    if kind == "schema":
        schema = rng.choice(schemas)
        return (
            "/v1/chat/completions",
            {
                **common,
                "messages": [{"role": "user", "content": f"{question} Answer as JSON."}],
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "answer", "schema": schema, "strict": True},
                },
                "chat_template_kwargs": {"enable_thinking": False},
            },
            schema,
        )
    if kind == "reasoning":
        return (
            "/v1/chat/completions",
            {
                **common,
                "messages": [{"role": "user", "content": question}],
                "chat_template_kwargs": {"enable_thinking": True},
                "max_reasoning_tokens": 48,
            },
            None,
        )
    if kind == "fim":
        return (
            "/v1/completions",
            {**common, "prompt": "def add(a, b):\n    ", "suffix": "\n\nprint(add(1, 2))\n"},
            None,
        )
    return (
        "/v1/chat/completions",
        {
            **common,
            "messages": [{"role": "user", "content": question}],
            "chat_template_kwargs": {"enable_thinking": False},
        },
        None,
    )


async def streamed(
    client: httpx.AsyncClient, kind: str, path: str, body: dict, schema: dict | None
) -> Result:
    started = time.perf_counter()
    result = Result(kind, 0, 0.0)
    content: list[str] = []
    async with client.stream("POST", path, json=body) as response:
        result.status = response.status_code
        if response.status_code != 200:
            await response.aread()
            result.answered = _is_error_object(response.content)
            result.retry_after = response.headers.get("retry-after")
            result.detail = response.text[:200]
        else:
            done = False
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: ") :]
                if data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                if chunk.get("usage"):
                    result.tokens = chunk["usage"].get("completion_tokens", 0)
                for choice in chunk.get("choices", []):
                    delta = choice.get("delta") or {}
                    text = delta.get("content") or choice.get("text") or ""
                    if (text or delta.get("reasoning_content")) and result.ttft is None:
                        result.ttft = time.perf_counter() - started
                    content.append(text)
                    if choice.get("finish_reason"):
                        result.finish = choice["finish_reason"]
            result.answered = done and result.finish is not None
    result.latency = time.perf_counter() - started
    result.content = "".join(content)
    if schema is not None and result.finish == "stop":
        try:
            jsonschema.validate(json.loads(result.content), schema)
            result.valid = True
        except (ValueError, jsonschema.ValidationError) as e:
            result.valid = False
            result.detail = str(e)[:200]
    return result


async def hostile(client: httpx.AsyncClient, rng: random.Random, cases: list) -> Result:
    label, raw, body = rng.choice(cases)
    started = time.perf_counter()
    if raw is not None:
        response = await client.post(
            "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
        )
    else:
        response = await client.post("/v1/chat/completions", json=body)
    result = Result(f"hostile: {label}", response.status_code, time.perf_counter() - started)
    result.answered = 400 <= response.status_code < 500 and _is_error_object(response.content)
    result.detail = response.text[:200]
    return result


def _is_error_object(raw: bytes) -> bool:
    try:
        error = json.loads(raw)["error"]
        return isinstance(error.get("message"), str) and "type" in error
    except (ValueError, KeyError, TypeError, AttributeError):
        return False


async def client_loop(
    k: int,
    client: httpx.AsyncClient,
    stop_at: float,
    schemas: list[dict],
    model: str,
    out: list[Result],
    *,
    start_at: float = 0.0,
) -> None:
    """One client: requests back to back from ``start_at`` until ``stop_at`` (monotonic)."""
    rng = random.Random(1000 + k)
    kinds, weights = zip(*MIX.items())
    cases = hostile_requests()
    await asyncio.sleep(max(0.0, start_at - time.monotonic()))
    while time.monotonic() < stop_at:
        kind = rng.choices(kinds, weights)[0]
        sent = len(out)
        sent_at = time.monotonic()
        try:
            if kind == "hostile":
                out.append(await hostile(client, rng, cases))
            else:
                path, body, schema = body_for(kind, rng, schemas, model)
                out.append(await streamed(client, kind, path, body, schema))
        except httpx.HTTPError as e:
            out.append(Result(kind, -1, 0.0, detail=f"{type(e).__name__}: {e}"))
        for r in out[sent:]:
            r.sent_at = sent_at


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(args: argparse.Namespace) -> int:
    schemas = pick_schemas(16)
    print(f"{len(schemas)} schemas picked (strict, compile < 1 s)")
    print(alone.header())
    serve = server(args)
    limits = httpx.Limits(max_connections=args.clients + 8, max_keepalive_connections=args.clients + 8)
    timeout = httpx.Timeout(300.0)
    with serve:
        proc = serve.proc
        if proc is None:
            raise RuntimeError("the server did not start")
        async with httpx.AsyncClient(base_url=serve.url, limits=limits, timeout=timeout) as client:
            model = (await client.get("/v1/models")).json()["data"][0]["id"]
            warm: list[Result] = []
            warm_until = time.monotonic() + args.warmup
            await asyncio.gather(
                *(client_loop(k, client, warm_until, schemas, model, warm) for k in range(8))
            )
            rss_warm = rss_bytes(proc.pid)
            results: list[Result] = []
            peak = list(rss_warm)
            stop_at = time.monotonic() + args.ramp + args.duration

            async def sample_rss() -> None:
                while time.monotonic() < stop_at:
                    own, total = rss_bytes(proc.pid)
                    peak[0], peak[1] = max(peak[0], own), max(peak[1], total)
                    await asyncio.sleep(1.0)

            started = time.monotonic()
            # Clients join one by one over the ramp (a load test's spawn rate), then all
            # run for the duration; the targets are read on what was sent after the ramp.
            steady_from = started + args.ramp
            await asyncio.gather(
                sample_rss(),
                *(
                    client_loop(
                        k, client, stop_at, schemas, model, results,
                        start_at=started + args.ramp * k / args.clients,
                    )
                    for k in range(args.clients)
                ),
            )  # fmt: skip
            elapsed = time.monotonic() - started
            rss_after = rss_bytes(proc.pid)
            health = (await client.get("/health")).status_code
    exit_code = proc.returncode  # after SIGTERM: 0 when it stopped gracefully
    return report(args, results, elapsed, rss_warm, rss_after, peak, health, exit_code, steady_from)


def report(
    args,
    results: list[Result],
    elapsed: float,
    rss_warm,
    rss_after,
    peak,
    health: int,
    exit_code: int,
    steady_from: float,
) -> int:
    by_status: dict[int, int] = {}
    for r in results:
        by_status[r.status] = by_status.get(r.status, 0) + 1
    ok = [r for r in results if r.status == 200]
    ramp_ttft = [r.ttft for r in ok if r.kind == "chat" and r.ttft is not None]
    simple_ttft = [r.ttft for r in ok if r.kind == "chat" and r.ttft is not None and r.sent_at >= steady_from]
    all_ttft = [r.ttft for r in ok if r.ttft is not None]
    latency = [r.latency for r in ok]
    tokens = sum(r.tokens for r in ok)
    five_xx = [r for r in results if r.status >= 500 or r.status < 0]
    unanswered = [r for r in results if not r.answered]
    constrained = [r for r in ok if r.valid is not None]
    invalid = [r for r in constrained if not r.valid]
    mib = 1 << 20
    print(
        f"\n## load: {args.clients} streaming clients for {elapsed:.0f} s (max batch {args.max_batch}, "
        f"{args.quantize})"
    )
    print(f"requests sent               {len(results)}")
    print(f"answers by status           {dict(sorted(by_status.items()))}")
    kinds: dict[str, int] = {}
    for r in results:
        kinds[r.kind.split(":")[0]] = kinds.get(r.kind.split(":")[0], 0) + 1
    print(f"requests by kind            {kinds}")
    print(f"latency p50 / p99 (200s)    {pct(latency, 0.5):.2f} s / {pct(latency, 0.99):.2f} s")
    print(f"TTFT p50 / p99, all         {pct(all_ttft, 0.5):.2f} s / {pct(all_ttft, 0.99):.2f} s")
    print(
        f"TTFT p50 / p99, plain chat  {pct(simple_ttft, 0.5):.2f} s / {pct(simple_ttft, 0.99):.2f} s (after the ramp)"
    )
    print(f"  with the ramp             {pct(ramp_ttft, 0.5):.2f} s / {pct(ramp_ttft, 0.99):.2f} s")
    print(f"tokens generated            {tokens} ({tokens / elapsed:.1f} tok/s)")
    print(f"constrained answers (stop)  {len(constrained)}, invalid {len(invalid)}")
    print(
        f"RSS server after warm-up    {rss_warm[0] / mib:.0f} MiB (with compile workers {rss_warm[1] / mib:.0f})"
    )
    print(
        f"RSS server after the run    {rss_after[0] / mib:.0f} MiB (with compile workers {rss_after[1] / mib:.0f})"
    )
    print(f"RSS server peak             {peak[0] / mib:.0f} MiB (with compile workers {peak[1] / mib:.0f})")
    print(f"health after / exit code    {health} / {exit_code}")
    growth = rss_after[0] / rss_warm[0]
    checks = {
        "zero 5xx": not five_xx,
        "every request answered": not unanswered,
        "constrained answers valid": not invalid,
        f"RSS within 20 % of warm-up ({growth:.2f}x)": growth <= 1.2,
        f"p99 TTFT plain chat <= 2 s ({pct(simple_ttft, 0.99):.2f} s)": pct(simple_ttft, 0.99) <= 2.0,
        "healthy after, clean exit": health == 200 and exit_code == 0,
    }
    for name, passed in checks.items():
        print(f"  [{'x' if passed else ' '}] {name}")
    for r in (five_xx + unanswered + invalid)[:10]:
        print(f"    {r.kind} {r.status} {r.finish} {r.detail}")
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=15.0)
    parser.add_argument(
        "--ramp", type=float, default=10.0, help="seconds over which the clients join (0: all at once)"
    )
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--max-queue", type=int, default=256)
    parser.add_argument("--prefill-chunk", type=int, default=None, help="default: the server's")
    parser.add_argument(
        "--quantize", default="int8-weights", help="serve's --quantize (default int8-weights)"
    )
    parser.add_argument("--model", default=None)
    parser.add_argument(
        "--kv-cache-bytes", default=None, help="serve's --kv-cache-bytes (default: its default)"
    )
    parser.add_argument("--prefix-cache-bytes", default=None, help="serve's --prefix-cache-bytes")
    parser.add_argument("--grammar-cache-bytes", default=None, help="serve's --grammar-cache-bytes")
    alone.add_arguments(parser)
    args = parser.parse_args()
    sys.exit(asyncio.run(run(args)))


if __name__ == "__main__":
    main()
