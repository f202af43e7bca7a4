"""``thinkstruct serve``: the OpenAI-compatible server in this process, its engine built
from the options (:func:`~thinkstruct.engine.assembly.build_engine`) while it already
listens; on Ray Serve where the options ask for replicas (:mod:`.ray_launch`)."""

from __future__ import annotations

import argparse
import functools
import logging
import sys

from thinkstruct.cli.parsing import engine_spec, usage_problem
from thinkstruct.cli.ray_launch import on_ray, serve_on_ray
from thinkstruct.engine.assembly import build_engine
from thinkstruct.server import ServerSettings
from thinkstruct.server import serve as serve_http


def serve(args: argparse.Namespace) -> int:
    """``thinkstruct serve``: the exit status (0 after a clean stop, 2 for a usage error)."""
    problem = usage_problem(args)
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

    spec = engine_spec(args)
    if on_ray(args):
        return serve_on_ray(args, spec, settings, on_listening=listening)
    return serve_http(
        functools.partial(build_engine, spec, warm_up=True),
        settings,
        grace_s=args.grace,
        log_level=args.log_level,
        on_listening=listening,
    )
