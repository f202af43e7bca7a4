"""Which tokens to forbid where a failed part of a checked answer is drawn again:
:class:`TokenBans`.

A value that breaks a checked keyword is taken back to its first drawn token, and that
token is banned at its position (:mod:`~thinkstruct.engine.output.checked_answer`). Where
the failure says more, every token that would fail the same way is banned at once, so
that one more draw can mend it:

- a container closed too early (the failure starts at its closing bracket, or at the
  separator before a member it may not hold): every token that writes that bracket or
  separator there, whatever whitespace it carries (``]``, `` ]``, ``\\n]``);
- a part that must be one of a few scalars (:attr:`CheckFailure.expected`: a ``const``
  or ``enum`` the error names, the values that make up ``minContains``): every token
  that cannot begin one of their JSON texts from what is already written.

Units: token ids; texts are each token's bytes decoded alone (``U+FFFD`` for a byte of a
character split across tokens: such a token is never banned for its text).
"""

from __future__ import annotations

import bisect
import json
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from thinkstruct.engine.output.detokenizer import TokenTexts

_WHITESPACE = " \t\n\r"
#: What may stand before a value in the token that begins it (whitespace, a separator, an
#: opening bracket of the container it is in).
_BEFORE_VALUE = _WHITESPACE + ",:[{"
#: What may follow a scalar in the token that ends it.
_AFTER_SCALAR = frozenset(_WHITESPACE + ",]}")
#: Characters a failure may start at that close a container or begin another member.
STRUCTURAL = frozenset(",]}")
#: Ban sets kept per vocabulary (most recent first out).
_CACHED = 256


class TokenBans:
    """The ban sets of one vocabulary (shared; :meth:`of`)."""

    def __init__(self, texts: TokenTexts) -> None:
        self._texts = texts
        self._strings: list[str] | None = None
        self._cache: dict[tuple[Any, ...], frozenset[int]] = {}

    @classmethod
    def of(cls, texts: TokenTexts) -> TokenBans:
        """The shared instance for ``texts``."""
        found = _shared.get(texts)
        if found is None:
            found = _shared[texts] = cls(texts)
        return found

    def structural(self, head: str, char: str) -> frozenset[int]:
        """Tokens that write ``char`` (one of :data:`STRUCTURAL`) after ``head`` (the text
        the banned token held before it), whitespace anywhere before ``char``."""
        prefix = _squeeze(head) + char
        return self._cached(("structural", prefix), lambda s: _squeeze(s).startswith(prefix))

    def beginning_none_of(self, written: str, expected: tuple[Any, ...]) -> frozenset[int]:
        """Tokens that, after ``written`` (the part's text so far; ``""``: the part starts
        in the token), cannot continue toward the JSON text of any of ``expected``."""
        targets = Targets(expected)

        def banned(s: str) -> bool:
            value = written + s if written else s.lstrip(_BEFORE_VALUE)
            return bool(value) and not targets.toward(value)

        return self._cached(("values", written, targets.texts), banned)

    def _cached(self, key: tuple[Any, ...], banned: Any) -> frozenset[int]:
        found = self._cache.get(key)
        if found is None:
            strings = self._decoded()
            found = frozenset(i for i, s in enumerate(strings) if s and "\ufffd" not in s and banned(s))
            if len(self._cache) >= _CACHED:
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = found
        return found

    def _decoded(self) -> list[str]:
        if self._strings is None:
            texts = self._texts
            self._strings = [texts[i].decode("utf-8", "replace") for i in range(len(texts))]
        return self._strings


_shared: weakref.WeakKeyDictionary[TokenTexts, TokenBans] = weakref.WeakKeyDictionary()


def _squeeze(text: str) -> str:
    return "".join(c for c in text if c not in _WHITESPACE)


class Targets:
    """The JSON texts of some scalars (``expected``), sorted, to ask of a text whether it
    can still become one of them."""

    def __init__(self, expected: tuple[Any, ...]) -> None:
        self.texts = tuple(
            sorted({json.dumps(v, ensure_ascii=False, separators=(",", ":")) for v in expected})
        )
        self._set = frozenset(self.texts)

    def toward(self, value: str) -> bool:
        """Whether text ``value`` begins one of the texts, or is one of them followed by
        what ends a scalar."""
        at = bisect.bisect_left(self.texts, value)
        if at < len(self.texts) and self.texts[at].startswith(value):
            return True
        return any(value[j] in _AFTER_SCALAR and value[:j] in self._set for j in range(1, len(value)))


__all__ = ["STRUCTURAL", "Targets", "TokenBans"]
