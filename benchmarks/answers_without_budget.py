"""Constrained requests with thinking on and no ``max_reasoning_tokens``: do they answer?

Against a running ``thinkstruct serve`` (the embedded SmolLM2 thinks by default), sends
thirteen requests — seven ``json_schema`` questions at ``max_tokens`` 200 and
400, a ``choice`` at 10, a ``regex`` at 30, three tool calls forced by name at 120 — once
per seed, at the default temperature, 8 at a time, and prints per kind how many ended with
a valid answer (the schema validates, the choice is an option, the regex full-matches,
the call's arguments validate), ``length`` with empty content (the thought took every
token), ``length`` with a cut answer, or an invalid finished answer.

    thinkstruct serve --port 8000 &
    python benchmarks/answers_without_budget.py --url http://127.0.0.1:8000 --seeds 2
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import re
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


SCHEMAS = [
    (
        "Describe a person called Ada who is 36 years old, as JSON.",
        _object({"name": {"type": "string", "minLength": 1, "maxLength": 40}, "age": {"type": "integer"}}),
    ),
    (
        "Which city is the capital of France? Answer as JSON.",
        _object(
            {"city": {"type": "string", "maxLength": 30}, "country": {"enum": ["France", "Germany", "Other"]}}
        ),
    ),
    ("What is 12 + 30? Answer as JSON.", _object({"answer": {"type": "integer"}})),
    (
        "Name one or two colors of the sky, as a JSON list.",
        {
            "type": "array",
            "items": {"enum": ["red", "green", "blue", "yellow"]},
            "minItems": 1,
            "maxItems": 3,
        },
    ),
    (
        "Review: 'Great food, slow service.' Give the sentiment and a score as JSON.",
        _object(
            {
                "sentiment": {"enum": ["positive", "negative", "neutral"]},
                "score": {"type": "integer", "minimum": 1, "maximum": 5},
            }
        ),
    ),
    (
        "Name a famous novel and its year, as JSON.",
        _object({"title": {"type": "string", "maxLength": 60}, "year": {"type": "integer", "minimum": 1000}}),
    ),
    ("Is water wet? Answer as JSON.", _object({"ok": {"type": "boolean"}})),
]
CHOICES = ["Paris", "London", "Berlin"]
DATE = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
WEATHER = _object(
    {"city": {"type": "string", "maxLength": 40}, "days": {"type": "integer", "minimum": 1, "maximum": 7}}
)
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}

Case = tuple[str, dict[str, Any], str, Any]


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def cases(seed: int) -> Iterator[Case]:
    """(kind, request fields, how to check it, what to check against)."""
    for question, schema in SCHEMAS:
        for max_tokens in (200, 400):
            fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": True}}
            body = {"messages": _user(question), "max_tokens": max_tokens, "response_format": fmt}
            yield f"json_schema@{max_tokens}", body, "schema", schema
    capital = _user("What is the capital of France?")
    yield (
        "choice@10",
        {"messages": capital, "max_tokens": 10, "extra_body": {"choice": CHOICES}},
        "choice",
        CHOICES,
    )
    apollo = _user("When did Apollo 11 land? Give the date.")
    yield "regex@30", {"messages": apollo, "max_tokens": 30, "extra_body": {"regex": DATE}}, "regex", DATE
    for city in ("Paris", "Tokyo", "Lima"):
        body = {
            "messages": _user(f"What will the weather be in {city} for the next 3 days?"),
            "max_tokens": 120,
            "tools": [TOOL],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        }
        yield "tool@120", body, "tool", WEATHER


def verdict(choice: Any, check: str, against: Any) -> str:
    message = choice.message
    if choice.finish_reason == "length":
        return "length, cut answer" if message.content or message.tool_calls else "length, empty"
    try:
        if check == "schema":
            jsonschema.validate(json.loads(message.content), against)
        elif check == "choice":
            if message.content not in against:
                return "invalid"
        elif check == "regex":
            if not re.fullmatch(against, message.content):
                return "invalid"
        else:
            if choice.finish_reason != "tool_calls" or not message.tool_calls:
                return "invalid"
            for call in message.tool_calls:
                jsonschema.validate(json.loads(call.function.arguments), against)
    except (ValueError, jsonschema.ValidationError):
        return "invalid"
    return "valid"


async def run(url: str, seeds: int) -> None:
    client = openai.AsyncOpenAI(base_url=url.rstrip("/") + "/v1", api_key="none", max_retries=0, timeout=1800)
    model = (await client.models.list()).data[0].id
    jobs = [(seed, case) for seed in range(seeds) for case in cases(seed)]
    limit = asyncio.Semaphore(8)

    async def one(seed: int, case: Case) -> tuple[str, str]:
        kind, body, check, against = case
        async with limit:
            answer = await client.chat.completions.create(model=model, seed=seed, **body)
        return kind, verdict(answer.choices[0], check, against)

    results = await asyncio.gather(*(one(seed, case) for seed, case in jobs))
    columns = ["valid", "length, empty", "length, cut answer", "invalid"]
    table: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for kind, outcome in results:
        table[kind][outcome] += 1
    table["all"] = sum(table.values(), collections.Counter())
    print(f"{'requests':18}" + "".join(f"{c:>20}" for c in columns))
    for kind, counts in table.items():
        print(f"{kind:18}" + "".join(f"{counts[c]:>20}" for c in columns))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the server's base URL")
    parser.add_argument("--seeds", type=int, default=2, help="each request once per seed 0..N-1")
    args = parser.parse_args()
    asyncio.run(run(args.url, args.seeds))


if __name__ == "__main__":
    main()
