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
    """After a module's last test and its teardown (its service stops first): the cluster
    stops unless the next module's first test uses it."""
    try:
        return (yield)
    finally:
        last_of_module = nextitem is None or getattr(nextitem, "module", None) is not getattr(
            item, "module", None
        )
        if _running and last_of_module and "ray_cluster" not in getattr(nextitem, "fixturenames", ()):
            _running.pop().stop()
