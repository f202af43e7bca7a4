"""Checked keywords on the embedded model: every finished answer valid, at what cost.

Schemas whose keywords no grammar enforces: one per checked keyword, written so that
sampling unconstrained by that keyword is likely to break it (``uniqueItems`` over a small
``enum``, ``not: {const}`` of the likeliest value, ``format``, ``multipleOf`` on a
fraction, ``contains`` counts, ``if``/``then``, ``dependentSchemas``, ``propertyNames``),
and the MaskBench sample's schemas that strict ``auto`` compiles with checks. Each schema,
``--seeds`` seeds at temperature 1, thinking off, generated twice side by side:

- **checked**: strict compile (the keywords checked as each value closes, a failed value
  taken back and drawn again);
- **unchecked**: lenient compile (the same grammar, the keywords ignored).

Per side: answers that finished (``stop``), the share of those that validate
(``jsonschema``, format checker on), requests cut by ``max_tokens``, requests that ended with a check's error (tries run out),
rollbacks and tokens resampled per answer, and tokens per second over the schemas on
which the checked side never rolled back (what checking costs when nothing fails).

Then tool calls (``--tool-seeds``, 0 to skip): ``tool_choice: "required"`` with two
tools whose arguments need checks (three different stripes of a small ``enum``:
``uniqueItems``; ``coats`` but not one: ``not: {const}``), asked for what breaks them,
in SmolLM2's call syntax, checked (strict) and unchecked (lenient): per side, the share of
calls whose arguments validate against their tool's schema, over the answers that
finished with calls.

With ``--sweep``: requests out of tries (a checked keyword that could not be met) per
case of ``benchmarks/checked_cases.py`` (the checked-keyword tests' schemas and prompts,
the schemas above asked through the chat template, the tool-call case), ``--seeds``
seeds each, for this tree and the tree ``--before`` names, each in its own process
(``benchmarks/checked_sweep.py``).

Prints a table and asserts nothing.

    python benchmarks/checked.py [--seeds 5] [--maskbench 8] [--max-tokens 200] [--tool-seeds 8]
    python benchmarks/checked.py --sweep --before /work/main/src --seeds 30
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


sys.path.insert(0, str(Path(__file__).resolve().parent))

from checked_cases import PAINT, SCHEMA_CASES, schema_question, valid
from checked_sweep import checked_maskbench
from forward_baselines import chat_prompt_ids
from thinkstruct import Constraint
from thinkstruct.engine import (
    Engine,
    EngineConfig,
    FinishReason,
    GenerationRequest,
    SamplingParams,
    load_model,
)
from thinkstruct.grammar.service.compiler import GrammarCompiler

KEYWORD_SCHEMAS = SCHEMA_CASES
TOOL_SCHEMAS = PAINT.tools
TOOL_ASK = PAINT.prompt


@dataclass
class Side:
    answers: int = 0
    finished: int = 0
    valid: int = 0
    check_errors: int = 0
    lengths: int = 0
    rollbacks: int = 0
    resampled: int = 0
    tokens: int = 0
    seconds: float = 0.0
    clean_tokens: int = 0
    clean_seconds: float = 0.0
    invalid: list[str] = field(default_factory=list)


def tool_calls(model: Any, compiler: GrammarCompiler, engine: Engine, *, seeds: int, max_tokens: int) -> None:
    """The tool-call case (see the module doc): one line per side."""
    from thinkstruct.parsers.chat_template import render_chat
    from thinkstruct.parsers.tool_calls import get_tool_call_syntax, tool_call_structural_tag
    from thinkstruct.parsers.tool_calls.types import ToolSchemas
    from thinkstruct.server.tools import ToolPlan

    tools = [
        {"type": "function", "function": {"name": n, "description": n.replace("_", " "), "parameters": s}}
        for n, s in TOOL_SCHEMAS.items()
    ]
    syntax = get_tool_call_syntax(model.family.tool_call_syntax)
    plan = ToolPlan(
        tools=tools,
        schemas=ToolSchemas.from_tools(tools),
        choice="required",
        allowed=tuple(TOOL_SCHEMAS),
        parallel=True,
        syntax=syntax,
    )
    assert syntax.form is not None  # SmolLM2's hermes-list calls are constrained
    tag = tool_call_structural_tag(
        syntax.form,
        list(TOOL_SCHEMAS.items()),
        mode="required",
        parallel=True,
        max_whitespace=compiler.config.json_format.max_whitespace,
    )
    prompt = render_chat(
        [{"role": "user", "content": TOOL_ASK}],
        family=model.family,
        tokenizer=model.tokenizer,
        chat_template=model.chat_template,
        chat_template_kwargs={"enable_thinking": False},
        tools=tools,
    )
    ids = model.tokenizer.hf.encode(prompt.text, add_special_tokens=False)
    print(f"\ntool calls: 2 tools, {seeds} seeds, temperature 1, max_tokens {max_tokens}")
    for side_name, strict in (("checked", True), ("unchecked", False)):
        grammar = compiler.compile(Constraint.structural_tag(tag), strict=strict)
        answers = finished = calls = valid_calls = rollbacks = errors = 0
        for seed in range(seeds):
            out = engine.submit(
                GenerationRequest(
                    prompt_ids=ids,
                    sampling=SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed),
                    grammar=grammar,
                    tool_calls=plan.reading(),
                )
            ).wait()
            answers += 1
            rollbacks += out.usage.check_rollbacks if out.usage else 0
            errors += out.finish_reason is FinishReason.ERROR
            if out.finish_reason is not FinishReason.STOP or not out.tool_calls:
                continue
            finished += 1
            for call in out.tool_calls:
                calls += 1
                valid_calls += valid(TOOL_SCHEMAS.get(call.name, {"not": {}}), call.arguments)
        share = valid_calls / calls if calls else 0.0
        print(
            f"{side_name:9s} answers {answers:3d} | finished with calls {finished:3d} | calls {calls:3d} "
            f"| valid arguments {share:6.1%} | ended by a check {errors:2d} | rollbacks {rollbacks:3d}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--maskbench", type=int, default=8, help="MaskBench schemas compiled with checks")
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--tool-seeds", type=int, default=8, help="seeds of the tool-call case (0: skip it)")
    parser.add_argument("--only-tools", action="store_true", help="run the tool-call case only")
    parser.add_argument(
        "--sweep", action="store_true", help="requests out of tries per case, this tree against --before"
    )
    parser.add_argument("--before", type=Path, default=Path("/work/main/src"), help="the other tree's src")
    parser.add_argument(
        "--after", type=Path, default=Path(__file__).resolve().parent.parent / "src", help="this tree's src"
    )
    parser.add_argument("--chunk", type=int, default=6, help="cases per worker process (--sweep)")
    parser.add_argument("--only", help="cases whose name holds this (--sweep)")
    options = parser.parse_args()
    if options.sweep:
        from checked_sweep import compare

        compare(
            options.before,
            after=options.after,
            seeds=options.seeds,
            chunk=options.chunk,
            only=options.only,
            maskbench=options.maskbench,
        )
        return
    model = load_model(progress=False)
    schemas = dict(KEYWORD_SCHEMAS)
    with (
        GrammarCompiler(model.tokenizer) as compiler,
        Engine(model, config=EngineConfig(max_batch=4)) as engine,
    ):
        if options.tool_seeds:
            tool_calls(
                model, compiler, engine, seeds=options.tool_seeds, max_tokens=min(options.max_tokens, 100)
            )
        if options.only_tools:
            return
        for case in checked_maskbench(compiler, options.maskbench):
            schemas[f"maskbench {case.name}"[:40]] = case.schema
        sides = {"checked": Side(), "unchecked": Side()}
        print(
            f"{len(schemas)} schemas x {options.seeds} seeds, temperature 1, max_tokens {options.max_tokens}"
        )
        for name, schema in schemas.items():
            grammars = {
                "checked": compiler.compile(Constraint.json_schema(schema), strict=True),
                "unchecked": compiler.compile(Constraint.json_schema(schema), strict=False),
            }
            ids = chat_prompt_ids(model, schema_question(schema))
            per_schema: dict[str, list[tuple[int, float, int]]] = {"checked": [], "unchecked": []}
            for seed in range(options.seeds):
                for side_name in ("checked", "unchecked") if seed % 2 == 0 else ("unchecked", "checked"):
                    side = sides[side_name]
                    started = time.perf_counter()
                    out = engine.submit(
                        GenerationRequest(
                            prompt_ids=ids,
                            sampling=SamplingParams(
                                max_tokens=options.max_tokens, temperature=1.0, seed=seed
                            ),
                            grammar=grammars[side_name],
                        )
                    ).wait()
                    elapsed = time.perf_counter() - started
                    usage = out.usage
                    side.answers += 1
                    generated = usage.completion_tokens + usage.resampled_tokens if usage else 0
                    side.tokens += generated
                    side.seconds += elapsed
                    per_schema[side_name].append((generated, elapsed, usage.check_rollbacks if usage else 0))
                    if usage is not None:
                        side.rollbacks += usage.check_rollbacks
                        side.resampled += usage.resampled_tokens
                    if out.finish_reason is FinishReason.STOP:
                        side.finished += 1
                        if valid(schema, out.content):
                            side.valid += 1
                        else:
                            side.invalid.append(f"{name}: {out.content[:80]!r}")
                    elif out.finish_reason is FinishReason.ERROR:
                        side.check_errors += 1
                    elif out.finish_reason is FinishReason.LENGTH:
                        side.lengths += 1
            if not any(r for _, _, r in per_schema["checked"]):
                for side_name, runs in per_schema.items():
                    sides[side_name].clean_tokens += sum(t for t, _, _ in runs)
                    sides[side_name].clean_seconds += sum(s for _, s, _ in runs)
            print(f"  {name}: done (load average {os.getloadavg()[0]:.1f})", flush=True)
    print()
    for side_name, side in sides.items():
        share = side.valid / side.finished if side.finished else 0.0
        rate = side.clean_tokens / side.clean_seconds if side.clean_seconds else 0.0
        print(
            f"{side_name:9s} answers {side.answers:3d} | finished {side.finished:3d} | valid {share:6.1%} "
            f"| cut by max_tokens {side.lengths:2d} | ended by a check {side.check_errors:2d} | rollbacks {side.rollbacks:3d} "
            f"| resampled/answer {side.resampled / max(side.answers, 1):5.1f} "
            f"| tok/s on schemas never rolled back {rate:6.1f}"
        )
    checked, unchecked = sides["checked"], sides["unchecked"]
    if checked.clean_seconds and unchecked.clean_seconds:
        ratio = (checked.clean_tokens / checked.clean_seconds) / (
            unchecked.clean_tokens / unchecked.clean_seconds
        )
        print(f"checked / unchecked tok/s on schemas never rolled back: {ratio:.2f}")
    for line in checked.invalid[:10]:
        print("  checked but invalid:", line)


if __name__ == "__main__":
    main()
