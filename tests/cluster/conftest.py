"""The Ray cluster of the cluster tests: one per test session, shared by every module that
asks for ``ray_cluster`` (they run one after the other on one worker: see RAY_FILES in
tests/conftest.py). It starts with the first test that needs it and stops after the last
one, so no Ray process runs beside the tests that follow on that worker.
"""

from __future__ import annotations

import pytest
from ray_service import RayCluster

_running: list[RayCluster] = []


@pytest.fixture(scope="module")
def ray_cluster() -> RayCluster:
    if not _running:
        _running.append(RayCluster().__enter__())
    return _running[0]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    """After the test's own teardown (its module's service stops first)."""
    try:
        return (yield)
    finally:
        if _running and (nextitem is None or "ray_cluster" not in getattr(nextitem, "fixturenames", ())):
            _running.pop().stop()
