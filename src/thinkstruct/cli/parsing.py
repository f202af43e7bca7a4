"""The command line's arguments: :func:`build_parser` (the ``check``, ``serve`` and
``generate`` subcommands and their options, every default read from the config it sets),
the option types, and what parsed options ask for (:func:`engine_spec`,
:func:`usage_problem`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from thinkstruct.engine.assembly import EngineSpec
from thinkstruct.engine.core.config import KV_CACHE_DTYPES, EngineConfig
from thinkstruct.engine.core.thinking_budget import DEFAULT_REASONING_SHARE, check_reasoning_share
from thinkstruct.engine.model.loading import DTYPES
from thinkstruct.grammar.backends import BACKEND_NAMES
from thinkstruct.grammar.service.config import CompilerConfig, check_backend_name
from thinkstruct.server.cluster.affinity import Bounds
from thinkstruct.server.response_store import StoreLimits
from thinkstruct.server.settings import ServerSettings

# Every default below is read from the config it sets (one place for each): the engine's,
# the compiler's and the server's dataclasses.
_ENGINE = EngineConfig()
_COMPILER = CompilerConfig()
_SERVER = ServerSettings()
_SPEC = EngineSpec()
_BOUNDS = Bounds()


def build_parser(description: str) -> argparse.ArgumentParser:
    """The ``thinkstruct`` command's parser (``description``: its help text)."""
    parser = argparse.ArgumentParser(prog="thinkstruct", description=description)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_check(sub)
    _add_serve(sub)
    _add_generate(sub)
    return parser


