"""Speculative decoding (n-gram drafts) on and off, one request at a time, side by side.

Two sides, each an engine in its own process over the embedded SmolLM2 (by default with
the quantization ``thinkstruct serve`` picks for it: its GGUF blocks; ``--quantize
int8-weights`` for int8 weights), one with speculation, one without, each alone on the
machine (``alone.py``: started after the machine is quiet, ended with everything it
started before the other side starts), the side that goes first alternating round by
round. In a round a side runs every workload below once, after a warm-up. Thinking off,
greedy, no prefix cache.

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
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import alone

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
    from thinkstruct.parsers import render_chat

    rendered = render_chat(
        [{"role": "user", "content": text}],
        family=model.family,
        tokenizer=model.tokenizer,
        chat_template=model.chat_template,
        chat_template_kwargs={"enable_thinking": False},
    )
    return list(model.tokenizer.hf.encode(rendered.text, add_special_tokens=False))


def _jobs(model: Any, compiler: Any) -> dict[str, list[tuple[list[int], Any, int]]]:
    from thinkstruct import Constraint

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


def _worker(job: dict[str, Any]) -> dict[str, Any]:
    """One side: an engine with speculation (``job["config"]``: its fields) or without
    (``None``). Per workload: each request's (seconds, tokens) and the engine's counters."""
    from thinkstruct.engine import Engine, EngineConfig, GenerationRequest, SamplingParams, load_model
    from thinkstruct.engine.sampling.speculation import SpeculationConfig

    model = load_model(quantize=job["quantize"], progress=False)
    speculation = None if job["config"] is None else SpeculationConfig(**job["config"])
    engine = Engine(model, config=EngineConfig(speculation=speculation, prefix_cache_bytes=0)).start()

    def submit(ids: list[int], grammar: Any, max_tokens: int) -> Any:
        sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0)
        return engine.submit(GenerationRequest(prompt_ids=ids, sampling=sampling, grammar=grammar))

    try:
        jobs = _jobs(model, engine.compiler)
        submit(jobs["free"][0][0], None, 4).wait()  # warm-up: kernels, first passes
        out: dict[str, Any] = {"quantize": model.quantize, "config": str(speculation)}
        batch = [jobs["extraction"][k % len(jobs["extraction"])] for k in range(8)]
        for name, items in (*jobs.items(), ("8 clients", batch)):
            stats = engine.stats
            before = (stats.draft_tokens, stats.accepted_draft_tokens, stats.steps, stats.step_seconds)
            if name == "8 clients":
                start = time.perf_counter()
                handles = [submit(*item) for item in items]
                answers = [list(h.wait().token_ids) for h in handles]
                requests = [(time.perf_counter() - start, sum(map(len, answers)))]
            else:
                requests, answers = [], []
                for item in items:
                    start = time.perf_counter()
                    answers.append(list(submit(*item).wait().token_ids))
                    requests.append((time.perf_counter() - start, len(answers[-1])))
            after = (stats.draft_tokens, stats.accepted_draft_tokens, stats.steps, stats.step_seconds)
            drafted, kept, steps, step_s = (b - a for a, b in zip(before, after, strict=True))
            out[name] = {"requests": requests, "answers": answers, "drafted": drafted, "kept": kept,
                         "passes": [steps, step_s]}  # fmt: skip
        out["sample"] = model.tokenizer.decode(out["extraction"]["answers"][0])
        return out
    finally:
        engine.close()


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
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    alone.add_arguments(parser)
    args = parser.parse_args()
    if args.worker:
        alone.worker_main(_worker)
        return
    print(alone.header())
    configs = {"on": args.config, "off": None}
    results: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
    runs = []
    env = {"OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}  # as thinkstruct serve
    for r in range(args.rounds):
        for side in alone.rotation(list(configs), r):
            argv = [sys.executable, os.path.abspath(__file__), "--worker"]
            worker = alone.Worker(side, argv, rule=alone.quiet_rule(args), env=env)
            result, run = worker.run({"quantize": args.quantize, "config": configs[side]})
            results[side].append(result)
            runs.append(run)
        print(alone.round_report(r + 1, runs[-len(configs) :]), flush=True)
    first = results["on"][0]
    print(f"SmolLM2-135M-Instruct, quantize={first['quantize']}, {first['config']}")
    print(
        f"{'workload':<11} {'tokens':>7} {'on tok/s':>9} {'off tok/s':>10} {'on/off':>7} {'accepted':>9} {'same':>5}"
    )
    for name in ("extraction", "free", "8 clients"):
        on = [x[name] for x in results["on"]]
        off = [x[name] for x in results["off"]]
        seconds = {
            side: sum(s for w in rounds for s, _ in w["requests"])
            for side, rounds in (("on", on), ("off", off))
        }
        tokens = sum(n for w in on for _, n in w["requests"])
        same = all(a["answers"] == b["answers"] for a, b in zip(on, off, strict=True))
        ratios = [
            b[0] / a[0]
            for x, y in zip(on, off, strict=True)
            for a, b in zip(x["requests"], y["requests"], strict=True)
        ]
        drafted, kept = sum(w["drafted"] for w in on), sum(w["kept"] for w in on)
        accepted = f"{kept / max(drafted, 1):>8.0%}" if name != "8 clients" else ""
        per_request = (
            f"   (per request: median {statistics.median(ratios):.2f}x)" if name != "8 clients" else ""
        )
        print(
            f"{name:<11} {tokens:>7} {tokens / seconds['on']:>9.1f} {tokens / seconds['off']:>10.1f}"
            f" {seconds['off'] / seconds['on']:>6.2f}x {accepted:>9} {same!s:>5}{per_request}"
        )
        if name != "8 clients":
            passes = {
                side: (sum(w["passes"][0] for w in rounds), sum(w["passes"][1] for w in rounds))
                for side, rounds in (("on", on), ("off", off))
            }
            print("  " + _bound(seconds, passes))
    print("extraction answer:", json.dumps(first["sample"]))
    print(alone.summary(runs))


if __name__ == "__main__":
    main()
