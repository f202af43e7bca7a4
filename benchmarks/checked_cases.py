"""The checked-keyword cases: schemas whose keywords no grammar enforces, each with the
prompt that makes sampling held only by the grammar likely to break it.

One table for ``benchmarks/checked.py`` (the 30-seed sweep of requests out of tries, and
the checked/unchecked comparison) and the engine tests of checked keywords
(``tests/engine/test_checked_*.py``), which run a few of the same seeds exactly.

A case's prompt is either the raw text encoded (``chat=False``, as the keyword tests
feed it) or one user turn through the model's chat template with thinking off
(``chat=True``, as a server renders it). ``tools`` cases hold a tool call's arguments to
the tools' schemas (``tool_choice: "required"``, parallel calls, in the family's call
syntax) instead of the answer to ``schema``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

COLORS = ["red", "green", "blue"]


def _object(properties: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties),
            "additionalProperties": False, **more}  # fmt: skip


@dataclass(frozen=True)
class CheckedCase:
    """One schema and how it is asked for.

    Attributes:
        name: a short label (the keyword it is about).
        schema: the answer's JSON Schema (for a ``tools`` case: ``{}``).
        prompt: the user's text.
        chat: rendered as one user turn with the chat template (else the text encoded).
        backend: the grammar backend asked for (``auto``, or the one that does not enforce
            the keyword where ``auto``'s does).
        max_tokens: the answer's token budget.
        satisfiable: some answer meets the schema.
        tools: tool name -> arguments schema, for a tool-call case.
    """

    name: str
    schema: dict[str, Any]
    prompt: str
    chat: bool = False
    backend: str = "auto"
    max_tokens: int = 48
    satisfiable: bool = True
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)


#: One per checked keyword (``tests/engine/test_checked_each_keyword.py``).
KEYWORD_CASES: dict[str, CheckedCase] = {
    case.name: case
    for case in [
        CheckedCase(
            "not",
            _object({"colour": {"type": "string", "maxLength": 8, "not": {"enum": ["red", "Red", "RED"]}}}),
            "Give JSON. The colour is red.",
        ),
        CheckedCase(
            "oneOf",
            _object(
                {
                    "x": {
                        "oneOf": [
                            {"type": "integer", "minimum": 0, "maximum": 50},
                            {"type": "integer", "minimum": 10, "maximum": 99},
                        ]
                    }
                }
            ),
            "Give JSON. x is 20.",
        ),
        CheckedCase(
            "if",
            _object(
                {"kind": {"enum": ["cat", "dog"]}, "legs": {"type": "integer", "minimum": 0, "maximum": 9}},
                **{
                    "if": {"properties": {"kind": {"const": "cat"}}},
                    "then": {"properties": {"legs": {"const": 3}}},
                },
            ),
            "Give JSON: a cat with 4 legs.",
        ),
        CheckedCase(
            "minContains",
            {
                "type": "array",
                "items": {"type": "integer", "minimum": 0, "maximum": 9},
                "minItems": 3,
                "maxItems": 3,
                "contains": {"const": 5},
                "minContains": 2,
            },
            "Give a JSON array of 3 digits: 1, 2, 3.",
        ),
        CheckedCase(
            "propertyNames",
            {
                "type": "object",
                "additionalProperties": {"type": "integer"},
                "propertyNames": {"pattern": "^[a-z]+$"},
                "minProperties": 1,
                "maxProperties": 2,
            },
            "Give JSON: Apples 3, Pears 4.",
        ),
        CheckedCase(
            "unevaluatedProperties",
            {
                "type": "object",
                "allOf": [{"properties": {"a": {"type": "integer"}}}],
                "unevaluatedProperties": False,
                "required": ["a"],
            },
            "Give JSON with a=1 and b=2.",
        ),
        CheckedCase(
            "multipleOf",
            _object({"price": {"type": "number", "multipleOf": 0.25, "minimum": 0, "maximum": 10}}),
            "Give JSON. The price is 3.14.",
            backend="xgrammar",
        ),
        CheckedCase(
            "format",
            _object({"day": {"type": "string", "format": "date"}}),
            "Give JSON. The day is 2024-02-31, the 31st of February.",
            backend="xgrammar",
        ),
    ]
}

#: Three different colours of three (``tests/engine/test_checked_answer.py``).
UNIQUE = CheckedCase(
    "uniqueItems",
    {"type": "array", "items": {"enum": COLORS}, "minItems": 3, "maxItems": 3, "uniqueItems": True},
    "Give JSON. Colors: red, red, red.",
    max_tokens=80,
)

#: Two different items that must both be "x": no answer meets it.
UNMEETABLE = CheckedCase(
    "uniqueItems of one const",
    _object(
        {
            "tags": {
                "type": "array",
                "items": {"const": "x"},
                "minItems": 2,
                "maxItems": 2,
                "uniqueItems": True,
            }
        }
    ),
    "Give JSON.",
    max_tokens=60,
    satisfiable=False,
)

#: At least two 7s among two to four digits.
SEVENS = {
    "type": "array",
    "items": {"type": "integer", "minimum": 0, "maximum": 9},
    "minItems": 2,
    "maxItems": 4,
    "contains": {"const": 7},
    "minContains": 2,
}

#: A flag of three different stripes, and a wall with more than one coat, asked for what
#: breaks both (``tests/engine/test_checked_tool_calls.py``).
FLAG = _object(
    {
        "stripes": {
            "type": "array",
            "items": {"enum": COLORS},
            "minItems": 3,
            "maxItems": 3,
            "uniqueItems": True,
        }
    }
)
WALL = _object(
    {"color": {"enum": COLORS}, "coats": {"type": "integer", "minimum": 1, "maximum": 3, "not": {"const": 1}}}
)
PAINT = CheckedCase(
    "tool arguments",
    {},
    "Paint a flag with stripes red, red and red, and paint the wall with one coat.",
    chat=True,
    max_tokens=80,
    tools={"paint_flag": FLAG, "paint_wall": WALL},
)

#: One per keyword, asked through the chat template with the schema in the question.
SCHEMA_CASES: dict[str, dict[str, Any]] = {
    "uniqueItems": UNIQUE.schema,
    "not const": _object({"color": {"type": "string", "not": {"const": "red"}, "maxLength": 10}}),
    "format email": _object({"email": {"type": "string", "format": "email", "maxLength": 40}}),
    "format date": _object({"born": {"type": "string", "format": "date", "maxLength": 12}}),
    "multipleOf 0.25": _object(
        {"price": {"type": "number", "multipleOf": 0.25, "minimum": 0, "maximum": 100}}
    ),
    "maxContains": {
        "type": "array",
        "items": {"enum": COLORS},
        "minItems": 3,
        "maxItems": 4,
        "contains": {"const": "red"},
        "maxContains": 1,
    },
    "if/then/else": _object(
        {"kind": {"enum": ["cat", "dog"]}, "sound": {"enum": ["meow", "woof"]}},
        **{
            "if": {"properties": {"kind": {"const": "cat"}}},
            "then": {"properties": {"sound": {"const": "meow"}}},
            "else": {"properties": {"sound": {"const": "woof"}}},
        },
    ),
    "propertyNames": {
        "type": "object",
        "additionalProperties": {"type": "integer"},
        "propertyNames": {"pattern": "^[a-z]{1,8}$"},
        "minProperties": 1,
        "maxProperties": 3,
    },
    "minContains of 7": SEVENS,
}


def valid(schema: Any, text: str) -> bool:
    """Whether ``text`` is JSON that ``schema`` accepts (formats asserted)."""
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema, format_checker=jsonschema.FormatChecker())
    except (ValueError, jsonschema.ValidationError, jsonschema.SchemaError):
        return False
    return True


def schema_question(schema: dict[str, Any]) -> str:
    """The user's turn asking for one value of ``schema``."""
    return "Reply with one JSON value for this JSON Schema:\n" + json.dumps(schema)[:1500]


def sweep_cases() -> list[CheckedCase]:
    """Every satisfiable case of the tests and the benchmark, each once."""
    asked = [
        CheckedCase(f"asked: {name}", schema, schema_question(schema), chat=True, max_tokens=200)
        for name, schema in SCHEMA_CASES.items()
    ]
    return [*KEYWORD_CASES.values(), UNIQUE, PAINT, *asked]


__all__ = [
    "COLORS",
    "FLAG",
    "KEYWORD_CASES",
    "PAINT",
    "SCHEMA_CASES",
    "SEVENS",
    "UNIQUE",
    "UNMEETABLE",
    "WALL",
    "CheckedCase",
    "schema_question",
    "sweep_cases",
    "valid",
]
