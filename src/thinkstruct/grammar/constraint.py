"""What a request asks its answer to match: :class:`Constraint`.

A constraint is immutable and hashable; with the backend and its options it is the
compile-cache key. Constructors parse and canonicalise their input (so two spellings of
the same schema share one cache entry only when their JSON is identical, keys in the same
order: key order is meaningful to every backend) and reject input that cannot be a
constraint at all with :class:`~thinkstruct.InvalidConstraint`.
"""

from __future__ import annotations

import enum
import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from thinkstruct.errors import InvalidConstraint

#: Deepest nesting of arrays/objects accepted in a schema or structural tag document.
MAX_NESTING_DEPTH = 64


class ConstraintKind(str, enum.Enum):
    JSON_SCHEMA = "json_schema"
    JSON_OBJECT = "json_object"
    REGEX = "regex"
    EBNF = "ebnf"
    STRUCTURAL_TAG = "structural_tag"
    CHOICE = "choice"

    @classmethod
    def parse(cls, kind: str | ConstraintKind) -> ConstraintKind:
        try:
            return cls(kind)
        except ValueError:
            known = ", ".join(k.value for k in cls)
            raise InvalidConstraint(f"unknown constraint kind {kind!r}; known kinds: {known}") from None


@dataclass(frozen=True, slots=True)
class Constraint:
    """A constraint on the answer: ``kind`` and its canonical ``value``.

    ``value`` is canonical text: compact JSON (keys in their given order) for
    ``json_schema`` and ``structural_tag``, the pattern for ``regex``, the grammar for
    ``ebnf``, ``""`` for ``json_object``, and a JSON list of strings for ``choice``.
    Build one with the class methods rather than the constructor.
    """

    kind: ConstraintKind
    value: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", ConstraintKind.parse(self.kind))
        if not isinstance(self.value, str):
            raise InvalidConstraint(
                f"constraint value must be text, got {type(self.value).__name__}",
                kind=self.kind.value,
            )
        try:
            self.value.encode("utf-8")
        except UnicodeEncodeError as e:  # a lone surrogate: no backend can represent it
            raise InvalidConstraint(
                f"lone surrogate U+{ord(self.value[e.start]):04X} is not a character (not valid UTF-8)",
                position=e.start,
                kind=self.kind.value,
            ) from None

    # ---- constructors -------------------------------------------------------------

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any] | bool | str) -> Constraint:
        """A JSON Schema (a dict, a boolean schema, or its JSON text)."""
        doc = _load_json(schema, ConstraintKind.JSON_SCHEMA)
        if not isinstance(doc, (dict, bool)):
            raise InvalidConstraint(
                f"a JSON schema must be an object or a boolean, got {type(doc).__name__}",
                pointer="",
                kind="json_schema",
            )
        return cls(ConstraintKind.JSON_SCHEMA, _dump_json(doc, ConstraintKind.JSON_SCHEMA))

    @classmethod
    def json_object(cls) -> Constraint:
        """Any JSON object (OpenAI's ``response_format={"type": "json_object"}``)."""
        return cls(ConstraintKind.JSON_OBJECT, "")

    @classmethod
    def regex(cls, pattern: str) -> Constraint:
        """A regular expression the whole answer must match."""
        _require_text(pattern, ConstraintKind.REGEX)
        return cls(ConstraintKind.REGEX, pattern)

    @classmethod
    def ebnf(cls, grammar: str) -> Constraint:
        """An EBNF grammar in GBNF style (``root ::= ...``)."""
        _require_text(grammar, ConstraintKind.EBNF)
        return cls(ConstraintKind.EBNF, grammar)

    @classmethod
    def structural_tag(cls, tag: Mapping[str, Any] | str) -> Constraint:
        """A structural tag: the legacy ``{structures, triggers}`` form or the ``{format}`` form."""
        doc = _load_json(tag, ConstraintKind.STRUCTURAL_TAG)
        if not isinstance(doc, dict):
            raise InvalidConstraint(
                "a structural tag must be a JSON object", pointer="", kind="structural_tag"
            )
        return cls(ConstraintKind.STRUCTURAL_TAG, _dump_json(doc, ConstraintKind.STRUCTURAL_TAG))

    @classmethod
    def choice(cls, options: Sequence[str]) -> Constraint:
        """Exactly one of the given strings."""
        if isinstance(options, str) or not isinstance(options, Sequence):
            raise InvalidConstraint("choice needs a list of strings", kind="choice")
        if not options:
            raise InvalidConstraint("choice needs at least one option", kind="choice")
        for i, option in enumerate(options):
            if not isinstance(option, str):
                raise InvalidConstraint(
                    f"option must be a string, got {type(option).__name__}",
                    pointer=f"/{i}",
                    kind="choice",
                )
        return cls(ConstraintKind.CHOICE, _dump_json(list(options), ConstraintKind.CHOICE))

    # ---- views ----------------------------------------------------------------------

    @property
    def document(self) -> Any:
        """The parsed JSON value (schema, structural tag, or list of choices).

        Shared between calls: treat it as read-only (copy before changing it).
        """
        if self.kind in (
            ConstraintKind.JSON_SCHEMA,
            ConstraintKind.STRUCTURAL_TAG,
            ConstraintKind.CHOICE,
        ):
            return _parsed(self.value)
        if self.kind is ConstraintKind.JSON_OBJECT:
            return {"type": "object"}
        raise TypeError(f"a {self.kind.value} constraint has no JSON document")

    def __repr__(self) -> str:
        shown = self.value if len(self.value) <= 60 else self.value[:57] + "..."
        return f"Constraint({self.kind.value}, {shown!r})"


