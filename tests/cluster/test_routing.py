"""The pieces of the replicated service that need no Ray cluster: the stall watch behind
the health check, the replica options, the service's totals over the replicas' counters
(the router's decision: test_prefix_routing.py)."""

from __future__ import annotations

import pytest

from thinkstruct.cli import main
from thinkstruct.server.cluster.replica import ReplicaStalled, StallWatch
from thinkstruct.server.cluster.service import ClusterOptions
from thinkstruct.server.cluster.stats_board import Board, StatsBoard


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_stall_watch_fails_a_busy_engine_that_stopped_stepping_only() -> None:
    clock = Clock()
    watch = StallWatch(stall_s=5.0, clock=clock)
    watch.check(steps=3, busy=True)
    clock.now = 100.0
    watch.check(steps=3, busy=False)  # idle: no steps is fine
    watch.check(steps=3, busy=True)
    clock.now = 104.0
    watch.check(steps=4, busy=True)  # it stepped
    clock.now = 108.0
    watch.check(steps=4, busy=True)
    clock.now = 109.5
    with pytest.raises(ReplicaStalled, match="no step"):
        watch.check(steps=4, busy=True)


def test_replica_options_that_contradict_each_other_are_refused() -> None:
    with pytest.raises(ValueError, match="--min-replicas"):
        ClusterOptions(min_replicas=3, max_replicas=2).check()
    with pytest.raises(ValueError, match="--replicas"):
        ClusterOptions(replicas=4, max_replicas=2).check()
    scaling = ClusterOptions(
        replicas=2, min_replicas=1, max_replicas=3, target_ongoing_requests=2
    ).autoscaling
    assert scaling is not None
    assert (scaling.min_replicas, scaling.initial_replicas, scaling.max_replicas) == (1, 2, 3)
    assert ClusterOptions(replicas=2).autoscaling is None


def test_autoscaling_delays_and_window_reach_ray_serve() -> None:
    default = ClusterOptions(max_replicas=2).autoscaling
    assert default is not None  # Ray Serve's own defaults
    assert (default.upscale_delay_s, default.downscale_delay_s, default.look_back_period_s) == (30, 600, 30)
    assert default.metrics_interval_s == 10
    quick = ClusterOptions(
        max_replicas=2, upscale_delay_s=0.5, downscale_delay_s=2, scaling_window_s=3
    ).autoscaling
    assert quick is not None
    assert (quick.upscale_delay_s, quick.downscale_delay_s, quick.look_back_period_s) == (0.5, 2, 3)
    # The ingress reports its counts several times a window, or the window averages nothing.
    assert quick.metrics_interval_s == 1
    with pytest.raises(ValueError, match="--scaling-window"):
        ClusterOptions(max_replicas=2, scaling_window_s=0).check()
    with pytest.raises(ValueError, match="--downscale-delay"):
        ClusterOptions(max_replicas=2, downscale_delay_s=-1).check()


def replica(generated: int, waiting: int = 0, stop: int = 0) -> dict[str, object]:
    return {"engine": {"generated_tokens": generated, "waiting": waiting, "finished": {"stop": stop}}}


def test_the_stats_board_forgets_a_replica_that_stopped_posting() -> None:
    clock = Clock()
    board = StatsBoard(max_age_s=10.0, clock=clock)
    board.post("a", replica(1))
    clock.now = 6.0
    board.post("b", replica(2))
    assert Board(*board.read()).replicas == {"a": replica(1), "b": replica(2)}
    clock.now = 12.0
    assert Board(*board.read()).replicas == {"b": replica(2)}
    board.drop("b")
    assert Board(*board.read()).replicas == {}


def test_the_services_counters_keep_a_removed_replicas_counts_and_its_gauges_do_not() -> None:
    clock = Clock()
    board = StatsBoard(max_age_s=10.0, clock=clock)
    board.post("a", replica(100, waiting=2, stop=3))
    board.post("b", replica(50, waiting=1, stop=1))
    both = Board(*board.read()).total()
    assert (both.generated_tokens, both.waiting, both.finished["stop"]) == (150, 3, 4)
    board.drop("b", replica(60, stop=2))  # scaled down: its final counts, after its last post
    board.post("a", replica(120, stop=4))
    after = Board(*board.read()).total()
    assert (after.generated_tokens, after.waiting, after.finished["stop"]) == (180, 0, 6)
    clock.now = 11.0  # a killed: its last post's counts stay
    board.post("c", replica(5))
    killed = Board(*board.read())
    assert set(killed.replicas) == {"c"} and killed.total().generated_tokens == 185
    board.post("a", replica(130))  # a late post, not a death: counted live, not twice
    assert Board(*board.read()).total().generated_tokens == 195


def test_serve_refuses_contradicting_replica_flags_before_starting_ray(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["serve", "--min-replicas", "3", "--max-replicas", "2"]) == 2
    assert "--min-replicas (3) is more than --max-replicas (2)" in capsys.readouterr().err


def test_serve_passes_the_autoscaling_flags_to_the_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    from thinkstruct.server.cluster import service

    got: list[ClusterOptions] = []
    monkeypatch.setattr(service, "serve_cluster", lambda *args, **kwargs: got.append(args[2]) or 0)
    flags = ["--min-replicas", "1", "--max-replicas", "3", "--target-ongoing-requests", "2"]
    delays = ["--upscale-delay", "1", "--downscale-delay", "20", "--scaling-window", "6"]
    assert main(["serve", *flags, *delays]) == 0
    (options,) = got
    assert (options.min_replicas, options.max_replicas, options.target_ongoing_requests) == (1, 3, 2)
    assert (options.upscale_delay_s, options.downscale_delay_s, options.scaling_window_s) == (1, 20, 6)
