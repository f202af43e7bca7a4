"""Command line.

- ``thinkstruct check`` lints a schema against every backend.
- ``thinkstruct serve`` runs the OpenAI-compatible server (foreground; Ctrl-C stops it).
- ``thinkstruct generate`` answers one prompt through the engine, no HTTP: the reasoning
  on stderr as it is written, the answer (validated against ``--schema``) on stdout.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import gc
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from thinkstruct.engine.engine import EngineConfig
from thinkstruct.engine.free_text import DEFAULT_REASONING_SHARE, check_reasoning_share
from thinkstruct.errors import InvalidConstraint
from thinkstruct.grammar.backends import BACKEND_NAMES
from thinkstruct.grammar.service.config import CompilerConfig
from thinkstruct.server.response_store import StoreLimits
from thinkstruct.server.settings import ServerSettings

# Every default below is read from the config it sets (one place for each): the engine's,
# the compiler's and the server's dataclasses.
_ENGINE = EngineConfig()
_COMPILER = CompilerConfig()
_SERVER = ServerSettings()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="thinkstruct", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
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
    _add_serve(sub)
    _add_generate(sub)
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "generate":
        return _generate(args)
    return _check(args)


# ---- serve / generate -------------------------------------------------------------------

#: ``--quantize``'s default: chosen for the model by
#: :func:`~thinkstruct.engine.models.default_quantize` (a GGUF whose blocks the kernels run:
#: ``gguf``, its own weights; otherwise ``int8-weights``).
DEFAULT_QUANTIZE = "auto"


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
        default="bfloat16",
        choices=("bfloat16", "float32", "float16"),
        help="weights and activations with --quantize none (default bfloat16); quantized models compute in float32",
    )
    g.add_argument(
        "--quantize",
        default=DEFAULT_QUANTIZE,
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
        help=f"requests decoded together (default {_ENGINE.max_batch})",
    )
    g.add_argument(
        "--prefill-chunk",
        type=_positive_int,
        default=None,
        metavar="N",
        help="prompt tokens computed in one prefill pass between decoding steps "
        f"(default {_ENGINE.prefill_chunk})",
    )
    g.add_argument(
        "--kv-cache-bytes",
        type=_byte_size,
        default=None,
        metavar="BYTES",
        help="most bytes of finished requests' keys and values kept for requests that start the "
        "same way, a chat's next turn (e.g. 512M, 2G; 0 keeps none; default "
        f"{_ENGINE.prefix_cache_bytes >> 20}M)",
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


def _engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """The EngineConfig fields the command line set; the others keep EngineConfig's."""
    options: dict[str, Any] = {}
    if getattr(args, "prefill_chunk", None) is not None:
        options["prefill_chunk"] = args.prefill_chunk
    if getattr(args, "kv_cache_bytes", None) is not None:
        options["prefix_cache_bytes"] = args.kv_cache_bytes
    if getattr(args, "speculate", None) == "off":
        options["speculation"] = None
    return options


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


def _load_model_and_compiler(args: argparse.Namespace, *, progress: bool = True) -> tuple[Any, Any]:
    """The model and a grammar compiler for it, as the options say."""
    from thinkstruct.engine import load_model
    from thinkstruct.grammar.service.compiler import CompilerConfig, GrammarCompiler

    model = load_model(
        args.model,
        dtype=args.dtype,
        quantize=None if args.quantize == "none" else args.quantize,
        reasoning_parser=args.reasoning_parser,
        progress=progress,
    )
    compiler = GrammarCompiler(
        model.tokenizer,
        CompilerConfig(backend=args.backend, strict=args.strict, timeout_s=args.compile_timeout),
    )
    return model, compiler


