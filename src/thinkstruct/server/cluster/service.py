"""Running the replicated service: :class:`ClusterOptions` and :func:`serve_cluster`.

``serve_cluster`` starts a local Ray instance (``ray_address`` ``None`` or ``"local"``)
or joins a running cluster (``ray_address="HOST:6379"``: ``ray start --head`` on one
machine, ``ray start --address HOST:6379`` on the others), deploys the engine
deployment (N replicas, or autoscaled between ``min_replicas`` and ``max_replicas`` on
Ray Serve's target of ongoing requests per replica) behind the ingress, and serves until
SIGTERM or Ctrl-C; then Ray Serve drains: in-flight requests get ``grace_s`` seconds.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import ray
from ray import serve
from ray.serve.config import AutoscalingConfig, HTTPOptions
from ray.serve.schema import LoggingConfig

from thinkstruct.server.cluster.affinity import Bounds
from thinkstruct.server.cluster.ingress import Ingress
from thinkstruct.server.cluster.ray_settings import ray_serve_env
from thinkstruct.server.cluster.replica import EngineReplica
from thinkstruct.server.cluster.router import PromptPrefixRouter
from thinkstruct.server.cluster.stats_board import start_board

if TYPE_CHECKING:
    from ray.serve import Application

    from thinkstruct.engine.assembly import EngineSpec
    from thinkstruct.server.settings import ServerSettings

log = logging.getLogger("thinkstruct.cluster")

#: The Ray Serve application's name.
APP_NAME = "thinkstruct"


@dataclass(frozen=True, kw_only=True)
class ClusterOptions:
    """How the service is replicated.

    Attributes:
        replicas: engine replicas (without autoscaling).
        min_replicas, max_replicas: autoscaling bounds; either set turns autoscaling on.
        target_ongoing_requests: requests in flight per replica Ray Serve scales toward.
        upscale_delay_s, downscale_delay_s: seconds the load must call for more (fewer)
            replicas before Ray Serve adds (removes) one (Ray Serve's defaults: 30, 600).
        scaling_window_s: seconds of requests-in-flight counts Ray Serve averages for its
            decisions (its ``look_back_period_s``; default 30); the ingress reports the
            counts every third of it, at most every 10 s (Ray Serve's default).
        ray_address: ``None`` or ``"local"``: start a local Ray instance; else join it.
        replica_cpus: CPUs Ray reserves per engine replica (fractions allowed).
        max_ongoing_requests: requests one replica takes at once (more wait at the router).
        routing: ``"prefix"``: :class:`~.router.PromptPrefixRouter` (a conversation's
            turns and a shared prefix go where their keys and values are, within the load
            bound); ``"queue"``: Ray Serve's own choice by queue length alone.
        bounds: the prefix router's load bounds (:class:`~.affinity.Bounds`): how much
            busier than the least busy replica a prefix's replica may be and still get the
            request, for a whole earlier prompt and for only a shared prefix.
        health_check_period_s: seconds between Ray Serve's health checks of a replica.
        stall_s: seconds a busy engine may go without a step before its replica counts
            as unhealthy.
        stream_interval_s: seconds between the streamed batches of one request's deltas
            (see :class:`~.replica.EngineReplica`).
        grace_s: seconds in-flight requests get on shutdown or scale-down.
        object_store_bytes: a local Ray instance's object store.
    """

    replicas: int = 1
    min_replicas: int | None = None
    max_replicas: int | None = None
    target_ongoing_requests: float = 8.0
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    scaling_window_s: float = 30.0
    ray_address: str | None = None
    replica_cpus: float = 1.0
    max_ongoing_requests: int = 64
    routing: Literal["prefix", "queue"] = "prefix"
    bounds: Bounds = field(default_factory=Bounds)
    health_check_period_s: float = 2.0
    stall_s: float = 30.0
    stream_interval_s: float = 0.025
    grace_s: float = 10.0
    object_store_bytes: int = 100 << 20

    def check(self) -> None:
        """Raises:
        ValueError: the replica counts contradict each other (the message names them)."""
        low, high = self.min_replicas, self.max_replicas
        if low is not None and high is not None and low > high:
            raise ValueError(f"--min-replicas ({low}) is more than --max-replicas ({high})")
        if high is not None and self.replicas > high:
            raise ValueError(f"--replicas ({self.replicas}) is more than --max-replicas ({high})")
        if self.replica_cpus <= 0:
            raise ValueError(f"--replica-cpus must be positive, got {self.replica_cpus}")
        if self.upscale_delay_s < 0 or self.downscale_delay_s < 0:
            raise ValueError("--upscale-delay and --downscale-delay must not be negative")
        if self.scaling_window_s <= 0:
            raise ValueError(f"--scaling-window must be positive, got {self.scaling_window_s:g} s")
        if self.stream_interval_s < 0:
            raise ValueError(
                f"--stream-interval must not be negative, got {1000 * self.stream_interval_s:g} ms"
            )

    @property
    def autoscaling(self) -> AutoscalingConfig | None:
        if self.min_replicas is None and self.max_replicas is None:
            return None
        low = self.min_replicas if self.min_replicas is not None else 1
        with warnings.catch_warnings():
            # Ray Serve means to move the report interval to environment variables that
            # its releases do not read yet: the field is what it reads.
            warnings.filterwarnings("ignore", "The `metrics_interval_s` field", DeprecationWarning)
            return AutoscalingConfig(
                min_replicas=low,
                max_replicas=self.max_replicas if self.max_replicas is not None else max(low, self.replicas),
                initial_replicas=min(max(self.replicas, low), self.max_replicas or self.replicas),
                target_ongoing_requests=self.target_ongoing_requests,
                upscale_delay_s=self.upscale_delay_s,
                downscale_delay_s=self.downscale_delay_s,
                look_back_period_s=self.scaling_window_s,
                # How often the ingress's handle reports its counts (it records one every
                # fifth of the window): a few times a window, at most Ray Serve's 10 s.
                metrics_interval_s=min(10.0, self.scaling_window_s / 3),
            )


def application(spec: EngineSpec, settings: ServerSettings, options: ClusterOptions) -> Application:
    """The Ray Serve application: the ingress over the engine deployment."""
    autoscaling = options.autoscaling
    scaling: dict[str, Any] = (
        {"autoscaling_config": autoscaling} if autoscaling is not None else {"num_replicas": options.replicas}
    )
    # Ray Serve's access log writes a line per request and per streamed call.
    quiet = LoggingConfig(enable_access_log=False)
    routing: dict[str, Any] = {}  # Ray Serve's default: queue length alone
    if options.routing == "prefix":
        routing["request_router_config"] = {
            "request_router_class": f"{PromptPrefixRouter.__module__}.{PromptPrefixRouter.__qualname__}",
            "request_router_kwargs": {
                "whole": [options.bounds.whole.requests, options.bounds.whole.ratio],
                "shared": [options.bounds.shared.requests, options.bounds.shared.ratio],
            },
        }
    engine = serve.deployment(
        name="engine",
        logging_config=quiet,
        ray_actor_options={"num_cpus": options.replica_cpus},
        max_ongoing_requests=options.max_ongoing_requests,
        **routing,
        health_check_period_s=options.health_check_period_s,
        health_check_timeout_s=max(10.0, options.health_check_period_s * 5),
        graceful_shutdown_timeout_s=options.grace_s,
        graceful_shutdown_wait_loop_s=0.5,
        **scaling,
    )(EngineReplica)
    # The ingress listens on --port itself (direct ingress, see ray_settings.py): on the
    # machine `thinkstruct serve` runs on, where the user expects the service.
    here = {f"node:{ray.util.get_node_ip_address()}": 0.001}
    ingress = serve.deployment(
        name="ingress",
        logging_config=quiet,
        ray_actor_options={"num_cpus": 0, "resources": here},
        max_ongoing_requests=options.max_ongoing_requests * 4,
        graceful_shutdown_timeout_s=options.grace_s + 5,
        graceful_shutdown_wait_loop_s=0.5,
    )(Ingress)
    board = start_board()
    return ingress.bind(
        engine.bind(spec, board, stall_s=options.stall_s, stream_interval_s=options.stream_interval_s),
        board,
        spec,
        settings,
    )


def serve_cluster(
    spec: EngineSpec,
    settings: ServerSettings,
    options: ClusterOptions,
    *,
    on_listening: Callable[[int], None] | None = None,
) -> int:
    """Serve on Ray until SIGTERM or Ctrl-C; the exit status (0 after a clean stop).

    Args:
        spec: the engine each engine replica builds (and the model and compiler the
            ingress loads).
        settings: host, port (the ingress replica listens there), key and limits.
        options: replicas, autoscaling, the Ray cluster.
        on_listening: called with the port once the service answers.
    """
    stop = threading.Event()
    local = options.ray_address in (None, "local")
    env = ray_serve_env(port=settings.port)
    os.environ.update(env)  # a local instance's processes inherit it
    ray.init(
        address="local" if local else options.ray_address,
        include_dashboard=False,
        object_store_memory=options.object_store_bytes if local else None,
        runtime_env={"env_vars": env},  # a joined cluster's processes for this job get it
    )
    # After ray.init, which installs its own SIGTERM handler in the driver.
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        # Ray Serve still starts its HTTP proxy on the head node with direct ingress; it
        # serves nothing of ours, so it listens on a port the system picks as it binds
        # (port 0), leaving --port to the ingress. (A free port looked up beforehand was
        # taken by another process before the proxy bound it: the service did not start.)
        serve.start(http_options=HTTPOptions(host=settings.host, port=0))
        serve.run(
            application(spec, settings, options),
            name=APP_NAME,
            route_prefix="/",
        )
        if on_listening is not None:
            on_listening(settings.port)
        log.info("serving on Ray at %s:%s", settings.host, settings.port)
        stop.wait()
        log.info("stopping: draining in-flight requests (up to %.0f s)", options.grace_s)
        serve.delete(APP_NAME)
        serve.shutdown()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        ray.shutdown()
    return 0