def _add_check(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    check = sub.add_parser(
        "check",
        help="compile a JSON schema with each backend and test answer files against it",
        description=(
            "For each backend: whether SCHEMA_FILE compiles and how long it took; then, for "
            "each TEXT_FILE, whether it is accepted as a complete answer or the character "
            "offset where it is rejected. auto is the server's strict choice: the backend it "
            "picks and each keyword no grammar enforces, checked as values close (a text "
            "must pass those checks too). Exit status 0 if every backend asked for compiles "
            "and every text is accepted, 1 otherwise, 2 for a usage error."
        ),
    )
    check.add_argument("schema_file", type=Path)
    check.add_argument("text_files", type=Path, nargs="*")
    check.add_argument(
        "--backend",
        default="all",
        help="xgrammar, llguidance, outlines, auto (strict) or all of them (default: all)",
    )
    check.add_argument("--tokenizer", type=Path, help="tokenizer directory or .gguf (default: DeepSeek-V4)")
    check.add_argument(
        "--max-whitespace",
        type=int,
        default=None,
        help="longest whitespace run allowed between JSON tokens (default 2)",
    )


# ---- serve / generate -------------------------------------------------------------------


def _add_model_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model and engine")
    g.add_argument(
        "--model",
        type=Path,
        default=None,
        help="local Hugging Face model directory or .gguf file (default: the embedded SmolLM2-135M-Instruct)",
    )
    g.add_argument(
        "--reasoning-parser",
        metavar="FAMILY",
        default=None,
        help="reasoning family of the model (default: detected from the model)",
    )
    g.add_argument(
        "--dtype",
        default=_SPEC.dtype,
        choices=DTYPES,
        help=f"weights and activations with --quantize none (default {_SPEC.dtype}); quantized models "
        "compute in float32",
    )
    g.add_argument(
        "--quantize",
        default=_SPEC.quantize or "none",
        choices=("auto", "gguf", "int8-weights", "int8", "none"),
        help="Linear layers: gguf (a GGUF's own Q4_0/Q4_1/Q8_0 blocks on the compiled CPU kernels, "
        "activations rounded to int16 per block of 32), int8-weights (int8 weights, float activations, as close to float32 as "
        "bfloat16), int8 (activations too) or none; auto (default): gguf for a GGUF whose blocks "
        "the kernels run, otherwise int8-weights",
    )
    g.add_argument(
        "--max-batch",
        type=_positive_int,
        default=_ENGINE.max_batch,
        metavar="N",
        help=f"most requests decoded together, a hard cap: below it the batch follows "
        f"--step-latency-target-ms (default {_ENGINE.max_batch})",
    )
    g.add_argument(
        "--step-latency-target-ms",
        type=_non_negative_float,
        default=_seconds_to_ms(_ENGINE.step_latency_target_s),
        metavar="MS",
        help="milliseconds a decoding step (each running request's time per token) should take: requests "
        "join the batch while steps stay within it and the KV budget holds them, up to --max-batch, and a "
        "prefill pass beside running requests computes as many prompt tokens as fit it (up to "
        f"--prefill-chunk); 0 keeps --max-batch rows (default {_seconds_to_ms(_ENGINE.step_latency_target_s):g})",
    )
    g.add_argument(
        "--prefill-chunk",
        type=_positive_int,
        default=None,
        metavar="N",
        help="most prompt tokens computed in one prefill pass between decoding steps; fewer beside running "
        f"requests where --step-latency-target-ms asks (default {_ENGINE.prefill_chunk})",
    )
    g.add_argument(
        "--kv-cache-bytes",
        type=_kv_cache_size,
        default=_ENGINE.kv_cache_bytes,
        metavar="BYTES",
        help="most bytes of keys and values the running requests reserve together: each reserves what "
        "its prompt and max_tokens can come to when it starts, waits while that does not fit, and a request "
        "arriving while those running and waiting need twice this gets 429 with Retry-After (e.g. 512M, 2G; "
        f"default {_ENGINE.kv_cache_bytes >> 20}M). The prefix cache has its own budget, --prefix-cache-bytes",
    )
    g.add_argument(
        "--kv-cache-dtype",
        choices=KV_CACHE_DTYPES,
        default=None,
        help="what the KV cache holds (default: float16 where the compiled CPU kernels run the model: half "
        "the bytes attention reads, twice the positions a budget holds; else the model's dtype)",
    )
    g.add_argument(
        "--prefix-cache-bytes",
        type=_byte_size,
        default=_ENGINE.prefix_cache_bytes,
        metavar="BYTES",
        help="most bytes of finished requests' keys and values kept for requests that start the same way, "
        f"a chat's next turn (0 keeps none; default {_ENGINE.prefix_cache_bytes >> 20}M)",
    )
    g.add_argument(
        "--grammar-cache-bytes",
        type=_positive_byte_size,
        default=_COMPILER.cache_bytes,
        metavar="BYTES",
        help=f"most bytes of compiled grammars kept, as measured (default {_COMPILER.cache_bytes >> 20}M)",
    )
    g.add_argument(
        "--speculate",
        choices=("ngram", "off"),
        default="ngram",
        help="speculative decoding from n-gram drafts of the prompt and answer so far, built through "
        "the grammar and cut where they pay, verified in the decoding pass (same tokens as without, "
        "on int8 weights or GGUF blocks; only while a few requests decode); default ngram",
    )
    g.add_argument(
        "--max-queue",
        type=_positive_int,
        default=_ENGINE.max_queue,
        metavar="N",
        help=f"requests waiting beyond the batch before new ones get 429 (default {_ENGINE.max_queue})",
    )
    g.add_argument(
        "--backend",
        default=_COMPILER.backend,
        help=f"grammar backend: {', '.join(('auto', *BACKEND_NAMES))} (default {_COMPILER.backend})",
    )
    g.add_argument(
        "--strict",
        action="store_true",
        help="refuse constraints no backend enforces exactly (a request can still choose with json_schema.strict)",
    )
    g.add_argument(
        "--compile-timeout",
        type=_positive_float,
        default=_COMPILER.timeout_s,
        metavar="S",
        help=f"seconds one grammar compile may take (default {_COMPILER.timeout_s:g})",
    )
    g.add_argument(
        "--compile-workers",
        type=_non_negative_int,
        default=_COMPILER.worker_processes,
        metavar="N",
        help="grammar compile processes per backend that compiles out of process, started with the "
        "engine; 0 compiles in threads instead: no process to start, but a compile past "
        f"--compile-timeout then runs on to its end (default {_COMPILER.worker_processes})",
    )


def _add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve",
        help="run the OpenAI-compatible server",
        description="Serve /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages, /tokenize, "
        "/detokenize, /v1/models, /health and /metrics "
        "in the foreground. Ctrl-C or SIGTERM stops it: in-flight requests get --grace seconds, "
        "then the process exits 0.",
    )
    _add_model_options(p)
    g = p.add_argument_group("HTTP")
    g.add_argument("--host", default=_SERVER.host, help=f"address to listen on (default {_SERVER.host})")
    g.add_argument(
        "--port", type=int, default=_SERVER.port, help=f"port (default {_SERVER.port}; 0 picks a free one)"
    )
    g.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on every endpoint but /health (default: $THINKSTRUCT_API_KEY)",
    )
    g.add_argument(
        "--served-model-name", default=None, help="the model id clients send (default: the model's name)"
    )
    g.add_argument(
        "--max-body-bytes",
        type=_positive_int,
        default=_SERVER.max_body_bytes,
        metavar="N",
        help=f"largest request body (default {_SERVER.max_body_bytes >> 20} MiB)",
    )
    g.add_argument(
        "--max-prompt-tokens",
        type=_positive_int,
        default=None,
        metavar="N",
        help="longest prompt in tokens (default: the model's context)",
    )
    g.add_argument(
        "--max-n",
        type=_positive_int,
        default=_SERVER.max_n,
        metavar="N",
        help=f"most choices per request (default {_SERVER.max_n})",
    )
    g.add_argument(
        "--default-max-tokens",
        type=_positive_int,
        default=_SERVER.default_max_tokens,
        metavar="N",
        help=f"max_tokens of a request that gives none (default {_SERVER.default_max_tokens})",
    )
    g.add_argument(
        "--reasoning-share",
        type=_share,
        default=_SERVER.reasoning_share,
        metavar="F",
        help="share of a request's max_tokens its thought may take (end tag included) when it thinks "
        f"and sets no max_reasoning_tokens; the answer keeps the rest (default {_SERVER.reasoning_share})",
    )
    g.add_argument(
        "--responses-store",
        type=_store_limits,
        default=_SERVER.responses_store,
        metavar="SPEC",
        help="bounds of the responses kept for previous_response_id: entries=N,mib=M,ttl=SECONDS, any subset "
        f"(default entries={_SERVER.responses_store.max_entries},mib={_SERVER.responses_store.max_bytes >> 20},"
        f"ttl={_SERVER.responses_store.ttl_s:g}; entries=0 keeps none)",
    )
    g.add_argument(
        "--grace",
        type=_positive_float,
        default=10.0,
        metavar="S",
        help="seconds in-flight requests may take to finish on shutdown (default 10)",
    )
    g.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    c = p.add_argument_group("replicas on Ray Serve (pip install 'thinkstruct[cluster]')")
    c.add_argument(
        "--replicas",
        type=_positive_int,
        default=1,
        metavar="N",
        help="engine replicas behind one OpenAI API on Ray Serve (default 1: one process, no Ray)",
    )
    c.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDR",
        help="Ray cluster to join (HOST:6379 of `ray start --head`); 'local' starts a local Ray instance "
        "even for one replica (default: a local one when --replicas > 1 or autoscaling)",
    )
    c.add_argument(
        "--min-replicas",
        type=_non_negative_int,
        default=None,
        metavar="N",
        help="autoscale down to N replicas",
    )
    c.add_argument(
        "--max-replicas", type=_positive_int, default=None, metavar="N", help="autoscale up to N replicas"
    )
    c.add_argument(
        "--target-ongoing-requests",
        type=_positive_float,
        default=8.0,
        metavar="R",
        help="autoscaling: requests in flight per replica Ray Serve scales toward (default 8)",
    )
    c.add_argument(
        "--upscale-delay",
        type=_non_negative_float,
        default=30.0,
        metavar="S",
        help="autoscaling: seconds the load must call for more replicas before one is added (default 30)",
    )
    c.add_argument(
        "--downscale-delay",
        type=_non_negative_float,
        default=600.0,
        metavar="S",
        help="autoscaling: seconds the load must call for fewer replicas before one is drained and "
        "removed (default 600)",
    )
    c.add_argument(
        "--scaling-window",
        type=_positive_float,
        default=30.0,
        metavar="S",
        help="autoscaling: seconds of requests-in-flight counts averaged for each decision (default 30)",
    )
    c.add_argument(
        "--replica-cpus",
        type=_positive_float,
        default=1.0,
        metavar="C",
        help="CPUs Ray reserves for each engine replica (fractions allowed; default 1)",
    )
    c.add_argument(
        "--routing",
        choices=("prefix", "queue"),
        default="prefix",
        help="how requests pick a replica: 'prefix' sends a conversation's turns and a shared prefix "
        "to the replica holding their keys and values while it has not too many more requests in "
        f"flight than the least busy replica (a conversation's earlier turn: {_BOUNDS.whole}; "
        f"only a shared prefix: {_BOUNDS.shared}); 'queue': by queue length alone (default prefix)",
    )
    c.add_argument(
        "--stream-interval",
        type=_non_negative_float,
        default=25.0,
        metavar="MS",
        help="milliseconds a replica waits between the streamed batches of one request's tokens "
        "(the first token and the end are never held; each batch costs CPU on Ray; default 25)",
    )


