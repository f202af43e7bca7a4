"""Writers of tool calls in each syntax, the way the models write them (test helper).

``write(syntax, calls)`` renders ``[(name, arguments dict), ...]`` as one answer's call
text; the tests parse it back and stream it in random chunks.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

Call = tuple[str, dict[str, Any]]


def _j(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _xml_value(value: Any) -> str:
    return value if isinstance(value, str) else _j(value)


def _py(value: Any) -> str:
    return repr(value)


def _gemma(value: Any) -> str:
    if isinstance(value, str):
        return '<|"|>' + value + '<|"|>'
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_gemma(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_gemma(v) for v in value) + "]"
    return _j(value)


def hermes(calls: list[Call]) -> str:
    return "\n".join(
        f'<tool_call>\n{{"name": {_j(n)}, "arguments": {_j(a)}}}\n</tool_call>' for n, a in calls
    )


def hermes_list(calls: list[Call]) -> str:
    return (
        "<tool_call>["
        + ", ".join(f'{{"name": {_j(n)}, "arguments": {_j(a)}}}' for n, a in calls)
        + "]</tool_call>"
    )


def qwen_xml(calls: list[Call]) -> str:
    out = []
    for n, a in calls:
        params = "".join(f"<parameter={k}>\n{_xml_value(v)}\n</parameter>\n" for k, v in a.items())
        out.append(f"<tool_call>\n<function={n}>\n{params}</function>\n</tool_call>")
    return "\n".join(out)


def llama3(calls: list[Call]) -> str:
    return "; ".join(f'{{"name": {_j(n)}, "parameters": {_j(a)}}}' for n, a in calls)


def mistral(calls: list[Call]) -> str:
    return "".join(f"[TOOL_CALLS]{n}[ARGS]{_j(a)}" for n, a in calls)


def mistral_list(calls: list[Call]) -> str:
    return "[TOOL_CALLS][" + ", ".join(f'{{"name": {_j(n)}, "arguments": {_j(a)}}}' for n, a in calls) + "]"


def deepseek_v3(calls: list[Call]) -> str:
    body = "\n".join(
        f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{n}\n```json\n{_j(a)}\n```<｜tool▁call▁end｜>"
        for n, a in calls
    )
    return f"<｜tool▁calls▁begin｜>{body}<｜tool▁calls▁end｜>"


def deepseek_v31(calls: list[Call]) -> str:
    body = "".join(f"<｜tool▁call▁begin｜>{n}<｜tool▁sep｜>{_j(a)}<｜tool▁call▁end｜>" for n, a in calls)
    return f"<｜tool▁calls▁begin｜>{body}<｜tool▁calls▁end｜>"


def dsml(calls: list[Call], block: str = "tool_calls") -> str:
    out = [f"<｜DSML｜{block}>\n"]
    for n, a in calls:
        out.append(f'<｜DSML｜invoke name="{n}">\n')
        for k, v in a.items():
            flag = "true" if isinstance(v, str) else "false"
            out.append(f'<｜DSML｜parameter name="{k}" string="{flag}">{_xml_value(v)}</｜DSML｜parameter>\n')
        out.append("</｜DSML｜invoke>\n")
    out.append(f"</｜DSML｜{block}>")
    return "".join(out)


def kimi(calls: list[Call]) -> str:
    body = "".join(
        f"<|tool_call_begin|>functions.{n}:{i}<|tool_call_argument_begin|>{_j(a)}<|tool_call_end|>"
        for i, (n, a) in enumerate(calls)
    )
    return f"<|tool_calls_section_begin|>{body}<|tool_calls_section_end|>"


def glm45(calls: list[Call]) -> str:
    return "\n".join(
        f"<tool_call>{n}\n"
        + "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{_xml_value(v)}</arg_value>\n" for k, v in a.items())
        + "</tool_call>"
        for n, a in calls
    )


def glm47(calls: list[Call]) -> str:
    return "".join(
        f"<tool_call>{n}"
        + "".join(f"<arg_key>{k}</arg_key><arg_value>{_xml_value(v)}</arg_value>" for k, v in a.items())
        + "</tool_call>"
        for n, a in calls
    )


def harmony(calls: list[Call]) -> str:
    return "".join(
        f"<|start|>assistant<|channel|>commentary to=functions.{n} <|constrain|>json<|message|>{_j(a)}<|call|>"
        for n, a in calls
    )


def pythonic(calls: list[Call]) -> str:
    return (
        "["
        + ", ".join(f"{n}(" + ", ".join(f"{k}={_py(v)}" for k, v in a.items()) + ")" for n, a in calls)
        + "]"
    )


def minimax(calls: list[Call]) -> str:
    out = ["<minimax:tool_call>\n"]
    for n, a in calls:
        out.append(f'<invoke name="{n}">\n')
        out.extend(f'<parameter name="{k}">{_xml_value(v)}</parameter>\n' for k, v in a.items())
        out.append("</invoke>\n")
    out.append("</minimax:tool_call>")
    return "".join(out)


def gemma4(calls: list[Call]) -> str:
    return "".join(
        f"<|tool_call>call:{n}{{" + ",".join(f"{k}:{_gemma(v)}" for k, v in a.items()) + "}<tool_call|>"
        for n, a in calls
    )


def hunyuan(calls: list[Call]) -> str:
    return (
        "<tool_calls>["
        + ", ".join(f'{{"name": {_j(n)}, "arguments": {_j(a)}}}' for n, a in calls)
        + "]</tool_calls>"
    )


def granite(calls: list[Call]) -> str:
    return "<|tool_call|>[" + ", ".join(f'{{"name": {_j(n)}, "arguments": {_j(a)}}}' for n, a in calls) + "]"


def cohere(calls: list[Call]) -> str:
    return (
        "<|START_ACTION|>["
        + ", ".join(
            f'{{"tool_call_id": "{i}", "tool_name": {_j(n)}, "parameters": {_j(a)}}}'
            for i, (n, a) in enumerate(calls)
        )
        + "]<|END_ACTION|>"
    )


# (writer label, syntax name, writer, leading only, values that are text must be plain text)
WRITERS: list[tuple[str, str, Callable[[list[Call]], str], bool]] = [
    ("hermes", "hermes", hermes, False),
    ("hermes-list", "hermes", hermes_list, False),
    ("qwen3-coder-xml", "hermes", qwen_xml, False),
    ("llama3-json", "llama3-json", llama3, True),
    ("mistral", "mistral", mistral, False),
    ("mistral-list", "mistral", mistral_list, False),
    ("deepseek-v3", "deepseek-v3", deepseek_v3, False),
    ("deepseek-v3.1", "deepseek-v3", deepseek_v31, False),
    ("dsml-v4", "dsml", dsml, False),
    ("dsml-v3.2", "dsml", lambda calls: dsml(calls, "function_calls"), False),
    ("kimi-k2", "kimi-k2", kimi, False),
    ("glm45", "glm45", glm45, False),
    ("glm47", "glm45", glm47, False),
    ("harmony", "harmony", harmony, False),
    ("pythonic", "pythonic", pythonic, True),
    ("minimax-m2", "minimax-m2", minimax, False),
    ("gemma4", "gemma4", gemma4, False),
    ("hunyuan", "hunyuan", hunyuan, False),
    ("granite", "granite", granite, False),
    ("cohere", "cohere", cohere, False),
]

# Syntaxes that write every value as text: a value's type comes from the tool's schema.
TEXT_VALUED = {"qwen3-coder-xml", "glm45", "glm47", "minimax-m2"}


def tools_for(calls: list[Call]) -> list[dict[str, Any]]:
    """OpenAI tools whose parameter schemas fit ``calls`` (one type per key)."""
    names = {
        str: "string",
        bool: "boolean",
        int: "integer",
        float: "number",
        list: "array",
        dict: "object",
        type(None): "null",
    }
    tools: dict[str, dict[str, Any]] = {}
    for name, args in calls:
        props = tools.setdefault(name, {"type": "object", "properties": {}})["properties"]
        for key, value in args.items():
            props[key] = {"type": names[type(value)]}
    return [{"type": "function", "function": {"name": n, "parameters": p}} for n, p in tools.items()]
