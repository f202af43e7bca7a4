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

Prints a table and asserts nothing.

    python benchmarks/checked.py [--seeds 5] [--maskbench 8] [--max-tokens 200]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import jsonschema

sys.path.insert(0, str(Path(__file__).resolve().parent))

from coverage import load_maskbench
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
from thinkstruct.errors import InvalidConstraint
from thinkstruct.grammar.service.compiler import GrammarCompiler

COLORS = ["red", "green", "blue"]
KEYWORD_SCHEMAS: dict[str, dict[str, Any]] = {
    "uniqueItems": {
        "type": "array",
        "items": {"enum": COLORS},
        "minItems": 3,
        "maxItems": 3,
        "uniqueItems": True,
    },
    "not const": {
        "type": "object",
        "properties": {"color": {"type": "string", "not": {"const": "red"}, "maxLength": 10}},
        "required": ["color"],
        "additionalProperties": False,
    },
    "format email": {
        "type": "object",
        "properties": {"email": {"type": "string", "format": "email", "maxLength": 40}},
        "required": ["email"],
        "additionalProperties": False,
    },
    "format date": {
        "type": "object",
        "properties": {"born": {"type": "string", "format": "date", "maxLength": 12}},
        "required": ["born"],
        "additionalProperties": False,
    },
    "multipleOf 0.25": {
        "type": "object",
        "properties": {"price": {"type": "number", "multipleOf": 0.25, "minimum": 0, "maximum": 100}},
        "required": ["price"],
        "additionalProperties": False,
    },
    "maxContains": {
        "type": "array",
        "items": {"enum": COLORS},
        "minItems": 3,
        "maxItems": 4,
        "contains": {"const": "red"},
        "maxContains": 1,
    },
    "if/then": {
        "type": "object",
        "properties": {"kind": {"enum": ["cat", "dog"]}, "sound": {"enum": ["meow", "woof"]}},
        "required": ["kind", "sound"],
        "additionalProperties": False,
        "if": {"properties": {"kind": {"const": "cat"}}},
        "then": {"properties": {"sound": {"const": "meow"}}},
        "else": {"properties": {"sound": {"const": "woof"}}},
    },
    "propertyNames": {
        "type": "object",
        "additionalProperties": {"type": "integer"},
        "propertyNames": {"pattern": "^[a-z]{1,8}$"},
        "minProperties": 1,
        "maxProperties": 3,
    },
}


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


def valid(schema: Any, text: str) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema, format_checker=jsonschema.FormatChecker())
    except (ValueError, jsonschema.ValidationError, jsonschema.SchemaError):
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--maskbench", type=int, default=8, help="MaskBench schemas compiled with checks")
    parser.add_argument("--max-tokens", type=int, default=200)
    options = parser.parse_args()
    model = load_model(progress=False)
    schemas = dict(KEYWORD_SCHEMAS)
    with (
        GrammarCompiler(model.tokenizer) as compiler,
        Engine(model, config=EngineConfig(max_batch=4)) as engine,
    ):
        taken = 0
        for case in load_maskbench():
            if taken >= options.maskbench:
                break
            try:
                grammar = compiler.compile(Constraint.json_schema(case.schema), strict=True)
            except InvalidConstraint:
                continue
            if grammar.checks is not None:
                schemas[f"maskbench {case.name}"[:40]] = case.schema
                taken += 1
        sides = {"checked": Side(), "unchecked": Side()}
        print(
            f"{len(schemas)} schemas x {options.seeds} seeds, temperature 1, max_tokens {options.max_tokens}"
        )
        for name, schema in schemas.items():
            grammars = {
                "checked": compiler.compile(Constraint.json_schema(schema), strict=True),
                "unchecked": compiler.compile(Constraint.json_schema(schema), strict=False),
            }
            question = "Reply with one JSON value for this JSON Schema:\n" + json.dumps(schema)[:1500]
            ids = chat_prompt_ids(model, question)
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
