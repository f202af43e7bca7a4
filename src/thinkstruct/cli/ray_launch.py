"""``thinkstruct serve`` on Ray Serve (``--replicas``, autoscaling, ``--ray-address``): the
cluster options from the command line, then :func:`~thinkstruct.server.cluster.service.serve_cluster`
with the engine's spec (each replica builds its engine from it)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from thinkstruct.engine.assembly import EngineSpec
    from thinkstruct.server.settings import ServerSettings


def on_ray(args: argparse.Namespace) -> bool:
    """Serve on Ray Serve: more than one replica, autoscaling, or a Ray address given."""
    return (
        args.replicas > 1
        or args.ray_address is not None
        or args.min_replicas is not None
        or args.max_replicas is not None
    )


def serve_on_ray(
    args: argparse.Namespace,
    spec: EngineSpec,
    settings: ServerSettings,
    *,
    on_listening: Callable[[int], None],
) -> int:
    """Serve ``spec``'s engine on Ray Serve as the replica options say; the exit status (2
    for a usage error or a missing Ray)."""
    try:
        from thinkstruct.server.cluster.service import ClusterOptions, serve_cluster
    except ImportError as e:
        print(
            f"error: --replicas/--ray-address need Ray Serve ({e}); pip install 'thinkstruct[cluster]'",
            file=sys.stderr,
        )
        return 2
    try:
        options = ClusterOptions(
            replicas=args.replicas,
            min_replicas=args.min_replicas,
            max_replicas=args.max_replicas,
            target_ongoing_requests=args.target_ongoing_requests,
            upscale_delay_s=args.upscale_delay,
            downscale_delay_s=args.downscale_delay,
            scaling_window_s=args.scaling_window,
            ray_address=args.ray_address,
            replica_cpus=args.replica_cpus,
            routing=args.routing,
            stream_interval_s=args.stream_interval / 1000,
            grace_s=args.grace,
        )
        options.check()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return serve_cluster(
        spec,
        settings,
        options,
        on_listening=on_listening,
    )
