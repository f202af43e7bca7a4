"""A small, thread-safe registry of named entries (grammar backends, reasoning families,
completion templates, tool-call syntaxes).

Entries are keyed by their ``name`` attribute. A registration under a taken name needs
``override=True``; an unknown name raises :class:`~thinkstruct.errors.UnknownName`
listing the known ones. The registry's *kind* (``"reasoning family"``) labels its errors.
A module that keeps one exports its bound methods under its own names
(``register_reasoning_family = _families.register``). Package-level because every layer
above the tokenizer keeps one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from thinkstruct.errors import DuplicateName, UnknownName


class _Named(Protocol):
    @property
    def name(self) -> str: ...


T = TypeVar("T", bound=_Named)


class Registry(Generic[T]):
    """Entries of type ``item_type`` by name; ``kind`` names them in error messages.

    Args:
        check: called with each entry before it is registered; raises (``ValueError``)
            for an entry of the right type that is still unusable.
    """

    def __init__(self, kind: str, item_type: type[T], *, check: Callable[[T], None] | None = None) -> None:
        self.kind = kind
        self.item_type = item_type
        self._check = check
        self._lock = threading.Lock()
        self._items: dict[str, T] = {}

    def register(self, item: T, *, override: bool = False) -> None:
        """Add ``item``; an existing name needs ``override=True``.

        Raises:
            TypeError: ``item`` is not an ``item_type``.
            ValueError: the registry's ``check`` refuses it.
            DuplicateName: the name is taken and ``override`` is false.
        """
        if not isinstance(item, self.item_type):
            raise TypeError(f"expected a {self.item_type.__name__}, got {type(item).__name__}")
        if self._check is not None:
            self._check(item)
        with self._lock:
            if item.name in self._items and not override:
                raise DuplicateName(
                    f"{self.kind} {item.name!r} is already registered; pass override=True to replace it"
                )
            self._items[item.name] = item

    def unregister(self, name: str) -> None:
        """Remove the entry named ``name``.

        Raises:
            UnknownName: no such entry.
        """
        with self._lock:
            if name not in self._items:
                raise UnknownName(self.kind, name, self._items)
            del self._items[name]

    def get(self, name_or_item: str | T) -> T:
        """The entry named ``name_or_item`` (an ``item_type`` is returned as is).

        Raises:
            UnknownName: no such entry; the message lists the known ones.
        """
        if isinstance(name_or_item, self.item_type):
            return name_or_item
        found = self._items.get(name_or_item) if isinstance(name_or_item, str) else None
        if found is None:
            raise UnknownName(self.kind, name_or_item, self._items)
        return found

    def snapshot(self) -> dict[str, T]:
        """A copy of the entries, by name."""
        with self._lock:
            return dict(self._items)
