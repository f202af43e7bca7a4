"""Ray Serve's data-path settings for the service: :func:`ray_serve_env`.

Ray Serve reads these from the environment when its processes start (the controller, the
replicas), so :func:`~.service.serve_cluster` puts them in the environment of the local
Ray instance it starts and in the job's ``runtime_env`` for a cluster it joins. They take
Ray's throughput-optimized path (measured on the embedded model, one streamed client:
the ingress and the proxy spent ~3 ms of CPU per token on Ray's defaults, ~1 ms here):

- **direct ingress**: the ingress replica itself listens on ``--port``; no HTTP proxy
  actor, so a streamed token crosses one deployment boundary (engine → ingress), not two;
- **gRPC between deployments**: the ingress calls the engine replicas over gRPC instead
  of Ray actor calls;
- **user code on the replica's own event loop** (no thread hop per call) and the router
  on the caller's loop;
- **no minimum draining period**: with no load balancer in front to deregister from, a
  stopping ingress waits for its in-flight requests (up to ``--grace``), not 30 s more;
- **a calmer control plane**: Serve's controller loop every 0.5 s instead of 0.1 s and
  Ray's own request metrics exported every second instead of every 0.1 s (measured idle:
  the controller alone took 3.4 % of a core; replica restarts and scaling decisions wait
  at most 0.4 s longer).

And for the processes themselves:

- **worker niceness 0** (Ray starts its workers, so the replicas, at nice 15: the service
  then yields to every other process on the machine; measured beside two busy processes,
  a local service of two replicas did not come up in 150 s at Ray's default (its HTTP
  proxy's start timed out), and came up in 90 s at 0). Ray's own daemons stay at 0 too.
  Only the local instance's raylet reads it: on a cluster it joins, ``ray start`` decided;
- ``OMP_WAIT_POLICY=PASSIVE`` for the engine replicas' own threads (as ``import
  thinkstruct`` sets it in a process of its own: idle OpenMP threads sleep rather than
  spin beside Ray's threads).

A variable already set in the environment is kept (an operator's choice wins).
"""

from __future__ import annotations

import os


def ray_serve_env(*, port: int) -> dict[str, str]:
    """The variables, for a service whose ingress listens on ``port`` (direct ingress
    allocates from ``[MIN, MAX)``: the one port)."""
    wanted = {
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
        "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
        "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(port),
        "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(port + 1),
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0",
        "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5",
        "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "1000",
        "RAY_worker_niceness": "0",
        "OMP_WAIT_POLICY": "PASSIVE",
    }
    return {name: os.environ.get(name, value) for name, value in wanted.items()}
