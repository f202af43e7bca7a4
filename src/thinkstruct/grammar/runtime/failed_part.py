"""Where in a value that failed its check the part to draw again starts:
:func:`failed_part`.

A value check (:mod:`~thinkstruct.grammar.runtime.value_checks`) validates a value as it
closes; the error ``jsonschema`` reports may be about a member of it (``then`` failing on
a sibling's ``legs``), or about the value wanting more (``minContains``, ``required``),
which another item or member mends. The engine draws again from the part the error is
about (:mod:`thinkstruct.engine.output.checked_answer`), so the failure starts there;
where the error says what the part must be (a ``const`` or ``enum``, a ``multipleOf``
between bounds), the failure says so too, and the engine bans at once every token that cannot begin one of those values.

Units: character offsets into the value's text.
"""

from __future__ import annotations

import decimal
import json
import math
from typing import Any

from thinkstruct.grammar.schema.prefix_checks import finite_values

#: Errors about a container itself that more items or members can mend: a failure of one
#: starts at the closing bracket, so only the closing is drawn again.
_WANTS_MORE = frozenset(
    {"contains", "minContains", "required", "dependentRequired", "minProperties", "minItems"}
)
#: Schema keywords under which a ``const``/``enum`` error is one alternative among others
#: (or about keys): it does not say what the value must be.
_ALTERNATIVES = frozenset({"anyOf", "oneOf", "not", "propertyNames", "contains"})


#: The most multiples of a bounded ``multipleOf`` spelled out as the values a failed
#: number must be one of (more: any other number may do).
_MOST_MULTIPLES = 1000


def failed_part(text: str, error: Any, *, closing: bool) -> tuple[int, tuple[Any, ...] | None]:
    """``(offset, expected)`` of the failed value ``text`` and its ``jsonschema`` error
    (``closing``: a container that just closed): where the part to draw again starts
    (the closing bracket where more items or members mend it), and the scalars that
    part must be one of, or ``None`` where any other value may do."""
    if closing and not error.absolute_path and error.validator in _WANTS_MORE:
        return len(text) - 1, None
    offset, found = _culprit_offset(text, error)
    return offset, _expected(error) if found else None


def _culprit_offset(text: str, error: Any) -> tuple[int, bool]:
    """Where in a failed value's ``text`` the part its error is about starts (``then``
    failing on a sibling's ``legs``: that member's value), so that only it is drawn
    again, and whether that is the part the error names: 0 (the whole value) where the
    error is about the value itself, about property names (the part is a key, not the
    value under it), or where the part is not found."""
    path = list(error.absolute_path)
    if not path:
        return 0, True
    if "propertyNames" in error.absolute_schema_path:
        return 0, False
    offset = _value_offset(text, path)
    return (0, False) if offset is None else (offset, True)


def _expected(error: Any) -> tuple[Any, ...] | None:
    """The scalars a value must be one of, where ``error`` (not under an alternative)
    says so: a ``const`` or ``enum``, or a ``multipleOf`` between bounds that allow at
    most :data:`_MOST_MULTIPLES` of them."""
    if _ALTERNATIVES.intersection(str(step) for step in error.absolute_schema_path):
        return None
    if error.validator in ("const", "enum"):
        return finite_values({str(error.validator): error.validator_value})
    if error.validator == "multipleOf" and isinstance(error.schema, dict):
        return _multiples(error.schema)
    return None


def _multiples(schema: dict[str, Any]) -> tuple[Any, ...] | None:
    """The multiples of ``schema``'s ``multipleOf`` within its bounds (each whole one as
    an integer and, for a ``number``, also as a float: ``1`` and ``1.0``), or ``None``
    where a bound is missing or there are too many."""
    step, low, high = (_decimal(schema.get(k)) for k in ("multipleOf", "minimum", "maximum"))
    above, below = _decimal(schema.get("exclusiveMinimum")), _decimal(schema.get("exclusiveMaximum"))
    if step is None or step <= 0:
        return None
    starts = [math.ceil(low / step)] if low is not None else []
    if above is not None:
        starts.append(math.floor(above / step) + 1)
    ends = [math.floor(high / step)] if high is not None else []
    if below is not None:
        ends.append(math.ceil(below / step) - 1)
    if not starts or not ends:
        return None
    first, last = max(starts), min(ends)
    if not 0 < last - first + 1 <= _MOST_MULTIPLES:
        return None
    whole_only = schema.get("type") == "integer"
    values: list[Any] = []
    for k in range(first, last + 1):
        value = step * k
        if value == value.to_integral_value():
            values.append(int(value))
            if not whole_only:
                values.append(float(value))
        elif not whole_only:
            values.append(float(value))
    return tuple(values) or None


def _decimal(value: Any) -> decimal.Decimal | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return decimal.Decimal(str(value))


def _value_offset(text: str, path: list[Any]) -> int | None:
    """The offset in ``text`` (one JSON value) of the value at ``path``, or ``None``."""
    decoder = json.JSONDecoder()
    pos = _skip_space(text, 0)
    for step in path:
        opening = text[pos : pos + 1]
        if opening not in ("{", "[") or isinstance(step, int) != (opening == "["):
            return None
        pos = _skip_space(text, pos + 1)
        index = 0
        while text[pos : pos + 1] not in ("}", "]", ""):
            if opening == "{":
                key, pos = json.decoder.scanstring(text, pos + 1)  # type: ignore[attr-defined]
                pos = _skip_space(text, _skip_space(text, pos) + 1)  # past the colon
                found = key == step
            else:
                found = index == step
            if found:
                break
            _, pos = decoder.raw_decode(text, pos)
            pos = _skip_space(text, pos)
            if text[pos : pos + 1] == ",":
                pos = _skip_space(text, pos + 1)
            index += 1
        else:
            return None
    return pos


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\n\r":
        pos += 1
    return pos


__all__ = ["failed_part"]
