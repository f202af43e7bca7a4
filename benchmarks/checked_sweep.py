"""Requests out of tries over many seeds, per checked-keyword case, for two source trees.

Each satisfiable case of :mod:`checked_cases` (the checked-keyword tests' schemas and
prompts, the benchmark's schemas asked through the chat template, the tool-call case) and
the first MaskBench schemas that strict ``auto`` compiles with checks,
``--seeds`` seeds at temperature 1, thinking off, through the engine on the embedded
model. Per case and tree: answers that finished (``stop``), of those the ones that
validate, requests that ended because a checked keyword could not be met (out of tries),
other errors, answers cut by ``max_tokens``, and rollbacks.

The trees run one after the other, each in its own process (``PYTHONPATH`` set to its
``src``), a chunk of cases at a time, the order of the two sides swapped at every chunk.
``benchmarks/checked.py --sweep`` is the entry point:

    python benchmarks/checked.py --sweep --before /work/main/src --seeds 30
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
#: This tree's source, the default "after" side.
THIS_TREE = HERE.parent / "src"

#: What an answer out of tries says (the engine's error text).
OUT_OF_TRIES = ("could not meet", "no answer meets")

COLUMNS = ("finished", "valid", "out_of_tries", "errors", "length", "rollbacks")


def run_case(case: Any, model: Any, compiler: Any, engine: Any, *, seeds: int) -> dict[str, int]:
    """The counts of one case over ``seeds`` seeds (see the module doc)."""
    from checked_cases import valid
    from thinkstruct import Constraint
    from thinkstruct.engine import FinishReason, GenerationRequest, SamplingParams
    from thinkstruct.parsers import render_chat

    fields: dict[str, Any] = {}
    tools = [
        {"type": "function", "function": {"name": n, "description": n.replace("_", " "), "parameters": s}}
        for n, s in case.tools.items()
    ]
    if case.tools:
        fields, constraint = _tool_fields(model, compiler, tools)
    else:
        constraint = Constraint.json_schema(case.schema)
    grammar = compiler.compile(constraint, backend=case.backend, strict=True)
    if case.chat:
        prompt = render_chat(
            [{"role": "user", "content": case.prompt}],
            family=model.family,
            tokenizer=model.tokenizer,
            chat_template=model.chat_template,
            chat_template_kwargs={"enable_thinking": False},
            tools=tools or None,
        )
        ids = model.tokenizer.hf.encode(prompt.text, add_special_tokens=False)
    else:
        ids = model.tokenizer.encode(case.prompt)
    handles = [
        engine.submit(
            GenerationRequest(
                prompt_ids=ids,
                sampling=SamplingParams(max_tokens=case.max_tokens, temperature=1.0, seed=seed),
                grammar=grammar,
                **fields,
            )
        )
        for seed in range(seeds)
    ]
    counts = dict.fromkeys(COLUMNS, 0)
    for handle in handles:
        out = handle.wait()
        counts["rollbacks"] += out.usage.check_rollbacks if out.usage else 0
        if out.finish_reason is FinishReason.STOP:
            counts["finished"] += 1
            if case.tools:
                ok = bool(out.tool_calls) and all(
                    valid(case.tools.get(c.name, {"not": {}}), c.arguments) for c in out.tool_calls
                )
            else:
                ok = valid(case.schema, out.content)
            counts["valid"] += ok
        elif out.finish_reason is FinishReason.ERROR:
            error = out.error or ""
            counts["out_of_tries" if any(s in error for s in OUT_OF_TRIES) else "errors"] += 1
        elif out.finish_reason is FinishReason.LENGTH:
            counts["length"] += 1
    return counts


def _tool_fields(model: Any, compiler: Any, tools: list[dict[str, Any]]) -> tuple[dict[str, Any], Any]:
    """The request fields and constraint of ``tool_choice: "required"`` with parallel calls."""
    from thinkstruct import Constraint
    from thinkstruct.parsers.tool_calls import get_tool_call_syntax, tool_call_structural_tag
    from thinkstruct.parsers.tool_calls.types import ToolSchemas
    from thinkstruct.server.tools import ToolPlan

    syntax = get_tool_call_syntax(model.family.tool_call_syntax)
    names = tuple(t["function"]["name"] for t in tools)
    plan = ToolPlan(
        tools=tools,
        schemas=ToolSchemas.from_tools(tools),
        choice="required",
        allowed=names,
        parallel=True,
        syntax=syntax,
    )
    if syntax.form is None:
        raise SystemExit("the embedded model's call syntax is not constrained")
    tag = tool_call_structural_tag(
        syntax.form,
        [(n, plan.schemas.parameters[n]) for n in names],
        mode="required",
        parallel=True,
        max_whitespace=compiler.config.json_format.max_whitespace,
    )
    return {"tool_calls": plan.reading()}, Constraint.structural_tag(tag)


def all_cases(maskbench: list[str]) -> list[Any]:
    """The satisfiable cases of :mod:`checked_cases`, then the MaskBench schemas named."""
    from checked_cases import CheckedCase, schema_question, sweep_cases
    from coverage import load_maskbench

    schemas = {case.name: case.schema for case in load_maskbench()} if maskbench else {}
    extra = [
        CheckedCase(
            f"maskbench {name}", schemas[name], schema_question(schemas[name]), chat=True, max_tokens=200
        )
        for name in maskbench
    ]
    return [*sweep_cases(), *extra]


def pick_maskbench(count: int) -> list[str]:
    """The first ``count`` MaskBench schemas that strict ``auto`` compiles with checks
    (on this tree)."""
    from thinkstruct.engine import load_model
    from thinkstruct.grammar.service.compiler import GrammarCompiler

    if count == 0:
        return []
    with GrammarCompiler(load_model(progress=False).tokenizer) as compiler:
        return [case.name for case in checked_maskbench(compiler, count)]


def checked_maskbench(compiler: Any, count: int) -> list[Any]:
    """The first ``count`` MaskBench cases that strict ``auto`` compiles with checks on
    ``compiler``."""
    from coverage import load_maskbench
    from thinkstruct import Constraint
    from thinkstruct.errors import InvalidConstraint

    picked: list[Any] = []
    for case in load_maskbench():
        if len(picked) >= count:
            break
        try:
            grammar = compiler.compile(Constraint.json_schema(case.schema), strict=True)
        except InvalidConstraint:
            continue
        if grammar.checks is not None:
            picked.append(case)
    return picked


def worker(indexes: list[int], seeds: int, maskbench: list[str]) -> None:
    """Run the cases at ``indexes`` (of :func:`all_cases`) on the tree ``PYTHONPATH``
    names; one JSON line per case on stdout."""
    from thinkstruct.engine import Engine, EngineConfig, load_model
    from thinkstruct.grammar.service.compiler import GrammarCompiler

    cases = all_cases(maskbench)
    model = load_model(progress=False)
    with (
        GrammarCompiler(model.tokenizer) as compiler,
        Engine(model, config=EngineConfig(max_batch=6), compiler=compiler) as engine,
    ):
        for index in indexes:
            counts = run_case(cases[index], model, compiler, engine, seeds=seeds)
            print(json.dumps({"index": index, **counts}), flush=True)


def _side(src: Path, indexes: list[int], seeds: int, maskbench: list[str]) -> dict[int, dict[str, int]]:
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_WAIT_POLICY": "PASSIVE"}
    command = [
        sys.executable,
        str(Path(__file__)),
        "--worker",
        ",".join(map(str, indexes)),
        "--seeds",
        str(seeds),
        "--maskbench-names",
        ",".join(maskbench),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the worker on {src} failed:\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {row.pop("index"): row for row in rows}


def compare(
    before: Path, *, after: Path = THIS_TREE, seeds: int, chunk: int, only: str | None, maskbench: int
) -> None:
    """Both trees over every case (see the module doc) and ``maskbench`` MaskBench
    schemas compiled with checks; prints a table."""
    names = pick_maskbench(maskbench)
    cases = all_cases(names)
    chosen = [i for i, c in enumerate(cases) if only is None or only in c.name]
    results: dict[str, dict[int, dict[str, int]]] = {"before": {}, "after": {}}
    sides = {"before": before, "after": after}
    started = time.perf_counter()
    for n, at in enumerate(range(0, len(chosen), chunk)):
        part = chosen[at : at + chunk]
        for name in ("before", "after") if n % 2 == 0 else ("after", "before"):
            results[name].update(_side(sides[name], part, seeds, names))
        print(f"  cases {part[0]}-{part[-1]} done ({time.perf_counter() - started:.0f} s)", flush=True)
    print(f"\n{seeds} seeds per case, temperature 1, thinking off; before: {before}, after: {after}")
    print(f"{'case':34s} | {'side':6s} | " + " | ".join(f"{c:>12s}" for c in COLUMNS))
    totals = {name: dict.fromkeys(COLUMNS, 0) for name in sides}
    for index in chosen:
        for name in sides:
            row = results[name][index]
            for column in COLUMNS:
                totals[name][column] += row[column]
            label = cases[index].name[:34] if name == "before" else ""
            print(f"{label:34s} | {name:6s} | " + " | ".join(f"{row[c]:12d}" for c in COLUMNS))
    for name, row in totals.items():
        print(f"{'all cases':34s} | {name:6s} | " + " | ".join(f"{row[c]:12d}" for c in COLUMNS))
    print(
        "\nreproduce: python benchmarks/checked.py --sweep "
        f"--before {before} --after {after} --seeds {seeds} --chunk {chunk} --maskbench {maskbench}"
        + (f" --only {only!r}" if only else "")
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--worker", help="run these case indexes (comma-separated) on PYTHONPATH's tree")
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument("--maskbench-names", default="", help="MaskBench schemas after the cases")
    options = parser.parse_args()
    sys.path.insert(0, str(HERE))
    if options.worker is None:
        raise SystemExit("run benchmarks/checked.py --sweep")
    names = [n for n in options.maskbench_names.split(",") if n]
    worker([int(i) for i in options.worker.split(",")], options.seeds, names)


if __name__ == "__main__":
    main()
