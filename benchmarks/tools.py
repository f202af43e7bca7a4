"""Tool calls on the embedded SmolLM2-135M-Instruct, with and without the call constraint.

For each BFCL schema of MaskBench (``../shared/conformance/maskbench/BFCL_*.json``: each is
an object keyed by one function name, or an ``anyOf`` of several, whose value is that
function's parameters), the functions become the request's tools and the ground-truth
call becomes the question ("Call get_weather with city = "Paris"."). Each question is
asked twice, interleaved (the machine is noisy), greedy, thinking off:

- free: the tools in the prompt (SmolLM2's own function-calling format), the answer
  unconstrained, then read by the tool-call parser;
- constrained: ``tool_choice="required"``, the answer held to the family's call syntax
  and each tool's schema (a structural tag, compiled before timing).

A call is valid when the answer stopped by itself, made at least one call, and every call
names one of the tools with arguments that validate against its schema (jsonschema).
Prints per category and overall the valid-call rate and tokens per second (completion
tokens over the requests' total time, prefill included; and over decode time only),
side by side, and the constrained/free ratio. Never asserts.

    python benchmarks/tools.py [--limit N] [--per-category N] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema

# Spinning OpenMP workers collapse throughput on shared cores; set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from thinkstruct import Constraint, GrammarCompiler
from thinkstruct.engine import (
    Engine,
    EngineConfig,
    FinishReason,
    GenerationRequest,
    SamplingParams,
    load_model,
)
from thinkstruct.grammar.service.compiler import CompilerConfig
from thinkstruct.parsers import render_chat
from thinkstruct.parsers.tool_calls import ToolCallParser, get_tool_call_syntax, tool_call_structural_tag

MASKBENCH = Path(__file__).resolve().parents[2] / "shared" / "conformance" / "maskbench"


@dataclass
class Case:
    name: str
    category: str
    tools: list[tuple[str, dict[str, Any]]]
    question: str


@dataclass
class Outcome:
    valid: bool
    finished: bool
    tokens: int
    total_s: float
    decode_s: float


def load_cases(limit: int | None, per_category: int | None = None) -> list[Case]:
    cases: list[Case] = []
    for path in sorted(glob.glob(str(MASKBENCH / "BFCL_*.json"))):
        doc = json.loads(Path(path).read_text())
        schema = doc["schema"]
        options = schema.get("anyOf", [schema])
        tools = []
        for option in options:
            ((name, params),) = option["properties"].items()
            tools.append((name, params))
        data = doc["tests"][0]["data"]
        ((called, args),) = data.items()
        described = ", ".join(
            f"{k} = {json.dumps(v, ensure_ascii=False)}" for k, v in args.items() if v not in ("", None, [])
        )
        question = f"Call {called} with {described}." if described else f"Call {called}."
        category = Path(path).stem.rsplit("_", 1)[0].removeprefix("BFCL_")
        if per_category is not None and sum(c.category == category for c in cases) >= per_category:
            continue
        cases.append(Case(Path(path).stem, category, tools, question))
    return cases[:limit] if limit else cases


def call_constraint(engine: Engine, case: Case) -> Constraint:
    """The ``tool_choice="required"`` constraint of ``case``: its tools' calls in the family's syntax."""
    syntax = get_tool_call_syntax(engine.model.family.tool_call_syntax)
    tag = tool_call_structural_tag(
        syntax.form,
        case.tools,
        mode="required",
        parallel=True,
        max_whitespace=engine.compiler.config.json_format.max_whitespace,
    )
    return Constraint.structural_tag(tag)


def run(engine: Engine, case: Case, *, constrained: bool, max_tokens: int) -> Outcome:
    model = engine.model
    openai_tools = [{"type": "function", "function": {"name": n, "parameters": p}} for n, p in case.tools]
    prompt = render_chat(
        [{"role": "user", "content": case.question}],
        family=model.family,
        tokenizer=model.tokenizer,
        chat_template=model.chat_template,
        chat_template_kwargs={"enable_thinking": False},
        tools=openai_tools,
    )
    syntax = get_tool_call_syntax(model.family.tool_call_syntax)
    # Cached: every constraint was compiled before timing.
    grammar = engine.compiler.compile(call_constraint(engine, case)) if constrained else None
    ids = model.tokenizer.hf(prompt.text, add_special_tokens=False)["input_ids"]
    request = GenerationRequest(
        prompt_ids=ids,
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0),
        grammar=grammar,
        reasoning=prompt.reasoning_enabled,
        reasoning_parser=prompt.reasoning_parser(),
    )
    result = list(engine.submit(request))
    last = result[-1]
    content = "".join(d.content for d in result)
    usage = last.usage
    finished = last.finish_reason is FinishReason.STOP
    found = ToolCallParser(syntax, tools=openai_tools).parse(content)
    schemas = dict(case.tools)
    valid = finished and bool(found.calls)
    for call in found.calls:
        try:
            jsonschema.validate(json.loads(call.arguments), schemas[call.name])
        except (KeyError, ValueError, jsonschema.ValidationError, jsonschema.SchemaError):
            valid = False
    ttft = usage.time_to_first_token_s or 0.0
    total = usage.total_s or 0.0
    return Outcome(valid, finished, usage.completion_tokens, total, max(total - ttft, 1e-9))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--limit", type=int, default=None, help="only the first N schemas")
    parser.add_argument(
        "--per-category", type=int, default=None, help="at most N schemas of each BFCL category"
    )
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    cases = load_cases(args.limit, args.per_category)
    if not cases:
        sys.exit(f"no BFCL schemas under {MASKBENCH}")
    model = load_model(progress=False)
    # A generous compile limit: this benchmark measures decoding, on a machine shared with others.
    compiler = GrammarCompiler(model.tokenizer, CompilerConfig(timeout_s=300.0))
    engine = Engine(model, config=EngineConfig(max_batch=1), compiler=compiler).start()
    compile_s = []
    try:
        # Compile every constraint first: compile time is reported, not timed with decoding.
        for case in cases:
            constraint = call_constraint(engine, case)
            start = time.perf_counter()
            engine.compiler.compile(constraint)
            compile_s.append(time.perf_counter() - start)
        run(engine, cases[0], constrained=False, max_tokens=8)  # warm the engine
        results: dict[str, dict[bool, list[Outcome]]] = collections.defaultdict(lambda: {False: [], True: []})
        for i, case in enumerate(cases):
            order = (False, True) if i % 2 == 0 else (True, False)
            for constrained in order:
                results[case.category][constrained].append(
                    run(engine, case, constrained=constrained, max_tokens=args.max_tokens)
                )
    finally:
        engine.close()

    def line(label: str, free: list[Outcome], held: list[Outcome]) -> str:
        def stats(xs: list[Outcome]) -> tuple[float, float, float, float]:
            tokens = sum(o.tokens for o in xs)
            return (
                100.0 * sum(o.valid for o in xs) / len(xs),
                100.0 * sum(o.finished for o in xs) / len(xs),
                tokens / sum(o.total_s for o in xs),
                tokens / sum(o.decode_s for o in xs),
            )

        f, h = stats(free), stats(held)
        return (
            f"| {label} | {len(free)} | {f[0]:.1f} % | {h[0]:.1f} % | {f[1]:.0f} % / {h[1]:.0f} % | "
            f"{f[2]:.1f} | {h[2]:.1f} | {h[2] / f[2]:.2f} | {f[3]:.1f} | {h[3]:.1f} | {h[3] / f[3]:.2f} |"
        )

    print(
        f"SmolLM2-135M-Instruct ({model.family.name}, syntax {model.family.tool_call_syntax}), greedy, "
        f"max_tokens {args.max_tokens}, batch 1; compile of the constraint: median "
        f"{statistics.median(compile_s) * 1000:.0f} ms, max {max(compile_s) * 1000:.0f} ms"
    )
    print()
    print(
        "| category | n | valid free | valid constrained | stopped free / constrained | tok/s free | tok/s constrained "
        "| ratio | decode tok/s free | decode tok/s constrained | ratio |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for category in sorted(results):
        print(line(category, results[category][False], results[category][True]))
    every_free = [o for r in results.values() for o in r[False]]
    every_held = [o for r in results.values() for o in r[True]]
    print(line("all", every_free, every_held))


if __name__ == "__main__":
    main()