@functools.lru_cache(maxsize=256)
def _parsed(value: str) -> Any:
    # Validation, planning and compiling each read the document of one constraint.
    return json.loads(value)


def _require_text(value: object, kind: ConstraintKind) -> None:
    if not isinstance(value, str):
        raise InvalidConstraint(f"expected text, got {type(value).__name__}", kind=kind.value)
    if not value:
        raise InvalidConstraint("must not be empty", kind=kind.value)


def _load_json(value: object, kind: ConstraintKind) -> Any:
    if isinstance(value, (bytes, bytearray)):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidConstraint("not valid UTF-8", position=e.start, kind=kind.value) from None
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as e:
        raise InvalidConstraint(
            f"malformed JSON: {e.msg} (line {e.lineno}, column {e.colno})",
            position=e.pos,
            kind=kind.value,
        ) from None
    except RecursionError:
        raise InvalidConstraint(f"nesting deeper than {MAX_NESTING_DEPTH} levels", kind=kind.value) from None


def _dump_json(doc: Any, kind: ConstraintKind) -> str:
    _check_depth(doc, kind)
    try:
        text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise InvalidConstraint(f"not representable as JSON: {e}", kind=kind.value) from None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        _refuse_surrogate(doc, kind)
    return text


def _refuse_surrogate(doc: Any, kind: ConstraintKind) -> None:
    """Raise naming the JSON pointer of the first string (or key) with a lone surrogate
    (``"\\ud800"`` parses to one; it is not a character, so no backend can match it)."""
    stack: list[tuple[Any, str]] = [(doc, "")]
    while stack:
        node, pointer = stack.pop()
        if isinstance(node, dict):
            for key, child in reversed(list(node.items())):
                if not _encodable(key):
                    # The pointer names the object: the key itself cannot be printed.
                    raise InvalidConstraint(
                        f"the key {key!r} holds a lone surrogate (\\ud800-\\udfff alone is not a character)",
                        pointer=pointer,
                        kind=kind.value,
                    )
                stack.append((child, f"{pointer}/{escape_pointer(key)}"))
        elif isinstance(node, list):
            stack.extend((child, f"{pointer}/{i}") for i, child in reversed(list(enumerate(node))))
        elif isinstance(node, str) and not _encodable(node):
            raise InvalidConstraint(
                "the string holds a lone surrogate (\\ud800-\\udfff alone is not a character)",
                pointer=pointer,
                kind=kind.value,
            )


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_depth(doc: Any, kind: ConstraintKind) -> None:
    if _within_depth(doc):
        return
    _name_depth_error(doc, kind)


def _within_depth(doc: Any) -> bool:
    """Whether every node is within the nesting limit and every key a string, walking
    containers only and building no pointer strings (the walk that names the offending
    pointer runs only when this one fails)."""
    if not isinstance(doc, (dict, list)):
        return True
    # Iterative, so a hostile document cannot exhaust the Python stack here.
    stack: list[tuple[Any, int]] = [(doc, 0)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node
        if depth >= MAX_NESTING_DEPTH and children:
            return False
        if isinstance(node, dict) and not all(isinstance(key, str) for key in node):
            return False
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return True


def _name_depth_error(doc: Any, kind: ConstraintKind) -> None:
    """Raise naming the JSON pointer of the first node too deep or key not a string."""
    stack: list[tuple[Any, str, int]] = [(doc, "", 0)]
    while stack:
        node, pointer, depth = stack.pop()
        if depth > MAX_NESTING_DEPTH:
            raise InvalidConstraint(
                f"nesting deeper than {MAX_NESTING_DEPTH} levels",
                pointer=pointer,
                kind=kind.value,
            )
        if isinstance(node, dict):
            for key, child in node.items():
                if not isinstance(key, str):
                    raise InvalidConstraint(
                        f"object keys must be strings, got {key!r}", pointer=pointer, kind=kind.value
                    )
                stack.append((child, f"{pointer}/{escape_pointer(key)}", depth + 1))
        elif isinstance(node, list):
            for i, child in enumerate(node):
                stack.append((child, f"{pointer}/{i}", depth + 1))


def escape_pointer(token: str) -> str:
    """Escape one JSON pointer reference token (RFC 6901)."""
    return token.replace("~", "~0").replace("/", "~1")
