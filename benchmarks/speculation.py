"""Speculative decoding (n-gram drafts) on and off, one request at a time, side by side.

Two engines over the same loaded model (the embedded SmolLM2, by default with the
quantization ``thinkstruct serve`` picks for it: its GGUF blocks; ``--quantize
int8-weights`` for int8 weights), one with speculation, one without; each prompt runs on
both, the side that goes first alternating prompt by prompt. Thinking off, greedy.

Workloads:

- **extraction**: a record (a customer order, an employee file, ...) in the prompt and a
  JSON schema of its fields: the answer copies names, addresses and numbers from the
  prompt, what n-gram drafts predict;
- **free**: short open questions, free text (drafts rarely right: shows what trying
  costs);
- **8 clients**: the extraction prompts, 8 at once (more rows than speculation drafts
  for until the batch thins out): the time until all 8 are done.

Prints tokens/s per side, the ratio, draft tokens accepted per draft token fed, and
whether the answers are identical (they must be: the runner is batch-invariant); under
each workload, the decoding passes of each side and what the kept drafts would give were
a pass of several positions as cheap as a pass of one (the bound on this machine is that
cost: here the extra positions are int16 dot products at the VNNI instructions' rate).

    python benchmarks/speculation.py [--rounds 2] [--quantize auto|int8-weights|gguf] [--config JSON]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from thinkstruct import Constraint
from thinkstruct.engine import Engine, EngineConfig, GenerationRequest, SamplingParams, load_model
from thinkstruct.engine.sampling.speculation import SpeculationConfig
from thinkstruct.parsers import render_chat

RECORDS = [
    (
        "Order 48213 was placed on 2026-03-14 by Margaret Okonkwo-Lindqvist, 17 Harbour View Road, "
        "Kingston upon Thames, KT1 2QD, United Kingdom. Items: 3 x Walnut Bookshelf (SKU WB-2291) at "
        "149.99 GBP, 1 x Brass Reading Lamp (SKU BRL-0087) at 64.50 GBP. Delivery: standard courier, "
        "phone +44 20 7946 0321, email m.okonkwo-lindqvist@example.co.uk.",
        {
            "order_id": {"type": "string"},
            "customer_name": {"type": "string"},
            "street": {"type": "string"},
            "city": {"type": "string"},
            "postcode": {"type": "string"},
            "email": {"type": "string"},
            "phone": {"type": "string"},
            "first_item_sku": {"type": "string"},
        },
    ),
    (
        "Employee file: Dr. Anselm Ravindranath-Kowalczyk, born 1984-11-02 in Gdansk, Poland. "
        "Position: Principal Research Engineer, Department of Computational Linguistics, badge "
        "number RX-559-201. Office: Building C, Room 4.117, Ostravska 22, 70200 Ostrava. "
        "Manager: Professor Helena Zimmermann-Oduya. Start date 2019-06-01.",
        {
            "full_name": {"type": "string"},
            "birth_date": {"type": "string"},
            "birth_place": {"type": "string"},
            "position": {"type": "string"},
            "department": {"type": "string"},
            "badge_number": {"type": "string"},
            "office": {"type": "string"},
            "manager": {"type": "string"},
        },
    ),
    (
        "Incident report INC-2026-000731: on 2026-09-30 at 14:22 UTC the payment gateway "
        "eu-west-payments-03 returned HTTP 502 for 11 minutes. Root cause: expired TLS "
        "certificate on load balancer lb-frankfurt-edge-7. Reported by Tomasz Wieczorek-Hallberg, "
        "on-call engineer, team Platform Reliability. Customers affected: 1,842.",
        {
            "incident_id": {"type": "string"},
            "date": {"type": "string"},
            "service": {"type": "string"},
            "root_cause": {"type": "string"},
            "load_balancer": {"type": "string"},
            "reported_by": {"type": "string"},
            "team": {"type": "string"},
        },
    ),
]

QUESTIONS = [
    "Give three tips for keeping houseplants healthy.",
    "What is the difference between weather and climate?",
    "Describe a sunrise over the sea in two sentences.",
]


def _prompt(model: Any, text: str) -> list[int]:
    rendered = render_chat(
        [{"role": "user", "content": text}],
        family=model.family,
        tokenizer=model.tokenizer,
        chat_template=model.chat_template,
        chat_template_kwargs={"enable_thinking": False},
    )
    return list(model.tokenizer.hf.encode(rendered.text, add_special_tokens=False))


def _jobs(model: Any, compiler: Any) -> dict[str, list[tuple[list[int], Any, int]]]:
    extraction = []
    for record, props in RECORDS:
        schema = {
            "type": "object",
            "properties": props,
            "required": list(props),
            "additionalProperties": False,
        }
        text = f"Extract these fields as JSON: {', '.join(props)}.\n\n{record}"
        extraction.append((_prompt(model, text), compiler.compile(Constraint.json_schema(schema)), 200))
    free = [(_prompt(model, q), None, 96) for q in QUESTIONS]
    return {"extraction": extraction, "free": free}


def _run(engine: Engine, ids: list[int], grammar: Any, max_tokens: int) -> tuple[float, tuple[int, ...]]:
    start = time.perf_counter()
    out = engine.submit(
        GenerationRequest(
            prompt_ids=ids, sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0), grammar=grammar
        )
    ).wait()
    return time.perf_counter() - start, tuple(out.token_ids)


def _run_many(engine: Engine, items: list[tuple[list[int], Any, int]]) -> tuple[float, list[tuple[int, ...]]]:
    start = time.perf_counter()
    handles = [
        engine.submit(
            GenerationRequest(
                prompt_ids=ids,
                sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0),
                grammar=grammar,
            )
        )
        for ids, grammar, max_tokens in items
    ]
    outs = [tuple(h.wait().token_ids) for h in handles]
    return time.perf_counter() - start, outs


def _bound(seconds: dict[str, float], passes: dict[str, tuple[int, float]]) -> str:
    """What the drafts as kept allow: the ratio were every decoding pass "on" (several
    positions: the drafts checked) as cheap as one "off" (one position and its forced
    tokens), the rest of each request (prefill, scheduling) as measured."""
    (n_on, s_on), (n_off, s_off) = passes["on"], passes["off"]
    if not n_on or not n_off:
        return "no decoding passes"
    one = s_off / n_off
    bound = seconds["off"] / (seconds["on"] - s_on + n_on * one)
    return (
        f"decoding passes: {n_on} on ({1000 * s_on / n_on:.2f} ms each), {n_off} off ({1000 * one:.2f} ms);"
        f" were a pass on as cheap as one off: {bound:.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quantize", default="auto", help="as thinkstruct serve's --quantize (default auto)")
    parser.add_argument(
        "--config",
        type=json.loads,
        default={},
        help='SpeculationConfig fields for the "on" side as JSON, e.g. \'{"position_cost": 0.2}\'',
    )
    args = parser.parse_args()
    model = load_model(quantize=args.quantize, progress=False)
    config = SpeculationConfig(**args.config)
    print(f"SmolLM2-135M-Instruct, quantize={model.quantize}, {config}")
    on = Engine(model, config=EngineConfig(speculation=config, prefix_cache_bytes=0)).start()
    off = Engine(
        model, config=EngineConfig(speculation=None, prefix_cache_bytes=0), compiler=on.compiler
    ).start()
    sides = [("on", on), ("off", off)]
    try:
        jobs = _jobs(model, on.compiler)
        for engine in (on, off):  # warm-up: kernels, first passes
            _run(engine, jobs["free"][0][0], None, 4)
        print(
            f"{'workload':<11} {'tokens':>7} {'on tok/s':>9} {'off tok/s':>10} {'on/off':>7} {'accepted':>9} {'same':>5}"
        )
        for name, items in jobs.items():
            seconds = {"on": 0.0, "off": 0.0}
            tokens = 0
            same = True
            drafted0, kept0 = on.stats.draft_tokens, on.stats.accepted_draft_tokens
            passes0 = {side: (e.stats.steps, e.stats.step_seconds) for side, e in sides}
            ratios = []
            for r in range(args.rounds):
                for k, (ids, grammar, max_tokens) in enumerate(items):
                    order = sides if (r + k) % 2 == 0 else sides[::-1]
                    got = {}
                    for side, engine in order:
                        elapsed, out = _run(engine, ids, grammar, max_tokens)
                        seconds[side] += elapsed
                        got[side] = (elapsed, out)
                    same &= got["on"][1] == got["off"][1]
                    tokens += len(got["on"][1])
                    ratios.append(got["off"][0] / got["on"][0])
            drafted = on.stats.draft_tokens - drafted0
            kept = on.stats.accepted_draft_tokens - kept0
            print(
                f"{name:<11} {tokens:>7} {tokens / seconds['on']:>9.1f} {tokens / seconds['off']:>10.1f}"
                f" {seconds['off'] / seconds['on']:>6.2f}x {kept / max(drafted, 1):>8.0%} {same!s:>5}"
                f"   (per request: median {statistics.median(ratios):.2f}x)"
            )
            passes = {
                side: (e.stats.steps - passes0[side][0], e.stats.step_seconds - passes0[side][1])
                for side, e in sides
            }
            print("  " + _bound(seconds, passes))
        seconds = {"on": 0.0, "off": 0.0}
        same = True
        batch = [jobs["extraction"][k % len(jobs["extraction"])] for k in range(8)]
        for r in range(args.rounds):
            order = sides if r % 2 == 0 else sides[::-1]
            got = {}
            for side, engine in order:
                elapsed, outs = _run_many(engine, batch)
                seconds[side] += elapsed
                got[side] = outs
            same &= got["on"] == got["off"]
        tokens = args.rounds * sum(len(t) for t in got["on"])
        print(
            f"{'8 clients':<11} {tokens:>7} {tokens / seconds['on']:>9.1f} {tokens / seconds['off']:>10.1f}"
            f" {seconds['off'] / seconds['on']:>6.2f}x {'':>9} {same!s:>5}"
        )
        sample_ids, sample_grammar, _ = jobs["extraction"][0]
        print(
            "extraction answer:",
            json.dumps(model.tokenizer.decode(list(_run(on, sample_ids, sample_grammar, 200)[1]))),
        )
    finally:
        on.close()
        off.close()


if __name__ == "__main__":
    main()
