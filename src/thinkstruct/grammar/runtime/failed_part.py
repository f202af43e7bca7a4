"""Where in a value that failed its check the part to draw again starts:
:func:`failed_part`.

A value check (:mod:`~thinkstruct.grammar.runtime.value_checks`) validates a value as it
closes; the error ``jsonschema`` reports may be about a member of it (``then`` failing on
a sibling's ``legs``), or about the value wanting more (``minContains``, ``required``),
which another item or member mends. The engine draws again from the part the error is
about (:mod:`thinkstruct.engine.output.checked_answer`), so the failure starts there;
where the error says what the part must be (a ``const`` or ``enum``), the failure says
so too, and the engine bans at once every token that cannot begin one of those values.

Units: character offsets into the value's text.
"""

from __future__ import annotations

import json
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
    """The scalars a value must be one of, where ``error`` (a ``const`` or ``enum``
    not under an alternative) says so."""
    if error.validator not in ("const", "enum"):
        return None
    if _ALTERNATIVES.intersection(str(step) for step in error.absolute_schema_path):
        return None
    return finite_values({str(error.validator): error.validator_value})


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
