"""The responses store's bounds: entries, bytes and age, on a manual clock."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from server_harness import ManualClock

from thinkstruct.server.response_store import ResponseStore, StoredResponse, StoreLimits


def _stored(text: str) -> StoredResponse:
    return StoredResponse(
        response={"id": "r", "text": text}, conversation=[{"role": "user", "content": text}]
    )


def _size(stored: StoredResponse) -> int:
    return len(json.dumps([stored.response, stored.conversation], ensure_ascii=False).encode("utf-8"))


@settings(max_examples=200, deadline=None)
@given(
    max_entries=st.integers(0, 5),
    max_bytes=st.integers(0, 600),
    ops=st.lists(
        st.tuples(st.sampled_from(["put", "get", "delete", "wait"]), st.integers(0, 7), st.text(max_size=60)),
        max_size=40,
    ),
)
def test_the_bounds_always_hold_and_the_newest_that_fits_is_kept(
    max_entries: int, max_bytes: int, ops: list[tuple[str, int, str]]
) -> None:
    clock = ManualClock()
    store = ResponseStore(StoreLimits(max_entries=max_entries, max_bytes=max_bytes, ttl_s=10.0), clock=clock)
    for op, key, text in ops:
        name = f"resp_{key}"
        if op == "put":
            stored = _stored(text)
            kept = store.put(name, stored)
            fits = max_entries > 0 and _size(stored) <= max_bytes
            assert kept == fits
            if fits:
                assert store.get(name) == stored
        elif op == "delete":
            store.delete(name)
            assert store.get(name) is None
        elif op == "wait":
            clock.advance(key * 2.0)
        else:
            store.get(name)
        assert len(store) <= max_entries
        assert store.nbytes <= max_bytes


def test_entries_go_oldest_first_and_expire_after_the_ttl() -> None:
    clock = ManualClock()
    store = ResponseStore(StoreLimits(max_entries=2, ttl_s=5.0), clock=clock)
    for i in range(3):
        store.put(f"r{i}", _stored(str(i)))
        clock.advance(1.0)
    assert store.get("r0") is None and store.get("r1") is not None
    clock.advance(3.5)  # r1 is 5.5 s old, r2 4.5 s
    assert store.get("r1") is None and store.get("r2") is not None
    clock.advance(1.0)
    assert len(store) == 0 and store.nbytes == 0
    assert not store.delete("r2")


def test_a_response_larger_than_the_byte_bound_is_not_kept() -> None:
    store = ResponseStore(StoreLimits(max_bytes=100))
    assert not store.put("big", _stored("x" * 200))
    assert store.put("small", _stored("x")) and len(store) == 1
    assert not ResponseStore(StoreLimits(max_entries=0)).put("any", _stored("x"))