def _build_engine(args: argparse.Namespace, *, progress: bool = True, warm_up: bool = False) -> Any:
    """Load the model and start an engine for it (the caller closes it); ``warm_up``
    starts the grammar compile workers too, so the first constrained requests do not
    wait for them."""
    from thinkstruct.engine import Engine, EngineConfig

    model, compiler = _load_model_and_compiler(args, progress=progress)
    engine = Engine(
        model,
        config=EngineConfig(
            max_batch=args.max_batch,
            max_queue=args.max_queue,
            **_engine_options(args),
            max_prompt_tokens=getattr(args, "max_prompt_tokens", None),
        ),
        compiler=compiler,
    )
    engine.start()
    if warm_up:
        import logging

        try:
            compiler.warm_up()
        except Exception:  # the workers start again on demand; serving goes on
            logging.getLogger("thinkstruct.server").warning(
                "grammar compile workers did not warm up", exc_info=True
            )
    # What loading made lives as long as the process (~380k objects: the tokenizer's
    # vocabularies, the model's modules): a full collection walked them all, ~0.4 s with
    # the GIL held, a stall of every stream at once. Frozen, collections skip them.
    gc.freeze()
    return engine


def _usage_problem(args: argparse.Namespace) -> str | None:
    from thinkstruct.grammar.service.config import check_backend_name

    try:
        check_backend_name(args.backend)
    except ValueError as e:
        return str(e)
    if args.model is not None and not args.model.exists():
        return f"no model at {args.model}"
    return None


