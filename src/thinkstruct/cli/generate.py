"""``thinkstruct generate``: one prompt answered by the engine, no HTTP; the reasoning on
stderr as it is written, the answer on stdout, validated against ``--schema``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from thinkstruct.cli.parsing import engine_spec, usage_problem
from thinkstruct.engine import FinishReason, GenerationRequest, SamplingParams
from thinkstruct.engine.assembly import build_engine
from thinkstruct.engine.core.thinking_budget import DEFAULT_REASONING_SHARE
from thinkstruct.errors import InvalidConstraint
from thinkstruct.grammar.constraint import Constraint
from thinkstruct.parsers import render_chat
from thinkstruct.server.prompts import encode
from thinkstruct.server.reasoning_budget import thinking_budget


def generate(args: argparse.Namespace) -> int:
    """``thinkstruct generate``: the exit status (0 for a complete, valid answer, 1 otherwise,
    2 for a usage error)."""
    problem = usage_problem(args)
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
    engine = build_engine(engine_spec(args))
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
