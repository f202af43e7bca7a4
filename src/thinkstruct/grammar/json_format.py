"""The one JSON text format every backend is configured to.

Backends disagree by default (xgrammar's strict mode wants ``", "`` and ``": "``,
llguidance's wants ``,`` and ``:``; outlines-core's regex allows runs of any length). A
model that may emit an unbounded whitespace run can loop on blank lines until
``max_tokens``, so thinkstruct configures every backend to the same format: compact
separators, and at each place JSON allows whitespace, a run of at most
:attr:`JsonFormat.max_whitespace` of JSON's whitespace characters (space, newline,
carriage return, tab).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Characters a whitespace run may contain.
WHITESPACE_CHARS = " \n\r\t"


@dataclass(frozen=True, slots=True)
class JsonFormat:
    """Whitespace allowed between JSON tokens.

    Args:
        max_whitespace: longest run of whitespace characters (space, ``\\n``, ``\\r``, ``\\t``)
            allowed at any one place between JSON tokens. 0 means no whitespace at all.
    """

    max_whitespace: int = 2

    def __post_init__(self) -> None:
        if not 0 <= self.max_whitespace <= 256:
            raise ValueError("max_whitespace must be between 0 and 256")

    @classmethod
    def compact(cls) -> JsonFormat:
        """The default: ``{"a":1,"b":[2,3]}``, with at most 2 whitespace characters at any
        one place (so ``{"a": 1, "b": [2, 3]}`` is accepted too)."""
        return cls(max_whitespace=2)

    @classmethod
    def flexible(cls, max_whitespace: int = 24) -> JsonFormat:
        """Room for pretty-printed JSON (a newline and indentation), still bounded."""
        return cls(max_whitespace=max_whitespace)

    @property
    def whitespace_regex(self) -> str:
        """The regex of one whitespace run, e.g. ``[ \\n\\r\\t]{0,2}``."""
        return f"[ \\n\\r\\t]{{0,{self.max_whitespace}}}" if self.max_whitespace else ""


#: The default format (:meth:`JsonFormat.compact`), for use as a default argument.
COMPACT = JsonFormat()
