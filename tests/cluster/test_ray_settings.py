"""Ray Serve's data-path settings: direct ingress on the service's own port, and an
operator's variable left as set."""

from __future__ import annotations

import pytest

from thinkstruct.server.cluster.ray_settings import ray_serve_env


def test_the_ingress_gets_exactly_the_services_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT", raising=False)
    monkeypatch.delenv("RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT", raising=False)
    env = ray_serve_env(port=8123)
    # Ray allocates direct-ingress ports from [MIN, MAX): the one port.
    assert (env["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"], env["RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"]) == (
        "8123",
        "8124",
    )
    assert env["RAY_SERVE_ENABLE_DIRECT_INGRESS"] == "1"
    assert env["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1"


def test_an_operators_setting_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", "30")
    monkeypatch.delenv("RAY_SERVE_THROUGHPUT_OPTIMIZED", raising=False)
    env = ray_serve_env(port=8000)
    assert env["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"] == "30"
    assert env["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1"


def test_the_replicas_openmp_threads_sleep_when_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert ray_serve_env(port=8000)["OMP_WAIT_POLICY"] == "PASSIVE"


def test_the_replicas_are_not_niced_below_other_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_worker_niceness", raising=False)
    assert ray_serve_env(port=8000)["RAY_worker_niceness"] == "0"
