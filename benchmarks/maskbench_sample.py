"""The JSONSchemaBench sample the benchmarks walk: schemas with their valid instances.

The sample lives outside the repository (``/work/shared/conformance/maskbench`` by default,
or ``$THINKSTRUCT_MASKBENCH``), one JSON file per schema::

    {"description": ..., "meta": {...}, "schema": {...},
     "tests": [{"description": ..., "valid": true, "data": ...}, ...]}

Instances are serialized compactly (``","`` and ``":"``, no spaces, UTF-8 kept), which is
what every backend accepts under thinkstruct's default :class:`~thinkstruct.JsonFormat`.

Loading needs only the standard library, so a benchmark's parent process can pick and
order its work without importing torch or a grammar library.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Where the sample is unless ``$THINKSTRUCT_MASKBENCH`` says otherwise.
DEFAULT_MASKBENCH_DIR = Path(os.environ.get("THINKSTRUCT_MASKBENCH", "/work/shared/conformance/maskbench"))


@dataclass(frozen=True)
class MaskbenchSchema:
    """One schema of the sample and the texts of its valid instances.

    Attributes:
        name: the file's stem (e.g. ``"Github_easy---o1008"``), stable across runs.
        schema: the schema as compact JSON text.
        instances: every valid test instance, serialized by :func:`compact_json`.
    """

    name: str
    schema: str
    instances: tuple[str, ...]


def compact_json(value: Any) -> str:
    """``value`` as the compact JSON a constrained model writes: no whitespace, UTF-8 kept."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def load_maskbench(
    directory: str | os.PathLike[str] = DEFAULT_MASKBENCH_DIR, *, with_valid_instances: bool = True
) -> list[MaskbenchSchema]:
    """Every schema of the sample, sorted by name.

    Args:
        directory: the folder of ``*.json`` files.
        with_valid_instances: leave out the schemas that have no valid instance.

    Raises:
        FileNotFoundError: the folder is missing or holds no ``*.json`` file.
    """
    root = Path(directory)
    paths = sorted(root.glob("*.json"))
    if not paths:
        raise FileNotFoundError(f"no JSONSchemaBench sample (*.json) in {root}; set THINKSTRUCT_MASKBENCH")
    schemas = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        instances = tuple(compact_json(test["data"]) for test in doc.get("tests", []) if test.get("valid"))
        if with_valid_instances and not instances:
            continue
        schemas.append(MaskbenchSchema(path.stem, compact_json(doc["schema"]), instances))
    return schemas


def sample_schemas(
    schemas: Sequence[MaskbenchSchema], *, count: int | None, seed: int
) -> list[MaskbenchSchema]:
    """A fixed, shuffled subset: the same ``seed`` and ``count`` give the same list, in the
    same order, on every machine (``count=None`` shuffles them all)."""
    order = list(schemas)
    random.Random(seed).shuffle(order)
    return order if count is None else order[:count]


__all__ = [
    "DEFAULT_MASKBENCH_DIR",
    "MaskbenchSchema",
    "compact_json",
    "load_maskbench",
    "sample_schemas",
]