def _serve(args: argparse.Namespace) -> int:
    import logging

    from thinkstruct.server import ServerSettings, serve

    problem = _usage_problem(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        settings = ServerSettings(
            host=args.host,
            port=args.port,
            api_key=ServerSettings.api_key_from_env(args.api_key),
            served_model_name=args.served_model_name,
            max_body_bytes=args.max_body_bytes,
            max_prompt_tokens=args.max_prompt_tokens,
            max_n=args.max_n,
            default_max_tokens=args.default_max_tokens,
            reasoning_share=args.reasoning_share,
            responses_store=args.responses_store,
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    def listening(port: int) -> None:
        print(
            f"thinkstruct: listening on http://{args.host}:{port} (the model loads in the background; "
            "GET /health answers 200 once it is ready)",
            file=sys.stderr,
            flush=True,
        )

    if _on_ray(args):
        return _serve_on_ray(args, settings, on_listening=listening)
    return serve(
        lambda: _build_engine(args, warm_up=True),
        settings,
        grace_s=args.grace,
        log_level=args.log_level,
        on_listening=listening,
    )


def _on_ray(args: argparse.Namespace) -> bool:
    """Serve on Ray Serve: more than one replica, autoscaling, or a Ray address given."""
    return (
        args.replicas > 1
        or args.ray_address is not None
        or args.min_replicas is not None
        or args.max_replicas is not None
    )


def _serve_on_ray(args: argparse.Namespace, settings: Any, *, on_listening: Callable[[int], None]) -> int:
    try:
        from thinkstruct.server.cluster.service import ClusterOptions, serve_cluster
    except ImportError as e:
        print(
            f"error: --replicas/--ray-address need Ray Serve ({e}); pip install 'thinkstruct[cluster]'",
            file=sys.stderr,
        )
        return 2
    try:
        options = ClusterOptions(
            replicas=args.replicas,
            min_replicas=args.min_replicas,
            max_replicas=args.max_replicas,
            target_ongoing_requests=args.target_ongoing_requests,
            upscale_delay_s=args.upscale_delay,
            downscale_delay_s=args.downscale_delay,
            scaling_window_s=args.scaling_window,
            ray_address=args.ray_address,
            replica_cpus=args.replica_cpus,
            stream_interval_s=args.stream_interval / 1000,
            grace_s=args.grace,
        )
        options.check()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return serve_cluster(
        functools.partial(_build_engine, args, progress=False, warm_up=True),
        functools.partial(_load_model_and_compiler, args, progress=False),
        settings,
        options,
        max_prompt_tokens=args.max_prompt_tokens,
        on_listening=on_listening,
    )


def _generate(args: argparse.Namespace) -> int:
    from thinkstruct.engine import FinishReason, GenerationRequest, SamplingParams
    from thinkstruct.grammar.constraint import Constraint
    from thinkstruct.parsers import render_chat
    from thinkstruct.server.prompts import encode
    from thinkstruct.server.reasoning_budget import thinking_budget

    problem = _usage_problem(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    schema = None
    if args.schema is not None:
        try:
            schema = json.loads(args.schema.read_text(encoding="utf-8"))
            constraint = Constraint.json_schema(schema)
        except OSError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        except (ValueError, InvalidConstraint) as e:
            print(f"{args.schema}: invalid: {e}", file=sys.stderr)
            return 1
    try:
        sampling = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    engine = _build_engine(args)
    try:
        model = engine.model
        switch = model.family.switch
        kwargs = {switch.kwarg: args.think} if switch is not None and args.think is not None else None
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
            {"role": "user", "content": args.prompt}
        ]
        prompt = render_chat(
            messages,
            family=model.family,
            tokenizer=model.tokenizer,
            chat_template=model.chat_template,
            chat_template_kwargs=kwargs,
        )
        if schema is not None:
            prompt = prompt.with_thought_open()  # the grammar starts inside the thought
        try:
            grammar = engine.compiler.compile(constraint) if schema is not None else None
        except InvalidConstraint as e:
            print(f"{args.schema}: cannot be enforced: {e}", file=sys.stderr)
            return 1
        request = GenerationRequest(
            prompt_ids=encode(model.tokenizer, prompt.text, add_special_tokens=False),
            sampling=sampling,
            grammar=grammar,
            reasoning=prompt.reasoning_enabled,
            reasoning_parser=prompt.reasoning_parser(stream_reasoning=True),
            max_reasoning_tokens=thinking_budget(
                engine,
                requested=args.max_reasoning_tokens,
                reasoning=prompt.reasoning_enabled,
                max_tokens=args.max_tokens,
                share=DEFAULT_REASONING_SHARE,
            ),
        )
        content: list[str] = []
        finish = None
        error = None
        shown_reasoning = False
        for delta in engine.submit(request):
            if delta.reasoning:
                if not shown_reasoning:
                    print("--- reasoning", file=sys.stderr)
                    shown_reasoning = True
                print(delta.reasoning, end="", file=sys.stderr, flush=True)
            content.append(delta.content)
            if delta.finish_reason is not None:
                finish, error = delta.finish_reason, delta.error
    finally:
        engine.close()
        engine.compiler.close()
    if shown_reasoning:
        print("\n--- answer", file=sys.stderr)
    answer = "".join(content)
    print(answer)
    if finish is not FinishReason.STOP:
        print(
            f"error: the answer did not finish (finish reason {getattr(finish, 'value', finish)}"
            f"{': ' + error if error else ''})",
            file=sys.stderr,
        )
        return 1
    if schema is not None:
        return _validate_answer(answer, schema)
    return 0


def _validate_answer(answer: str, schema: Any) -> int:
    import jsonschema

    try:
        value = json.loads(answer)
    except ValueError as e:
        print(f"invalid: the answer is not JSON: {e}", file=sys.stderr)
        return 1
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(value), key=lambda e: list(e.path))
    for err in errors:
        print(f"invalid at /{'/'.join(map(str, err.path))}: {err.message}", file=sys.stderr)
    if not errors:
        print("valid: the answer matches the schema", file=sys.stderr)
    return 1 if errors else 0


def _check(args: argparse.Namespace) -> int:
    from thinkstruct.grammar.api import first_rejected, get_backend
    from thinkstruct.grammar.backends import BACKEND_NAMES
    from thinkstruct.grammar.base import InvalidGrammar
    from thinkstruct.grammar.constraint import Constraint
    from thinkstruct.grammar.json_format import JsonFormat
    from thinkstruct.tokenizer import Tokenizer

    names = [*BACKEND_NAMES, "auto"] if args.backend == "all" else [args.backend]
    for name in names:
        if name not in (*BACKEND_NAMES, "auto"):
            print(
                f"error: unknown backend {name!r}; choose from {', '.join(BACKEND_NAMES)}, auto or all",
                file=sys.stderr,
            )
            return 2
    try:
        schema_text = args.schema_file.read_text(encoding="utf-8")
        texts = [(p, p.read_text(encoding="utf-8")) for p in args.text_files]
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        constraint = Constraint.json_schema(schema_text)
    except InvalidConstraint as e:
        print(f"{args.schema_file}: invalid: {e}")
        return 1
    tokenizer = Tokenizer.from_pretrained(args.tokenizer) if args.tokenizer else Tokenizer.default()
    fmt = JsonFormat(args.max_whitespace) if args.max_whitespace is not None else JsonFormat()
    ok = True
    for name in names:
        if name == "auto":
            ok = _check_auto(constraint, texts, tokenizer, fmt) and ok
            continue
        backend = get_backend(tokenizer, name, json_format=fmt)
        start = time.perf_counter()
        result = backend.compile(constraint)
        elapsed_ms = (time.perf_counter() - start) * 1000
        if isinstance(result, InvalidGrammar):
            ok = False
            print(f"{name}: does not compile ({elapsed_ms:.1f} ms): {result.error}")
            continue
        print(f"{name}: compiles in {elapsed_ms:.1f} ms")
        for path, text in texts:
            offset = first_rejected(result, text)
            if offset is None:
                print(f"  {path}: accepted")
            else:
                ok = False
                print(f"  {path}: rejected at character {offset}: {_context(text, offset)}")
    return 0 if ok else 1


def _check_auto(constraint: Any, texts: list[tuple[Path, str]], tokenizer: Any, fmt: Any) -> bool:
    """``auto`` as a strict server compiles: the backend, what is checked, the texts."""
    from thinkstruct.errors import ThinkstructError
    from thinkstruct.grammar.api import default_compiler, first_rejected
    from thinkstruct.grammar.runtime.tag_checks import first_failed_check

    start = time.perf_counter()
    try:
        compiled = default_compiler(tokenizer, json_format=fmt).compile(
            constraint, backend="auto", strict=True
        )
    except ThinkstructError as e:
        print(f"auto (strict): does not compile ({(time.perf_counter() - start) * 1000:.1f} ms): {e}")
        return False
    print(f"auto (strict): compiles with {compiled.backend} in {(time.perf_counter() - start) * 1000:.1f} ms")
    for kept in compiled.enforcement():
        if kept.enforcement == "checked":
            print(f"  checked as values close: {kept.keyword} at {kept.pointer} on {kept.location or '/'}")
    ok = True
    for path, text in texts:
        offset = first_rejected(compiled, text)
        failure = (
            None
            if offset is not None or compiled.checks is None
            else first_failed_check(compiled.checks, text)
        )
        if offset is not None:
            print(f"  {path}: rejected at character {offset}: {_context(text, offset)}")
        elif failure is not None:
            print(f"  {path}: fails a check at character {failure.start}: {failure.describe()}")
        else:
            print(f"  {path}: accepted")
        ok = ok and offset is None and failure is None
    return ok


def _context(text: str, offset: int) -> str:
    if offset >= len(text):
        return "the answer ends before it is complete"
    before = text[max(0, offset - 20) : offset]
    after = text[offset : offset + 20]
    return json.dumps(before + "⟨here⟩" + after, ensure_ascii=False)


def run() -> None:
    """The ``thinkstruct`` command: :func:`main`, then exit with its status.

    The exit skips the interpreter's teardown, and only that: exit handlers run and the
    output is flushed as ``sys.exit`` would (every command has closed its engine, compile
    workers and sockets by then). The teardown has nothing left to release and prints,
    after every Ctrl-C of ``serve``, dozens of lines of nanobind's leak report for
    triton's bindings (torch imports triton where it is installed; xgrammar depends on it).
    """
    code = main()
    atexit._run_exitfuncs()  # logging.shutdown among them
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
