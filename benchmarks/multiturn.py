"""Multi-turn chat and an agent loop over HTTP: time to first token of each later turn,
its history taken from the prefix cache, beside a cold prompt of the same length.

Starts ``thinkstruct serve`` (the embedded model) as its own process, after the machine is
quiet (``alone.py``); both sides of the comparison are requests to that one server, since
its prefix cache is what is measured. Two workloads:

- **chat**: a ~1,500-token document in the first user message, then ``--turns`` questions
  about it; each turn's history is the conversation so far, the model's own answers
  included.
- **agent**: the same document, then ``--turns`` steps where the model must call a tool
  (``tool_choice`` names it) and gets a tool result (~100 tokens) back.

For every turn after the first, two requests are sent one after the other, their order
alternating turn by turn: the turn itself (its history cached by the turns before) and
the same messages behind a fresh nonce in the system prompt (nothing cached: a cold
prompt of the same length). Time to first token is the first streamed chunk carrying
text, reasoning or a tool call; ``cached`` is ``usage.prompt_tokens_details.cached_tokens``
over the previous turn's prompt tokens. Thinking is off (the turn's answers stay short:
``--max-tokens``).

    python benchmarks/multiturn.py [--turns 10] [--max-tokens 24]

Targets: later turns' time to first token <= 0.15x a cold prompt of the same
length; cached tokens >= 90 % of the previous turn's prompt.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from typing import Any

import openai

import alone

_FACTS = (
    "The harbour city of Veloria was founded by salt traders in the year {y}.",
    "Its {n}th district is known for copper roofs and a market that opens before dawn.",
    "Records from {y} mention a bridge of {n} arches over the river Ost.",
    "The archive lists {n} guilds, the oldest of them dating to {y}.",
    "In {y} a flood reached the {n}th step of the cathedral stairs.",
)

TOOL = {
    "type": "function",
    "function": {
        "name": "lookup_record",
        "description": "Look up an archive record of Veloria by year.",
        "parameters": {
            "type": "object",
            "properties": {"year": {"type": "integer"}, "topic": {"type": "string"}},
            "required": ["year", "topic"],
        },
    },
}


def document(tokens: int = 1500) -> str:
    """Deterministic prose of about ``tokens`` tokens (SmolLM2's tokenizer: ~20 a line)."""
    lines = []
    for i in range(tokens // 20):
        lines.append(_FACTS[i % len(_FACTS)].format(y=1200 + 7 * i, n=3 + i % 40))
    return " ".join(lines)


def _ask(
    client: openai.OpenAI, model: str, messages: list[dict[str, Any]], max_tokens: int, **extra: Any
) -> tuple[float, dict[str, Any], int, int]:
    """(time to first token, the assistant message to append, prompt tokens, cached tokens)."""
    start = time.perf_counter()
    first: float | None = None
    text: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    prompt = cached = 0
    stream = client.chat.completions.create(
        model=model,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
        temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        **extra,
    )
    for chunk in stream:
        if chunk.usage is not None:
            prompt = chunk.usage.prompt_tokens
            details = chunk.usage.prompt_tokens_details
            cached = details.cached_tokens or 0 if details is not None else 0
        for choice in chunk.choices:
            delta = choice.delta
            if first is None and (
                delta.content or delta.tool_calls or (delta.model_extra or {}).get("reasoning_content")
            ):
                first = time.perf_counter() - start
            if delta.content:
                text.append(delta.content)
            for call in delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                entry["id"] = call.id or entry["id"]
                if call.function is not None:
                    entry["name"] += call.function.name or ""
                    entry["arguments"] += call.function.arguments or ""
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
    if calls:
        message["tool_calls"] = [
            {
                "id": c["id"] or f"call_{i}",
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
            }
            for i, c in sorted(calls.items())
        ]
    return (first if first is not None else time.perf_counter() - start), message, prompt, cached


def run(
    client: openai.OpenAI, model: str, workload: str, turns: int, max_tokens: int
) -> list[tuple[float, float, float]]:
    """Per later turn: (warm TTFT, cold TTFT, cached / previous prompt)."""
    system = {"role": "system", "content": "You answer questions about the document the user gives, briefly."}
    messages: list[dict[str, Any]] = [
        system,
        {"role": "user", "content": f"Here is a document.\n\n{document()}\n\nWhen was Veloria founded?"},
    ]
    extra: dict[str, Any] = {}
    if workload == "agent":
        extra = {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "lookup_record"}}}
    _, reply, previous_prompt, _ = _ask(client, model, messages, max_tokens, **extra)
    rows = []
    for turn in range(1, turns):
        messages.append(reply)
        if workload == "agent" and reply.get("tool_calls"):
            for call in reply["tool_calls"]:
                result = document(100).replace("Veloria", f"Veloria (record {turn})")
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        else:
            messages.append({"role": "user", "content": f"And what does the document say about step {turn}?"})
        cold_messages = [{**system, "content": f"[{uuid.uuid4().hex}] {system['content']}"}, *messages[1:]]
        if turn % 2:
            warm, reply_next, prompt, cached = _ask(client, model, messages, max_tokens, **extra)
            cold, _, _, cold_cached = _ask(client, model, cold_messages, max_tokens, **extra)
        else:
            cold, _, _, cold_cached = _ask(client, model, cold_messages, max_tokens, **extra)
            warm, reply_next, prompt, cached = _ask(client, model, messages, max_tokens, **extra)
        rows.append((warm, cold, cached / previous_prompt))
        print(
            f"  {workload} turn {turn + 1:>2}: prompt {prompt:>5} tokens, cached {cached:>5}"
            f" ({cached / previous_prompt:>5.1%} of the previous prompt; cold side {cold_cached}),"
            f" TTFT {warm * 1000:>6.0f} ms vs cold {cold * 1000:>6.0f} ms ({warm / cold:.3f}x)",
            flush=True,
        )
        reply, previous_prompt = reply_next, prompt
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--workloads", nargs="+", default=["chat", "agent"], choices=["chat", "agent"])
    alone.add_arguments(parser)
    args = parser.parse_args()
    print(alone.header())
    port = alone.free_port()
    with alone.Server(
        "serve", alone.thinkstruct_serve(port=port), port=port, rule=alone.quiet_rule(args)
    ) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=600)
        model = client.models.list().data[0].id
        _ask(client, model, [{"role": "user", "content": "hi"}], 2)  # warm-up
        print(
            f"{'workload':<8} {'turns':>5} {'TTFT warm p50':>14} {'cold p50':>9} {'ratio p50':>10} {'ratio max':>10} {'cached min':>11}"
        )
        summary = []
        for workload in args.workloads:
            rows = run(client, model, workload, args.turns, args.max_tokens)
            ratios = [w / c for w, c, _ in rows]
            summary.append(
                f"{workload:<8} {len(rows):>5} {statistics.median(w for w, _, _ in rows) * 1000:>11.0f} ms"
                f" {statistics.median(c for _, c, _ in rows) * 1000:>6.0f} ms {statistics.median(ratios):>10.3f}"
                f" {max(ratios):>10.3f} {min(s for _, _, s in rows):>10.1%}"
            )
        print("\n".join(summary))


if __name__ == "__main__":
    main()