def _add_generate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "generate",
        help="answer one prompt with the engine, no server",
        description="Generate one answer: the reasoning goes to stderr as it is written, the answer to "
        "stdout. With --schema the answer is held to the JSON schema and validated; exit status 0 for a "
        "complete (and valid) answer, 1 otherwise, 2 for a usage error.",
    )
    p.add_argument("prompt", help="the user message")
    p.add_argument("--schema", type=Path, default=None, help="JSON schema file the answer must match")
    p.add_argument("--system", default=None, help="a system message")
    think = p.add_mutually_exclusive_group()
    think.add_argument("--think", dest="think", action="store_true", default=None, help="turn thinking on")
    think.add_argument("--no-think", dest="think", action="store_false", help="turn thinking off")
    p.add_argument("--max-tokens", type=_positive_int, default=512, metavar="N")
    p.add_argument(
        "--max-reasoning-tokens",
        type=_positive_int,
        default=None,
        metavar="N",
        help=f"thinking budget, then the answer is forced (default: a thought of {DEFAULT_REASONING_SHARE * 100:.0f}%% "
        "of --max-tokens, end tag included, so a thought that does not end by itself still leaves room "
        "for the answer)",
    )
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
    p.add_argument("--seed", type=int, default=None)
    _add_model_options(p)


