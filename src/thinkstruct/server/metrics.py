"""``GET /metrics``: Prometheus counters and histograms of one server.

Each app has its own registry (tests run several servers in one process). The server
counts what it sees (requests by endpoint and status, tokens, latencies, compile waits,
backends chosen); the engine's and the compiler's own counters (queue length, batch
size, cache hits and misses, compile seconds, timeouts, jump-forward tokens) are read
from ``engine.stats`` and ``engine.compiler.stats`` at each scrape, and each memory
budget as two gauges labelled by ``budget`` (``kv_cache``: the running requests'
reserved keys and values; ``prefix_cache``; ``grammar_cache``):
``thinkstruct_memory_used_bytes`` and ``thinkstruct_memory_allowed_bytes``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

if TYPE_CHECKING:
    from thinkstruct.engine import Engine, Usage

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)
_COMPILE_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0)


class ServerMetrics:
    """The metrics of one server; ``render()`` is the ``/metrics`` body."""

    def __init__(self, engine: Callable[[], Engine | None]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "thinkstruct_http_requests",
            "HTTP requests answered, by endpoint and status",
            ["endpoint", "status"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "thinkstruct_prompt_tokens", "Prompt tokens of finished requests", registry=r
        )
        self.completion_tokens = Counter("thinkstruct_completion_tokens", "Tokens generated", registry=r)
        self.reasoning_tokens = Counter(
            "thinkstruct_reasoning_tokens", "Tokens generated inside a thought", registry=r
        )
        self.ttft = Histogram(
            "thinkstruct_time_to_first_token_seconds",
            "Time from submit to the first token",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.per_token = Histogram(
            "thinkstruct_time_per_output_token_seconds",
            "Mean time between generated tokens after the first, per request",
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "thinkstruct_request_duration_seconds",
            "Time from submit to the last token",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.compile_wait = Histogram(
            "thinkstruct_grammar_compile_wait_seconds",
            "Time a request waited for its compiled grammar (cache hits included)",
            buckets=_COMPILE_BUCKETS,
            registry=r,
        )
        self.compile_failures = Counter(
            "thinkstruct_grammar_compile_failures",
            "Constraints refused (invalid, unenforceable or timed out)",
            registry=r,
        )
        self.backend_chosen = Counter(
            "thinkstruct_grammar_backend_chosen",
            "Compiled grammars handed to requests, by backend",
            ["backend"],
            registry=r,
        )
        r.register(_EngineCollector(engine))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def observe_request(self, endpoint: str, status: int) -> None:
        self.requests.labels(endpoint=endpoint, status=str(status)).inc()

    def observe_compile(self, seconds: float, *, backend: str | None, failed: bool) -> None:
        self.compile_wait.observe(seconds)
        if failed:
            self.compile_failures.inc()
        elif backend:
            self.backend_chosen.labels(backend=backend).inc()

    def observe_finished(self, usage: Usage | None, *, started: float) -> None:
        """Count one engine request that ended (``started``: its ``perf_counter`` at submit)."""
        elapsed = time.perf_counter() - started
        if usage is not None and usage.total_s is not None:
            elapsed = usage.total_s
        self.e2e.observe(elapsed)
        if usage is None:
            return
        self.prompt_tokens.inc(usage.prompt_tokens)
        self.completion_tokens.inc(usage.completion_tokens)
        self.reasoning_tokens.inc(usage.reasoning_tokens)
        ttft = usage.time_to_first_token_s
        if ttft is not None:
            self.ttft.observe(ttft)
            if usage.completion_tokens > 1:
                self.per_token.observe(max(0.0, elapsed - ttft) / (usage.completion_tokens - 1))


# engine.stats fields: (metric name, help, counter?). Levels are gauges, totals counters.
_ENGINE_FIELDS = (
    ("waiting", "thinkstruct_queue_length", "Requests waiting for a batch slot", False),
    ("running", "thinkstruct_running_requests", "Requests in the running batch", False),
    ("last_batch", "thinkstruct_batch_size", "Rows of the last decoding step", False),
    ("largest_batch", "thinkstruct_batch_size_max", "Rows of the largest decoding step so far", False),
    (
        "batch_limit",
        "thinkstruct_batch_limit",
        "Requests the batch takes now: what the step latency target gives, within --max-batch",
        False,
    ),
    (
        "prefill_chunk",
        "thinkstruct_prefill_chunk",
        "Prompt tokens a prefill pass beside running requests computes now (the step latency target's)",
        False,
    ),
    ("last_step_s", "thinkstruct_last_step_seconds", "Seconds of the last decoding step", False),
    ("steps", "thinkstruct_engine_steps", "Decoding steps run", True),
    ("step_seconds", "thinkstruct_engine_step_seconds", "Seconds spent in decoding steps", True),
    ("prefill_tokens", "thinkstruct_engine_prefill_tokens", "Prompt tokens prefilled", True),
    (
        "prefix_reused_tokens",
        "thinkstruct_engine_prefix_reused_tokens",
        "Prompt tokens copied from a slot holding the same prefix instead of computed",
        True,
    ),
    (
        "prefix_cache_hit_tokens",
        "thinkstruct_engine_prefix_cache_hit_tokens",
        "Prompt tokens taken from the prefix cache of finished requests instead of computed",
        True,
    ),
    (
        "prefix_cache_bytes",
        "thinkstruct_prefix_cache_bytes",
        "Bytes of keys and values the prefix cache holds",
        False,
    ),
    ("prefix_cache_blocks", "thinkstruct_prefix_cache_blocks", "Token blocks the prefix cache holds", False),
    (
        "kv_pool_bytes",
        "thinkstruct_kv_pool_bytes",
        "Bytes of the KV pools ever used: the memory they take (at most the KV and prefix cache budgets)",
        False,
    ),
    (
        "kv_refused",
        "thinkstruct_engine_kv_refused",
        "Requests refused (429) because the running and waiting ones needed the KV budget twice over",
        True,
    ),
    (
        "prefix_cache_evicted_blocks",
        "thinkstruct_prefix_cache_evicted_blocks",
        "Token blocks the prefix cache evicted to stay within its budget",
        True,
    ),
    (
        "check_rollbacks",
        "thinkstruct_engine_check_rollbacks",
        "Values that broke a checked keyword and were generated again",
        True,
    ),
    (
        "resampled_tokens",
        "thinkstruct_engine_resampled_tokens",
        "Tokens taken back after a value broke a checked keyword (never sent)",
        True,
    ),
    (
        "draft_tokens",
        "thinkstruct_engine_draft_tokens",
        "Speculative draft tokens fed for verification (n-gram drafts, with the tokens the grammar forces within them)",
        True,
    ),
    (
        "accepted_draft_tokens",
        "thinkstruct_engine_accepted_draft_tokens",
        "Speculative draft tokens kept (a kept token the grammar did not force is a decoding pass saved)",
        True,
    ),
    ("generated_tokens", "thinkstruct_engine_generated_tokens", "Tokens generated (all requests)", True),
    (
        "jump_forward_tokens",
        "thinkstruct_engine_jump_forward_tokens",
        "Tokens forced by grammar jump-forward",
        True,
    ),
)

#: The engine's counters by label: (field, metric name, documentation, label).
_ENGINE_LABELLED = (
    (
        "finished",
        "thinkstruct_engine_finished",
        "Engine requests finished, by finish reason",
        "finish_reason",
    ),
    (
        "checks_unmet",
        "thinkstruct_engine_checks_unmet",
        "Requests that ended because their answer could not meet a checked keyword (422 constraint_unmet), by keyword",
        "keyword",
    ),
)

#: The engine's fields exported as counters (they only grow): a cluster's service totals
#: keep a removed replica's counts in these (``cluster/stats_board.py``).
ENGINE_COUNTERS = frozenset(
    {
        *(attr for attr, _, _, _ in _ENGINE_LABELLED),
        *(attr for attr, _, _, counter in _ENGINE_FIELDS if counter),
    }
)

# compiler.stats fields exported as gauges; the rest only grow.
_COMPILER_GAUGES = {"entries", "bytes"}

#: The memory budgets read from engine.stats: (label, field held, field allowed).
_ENGINE_BUDGETS = (
    ("kv_cache", "kv_cache_reserved_bytes", "kv_cache_allowed_bytes"),
    ("prefix_cache", "prefix_cache_bytes", "prefix_cache_allowed_bytes"),
)


class _EngineCollector(Collector):
    """Reads the engine's and the compiler's counters at scrape time."""

    def __init__(self, engine: Callable[[], Engine | None]) -> None:
        self._engine = engine

    def describe(self) -> list[Metric]:
        return []  # collected fresh at every scrape

    def collect(self) -> Iterator[Metric]:
        engine = self._engine()
        ready = GaugeMetricFamily(
            "thinkstruct_engine_ready", "1 when the model is loaded and the engine running"
        )
        ready.add_metric([], 1.0 if engine is not None and engine.running else 0.0)
        yield ready
        if engine is None:
            return
        stats = engine.stats
        for attr, name, doc, counter in _ENGINE_FIELDS:
            value = getattr(stats, attr, None)
            if isinstance(value, (int, float)):
                yield _family(name, doc, float(value), counter=counter)
        for attr, name, doc, label in _ENGINE_LABELLED:
            counts = getattr(stats, attr, None)
            if isinstance(counts, dict):
                family = CounterMetricFamily(name, doc, labels=[label])
                for key, count in sorted(counts.items()):
                    family.add_metric([str(key)], float(count))
                yield family
        compiler = engine.compiler
        for name, value in _numbers(compiler.stats).items():
            yield _family(
                f"thinkstruct_grammar_{name}",
                f"Grammar compiler: {name}",
                value,
                counter=name not in _COMPILER_GAUGES,
            )
        used = GaugeMetricFamily(
            "thinkstruct_memory_used_bytes",
            "Bytes held against each memory budget (kv_cache: what the running requests reserved)",
            labels=["budget"],
        )
        allowed = GaugeMetricFamily(
            "thinkstruct_memory_allowed_bytes", "Bytes each memory budget allows", labels=["budget"]
        )
        budgets = [
            (label, getattr(stats, held), getattr(stats, most)) for label, held, most in _ENGINE_BUDGETS
        ]
        budgets.append(("grammar_cache", compiler.stats.bytes, compiler.config.cache_bytes))
        for label, held_bytes, allowed_bytes in budgets:
            used.add_metric([label], float(held_bytes))
            allowed.add_metric([label], float(allowed_bytes))
        yield used
        yield allowed


def _numbers(stats: Any) -> dict[str, float]:
    """The numeric fields of a stats object (a dataclass, or one with ``snapshot()``)."""
    if hasattr(stats, "snapshot"):
        raw = stats.snapshot()
    elif dataclasses.is_dataclass(stats) and not isinstance(stats, type):
        raw = dataclasses.asdict(stats)
    else:
        raw = dict(vars(stats))
    return {
        k: float(v)
        for k, v in raw.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not k.startswith("_")
    }


def _family(name: str, documentation: str, value: float, *, counter: bool) -> Metric:
    family: CounterMetricFamily | GaugeMetricFamily
    if counter:
        family = CounterMetricFamily(name, documentation)
    else:
        family = GaugeMetricFamily(name, documentation)
    family.add_metric([], value)
    return family


class RequestCounter:
    """ASGI middleware counting every answered HTTP request by endpoint and status
    (401s and 404s included). Paths that are not endpoints count as ``other``, so a
    scanner cannot grow the label set."""

    def __init__(self, app: ASGIApp, *, metrics: ServerMetrics, endpoints: frozenset[str]) -> None:
        self.app = app
        self._metrics = metrics
        self._endpoints = endpoints

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        endpoint = path if path in self._endpoints else "other"
        status = 500  # if the app fails before it answers, uvicorn answers 500

        async def counting_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            self._metrics.observe_request(endpoint, status)
