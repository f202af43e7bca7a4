"""Checked keywords that a container's prefix already breaks: :func:`prefix_rules`.

A value check (:class:`~thinkstruct.grammar.schema.checks.ValueCheck`) validates an array
or object when it closes. Some keywords are broken for good by a part of it, whatever
follows; checked as each item, member or key closes, the failure names that part, and
only it is drawn again (:mod:`thinkstruct.grammar.runtime.value_checks`):

- ``uniqueItems``: an item equal to an earlier one;
- ``maxContains``: the item that makes one match too many;
- ``contains`` / ``minContains`` with ``maxItems`` on the same subschema: an item that
  does not match when the items left cannot make up the matches still needed;
- ``propertyNames``: a key its subschema refuses;
- ``unevaluatedProperties`` / ``unevaluatedItems`` where what evaluates a member or item
  depends on it alone (``properties``, ``patternProperties``, ``additionalProperties``,
  ``prefixItems``, ``items``, through ``allOf`` and local ``$ref``s; no ``if``,
  ``anyOf``, ``oneOf``, ``dependentSchemas`` or ``contains``): the member or item the
  container's prefix leaves unevaluated.

Each rule is sound: it fails only where every completion of the prefix fails the
keyword, so the verdict on a whole value never changes, only where the failure points.
A rule applies to the keywords of the check's own subschema (the one at its
``schema_pointer``); keywords elsewhere are checked as the value closes.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

from thinkstruct.grammar.schema.checks import CheckPlan
from thinkstruct.grammar.schema.walk import local_ref

#: Keywords that make what evaluates a member or item depend on other members or items.
_DYNAMIC = frozenset(
    {"if", "then", "else", "anyOf", "oneOf", "dependentSchemas", "dependencies", "contains",
     "$dynamicRef", "$recursiveRef"}
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class ContainsRule:
    """``contains`` with its counts, on one array.

    Attributes:
        subschema: the ``contains`` subschema's pointer (what an item matches).
        minimum: matches needed (``minContains``, 1 by default).
        maximum: matches allowed (``maxContains``), or ``None``.
        max_items: the array's ``maxItems`` on the same subschema, or ``None``.
        min_keyword: the pointer of the keyword ``minimum`` comes from (``minContains``,
            else ``contains``).
        max_keyword: the pointer of ``maxContains``.
    """

    subschema: str
    minimum: int
    maximum: int | None
    max_items: int | None
    min_keyword: str
    max_keyword: str

    def finite(self, plan: CheckPlan) -> tuple[Any, ...] | None:
        """The values an item must be one of to match (a ``const`` or ``enum`` subschema of
        scalars), else ``None``."""
        return finite_values(plan.subschema(self.subschema))


@dataclass(frozen=True, slots=True)
class PrefixRules:
    """What one check's prefix can break (see the module doc); a field is ``None`` or
    empty where that keyword is not checked there.

    Attributes:
        unique: the pointer of ``uniqueItems: true``.
        contains: the ``contains`` counts.
        names: the ``propertyNames`` subschema's pointer.
        unevaluated: the pointer of ``unevaluatedProperties`` or ``unevaluatedItems``,
            where what evaluates a part depends on it alone.
    """

    unique: str | None = None
    contains: tuple[ContainsRule, ...] = ()
    names: str | None = None
    unevaluated: str | None = None

    def __bool__(self) -> bool:
        return bool(self.unique or self.contains or self.names or self.unevaluated)


_rules: weakref.WeakKeyDictionary[CheckPlan, dict[int, PrefixRules]] = weakref.WeakKeyDictionary()


def prefix_rules(plan: CheckPlan, index: int) -> PrefixRules:
    """The prefix rules of ``plan.checks[index]`` (computed once per plan and check)."""
    cached = _rules.setdefault(plan, {})
    rules = cached.get(index)
    if rules is None:
        rules = cached[index] = _derive(plan, index)
    return rules


def _derive(plan: CheckPlan, index: int) -> PrefixRules:
    check = plan.checks[index]
    base = check.schema_pointer
    node = plan.subschema(base)
    if not isinstance(node, dict):
        return PrefixRules()
    own = {pointer[len(base) + 1 :] for pointer in check.keywords if pointer.rpartition("/")[0] == base}
    unique = f"{base}/uniqueItems" if "uniqueItems" in own and node.get("uniqueItems") is True else None
    contains: tuple[ContainsRule, ...] = ()
    if own & {"contains", "minContains", "maxContains"} and "contains" in node:
        minimum = node.get("minContains", 1)
        maximum = node.get("maxContains")
        max_items = node.get("maxItems")
        if (
            _count(minimum)
            and (maximum is None or _count(maximum))
            and (max_items is None or _count(max_items))
        ):
            contains = (
                ContainsRule(
                    subschema=f"{base}/contains",
                    minimum=minimum,
                    maximum=maximum,
                    max_items=max_items,
                    min_keyword=f"{base}/{'minContains' if 'minContains' in node else 'contains'}",
                    max_keyword=f"{base}/maxContains",
                ),
            )
    names = f"{base}/propertyNames" if "propertyNames" in own else None
    unevaluated = None
    for keyword in ("unevaluatedProperties", "unevaluatedItems"):
        if keyword in own and _static(node, plan.schema):
            unevaluated = f"{base}/{keyword}"
    return PrefixRules(unique=unique, contains=contains, names=names, unevaluated=unevaluated)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _static(node: dict[str, Any], root: Any) -> bool:
    """Whether what evaluates a member or item of ``node`` depends on that part alone
    (``node`` and what it applies in place, through ``allOf`` and local ``$ref``s)."""
    stack: list[Any] = [node]
    seen: set[int] = set()
    while stack:
        current = stack.pop()
        if not isinstance(current, dict) or id(current) in seen:
            continue
        seen.add(id(current))
        if _DYNAMIC & current.keys():
            return False
        if "$ref" in current:
            found = local_ref(current, root)
            if found is None:
                return False
            stack.append(found[0])
        parts = current.get("allOf")
        if parts is not None:
            if not isinstance(parts, list):
                return False
            stack.extend(parts)
    return True


def finite_values(node: Any) -> tuple[Any, ...] | None:
    """The scalars ``node`` (a ``const`` or ``enum`` subschema) allows, else ``None``."""
    if not isinstance(node, dict):
        return None
    if "const" in node:
        values: list[Any] = [node["const"]]
    elif isinstance(node.get("enum"), list):
        values = node["enum"]
    else:
        return None
    if not values or any(isinstance(v, (dict, list)) for v in values):
        return None
    return tuple(values)


__all__ = ["ContainsRule", "PrefixRules", "finite_values", "prefix_rules"]
