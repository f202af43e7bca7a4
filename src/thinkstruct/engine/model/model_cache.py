"""A directory cache for converted models that a crash cannot leave half-written.

An entry is a directory ``<root>/<key>`` holding the converted files and, written last, a
manifest (:data:`MANIFEST`) listing every file with its size and SHA-256. An entry is
only ever made by building it in a private staging directory beside it and renaming that
into place, so a process killed mid-conversion leaves at most a staging directory, never
an entry; an entry whose files do not match its manifest (truncated, deleted, replaced)
is treated as absent and rebuilt.

Concurrent first starts take an exclusive lock (``<root>/<key>.lock``, ``fcntl.flock``;
the kernel releases it when its holder dies) around the check-and-build, so one process
converts and the others wait and then use its entry. Staging directories found under the
lock belong to dead processes and are removed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MANIFEST = "thinkstruct-manifest.json"
"""The completion marker and file list of an entry; written last."""

_FORMAT = 1
_STAGING = ".staging-"


def entry_problem(entry: Path, *, full: bool = False) -> str | None:
    """Why ``entry`` is not a complete cache entry, or ``None`` when it is.

    Sizes are always checked against the manifest (this catches truncation and missing
    files at the cost of a ``stat`` per file); ``full=True`` also re-hashes every file
    (about 0.4 s per 500 MB here), which catches same-size corruption.
    """
    manifest_path = entry / MANIFEST
    if not entry.is_dir():
        return f"{entry} does not exist"
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"{entry} has no {MANIFEST}: its conversion did not finish"
    except (OSError, ValueError) as exc:
        return f"{manifest_path} is unreadable: {exc}"
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if manifest.get("format") != _FORMAT or not isinstance(files, dict) or not files:
        return f"{manifest_path} is not a thinkstruct cache manifest of format {_FORMAT}"
    for name, expected in files.items():
        path = entry / name
        try:
            size = path.stat().st_size
        except OSError:
            return f"{path} is missing"
        if size != expected.get("size"):
            return f"{path} has {size} bytes, the manifest says {expected.get('size')}"
        if full and _sha256(path) != expected.get("sha256"):
            return f"{path} does not match its SHA-256 in the manifest"
    return None


def read_manifest(entry: Path) -> dict[str, Any]:
    """The manifest of a complete entry (its ``meta`` holds what the builder recorded)."""
    value = json.loads((entry / MANIFEST).read_text(encoding="utf-8"))
    return value if isinstance(value, dict) else {}


def cached_entry(
    root: Path,
    key: str,
    build: Callable[[Path], dict[str, Any] | None],
    *,
    on_wait: Callable[[], None] | None = None,
) -> tuple[Path, bool]:
    """The complete entry ``root/key``, built by ``build(staging_dir)`` if needed.

    ``build`` writes the entry's files into the empty directory it is given and may return
    a JSON-able mapping stored as the manifest's ``meta``. It runs at most once across
    processes sharing ``root`` at a time; an exception leaves no entry behind.

    Returns:
        ``(entry, built)``: the entry's path and whether this call built it.
    """
    entry = root / key
    if entry_problem(entry) is None:
        return entry, False
    root.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(root / f"{key}.lock", on_wait=on_wait) as locked:
        problem = entry_problem(entry)
        if problem is None:  # another process built it while we waited
            return entry, False
        _remove_leftovers(root, key, entry if entry.exists() else None, problem, staging_is_stale=locked)
        staging = root / f"{key}{_STAGING}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        staging.mkdir()
        try:
            meta = build(staging)
            _write_manifest(staging, meta or {})
            _fsync_dir(staging)
            os.rename(staging, entry)
            _fsync_dir(root)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return entry, True


def _remove_leftovers(
    root: Path, key: str, broken: Path | None, problem: str, *, staging_is_stale: bool
) -> None:
    # Under the lock nobody else is building this key: every staging directory of it
    # is what a killed process left behind. Without a lock (no flock) one may be live.
    for stale in root.glob(f"{key}{_STAGING}*") if staging_is_stale else ():
        log.info("removing %s, left by an interrupted conversion", stale)
        shutil.rmtree(stale, ignore_errors=True)
    if broken is not None:
        log.warning("the cached model %s is incomplete (%s); converting it again", broken, problem)
        # Rename first so that a crash during the removal cannot leave a directory at
        # the entry's path that some reader might trust.
        doomed = root / f"{key}{_STAGING}broken-{uuid.uuid4().hex[:8]}"
        os.rename(broken, doomed)
        shutil.rmtree(doomed, ignore_errors=True)


def _write_manifest(staging: Path, meta: dict[str, Any]) -> None:
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(p for p in staging.rglob("*") if p.is_file()):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)  # the data is on disk before the manifest vouches for it
        finally:
            os.close(fd)
        files[path.relative_to(staging).as_posix()] = {"size": path.stat().st_size, "sha256": _sha256(path)}
    if not files:
        raise RuntimeError(f"the conversion wrote nothing into {staging}")
    manifest = {"format": _FORMAT, "created": time.time(), "files": files, "meta": meta}
    tmp = staging / (MANIFEST + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, staging / MANIFEST)


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # not supported on this platform (Windows)
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def _exclusive_lock(path: Path, *, on_wait: Callable[[], None] | None) -> Iterator[bool]:
    """An inter-process lock on ``path``, released when the holder exits or dies; yields
    whether a lock is held (``False`` where ``flock`` does not exist)."""
    try:
        import fcntl
    except ImportError:  # Windows: no flock; the staging rename still keeps entries whole
        yield False
        return
    with open(path, "a+b") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield True
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