def _byte_size(text: str) -> int:
    """``512M``, ``2G``, ``1048576``: bytes (K, M, G are powers of 1024)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    scale = units.get(text[-1:].upper(), 1)
    digits = text[:-1] if scale > 1 else text
    try:
        value = int(float(digits) * scale)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size in bytes: {text!r} (e.g. 512M, 2G)") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text!r}")
    return value


def _positive_byte_size(text: str) -> int:
    value = _byte_size(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def _kv_cache_size(text: str) -> int:
    try:
        return _positive_byte_size(text)
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(
            f"{e}: it bounds the running requests' keys and values; the prefix cache's budget is "
            "--prefix-cache-bytes (0 keeps none)"
        ) from None


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _share(text: str) -> float:
    try:
        return check_reasoning_share(float(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def _seconds_to_ms(seconds: float | None) -> float:
    return 0.0 if seconds is None else seconds * 1000


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _store_limits(text: str) -> StoreLimits:
    try:
        return StoreLimits.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text}")
    return value


def engine_spec(args: argparse.Namespace) -> EngineSpec:
    """The model, engine and compiler the parsed ``serve`` or ``generate`` options ask for
    (the options not given keep their configs' defaults)."""
    engine: dict[str, Any] = {}
    if args.prefill_chunk is not None:
        engine["prefill_chunk"] = args.prefill_chunk
    if args.speculate == "off":
        engine["speculation"] = None
    return EngineSpec(
        model=args.model,
        dtype=args.dtype,
        quantize=None if args.quantize == "none" else args.quantize,
        reasoning_parser=args.reasoning_parser,
        engine=EngineConfig(
            max_batch=args.max_batch,
            step_latency_target_s=args.step_latency_target_ms / 1000 or None,
            max_queue=args.max_queue,
            max_prompt_tokens=getattr(args, "max_prompt_tokens", None),
            kv_cache_bytes=args.kv_cache_bytes,
            prefix_cache_bytes=args.prefix_cache_bytes,
            kv_cache_dtype=args.kv_cache_dtype,
            **engine,
        ),
        compiler=CompilerConfig(
            backend=args.backend,
            strict=args.strict,
            timeout_s=args.compile_timeout,
            cache_bytes=args.grammar_cache_bytes,
            worker_processes=args.compile_workers,
        ),
    )


def usage_problem(args: argparse.Namespace) -> str | None:
    """What makes the ``serve`` or ``generate`` options unusable (an unknown backend, no
    model at the path), or ``None``."""
    try:
        check_backend_name(args.backend)
    except ValueError as e:
        return str(e)
    if args.model is not None and not args.model.exists():
        return f"no model at {args.model}"
    return None
