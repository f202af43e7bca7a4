"""The ingress deployment: :class:`Ingress`, the server's FastAPI app over a :class:`RemoteEngine`.

The app is the single process's (:func:`~thinkstruct.server.app.create_app`): the same
validation, chat templates, errors and page; only its engine is remote, and
:class:`~.remote_engine.ReplicaHeader` names the replica in each generation response.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from ray import serve
from ray.serve._private.constants import RAY_SERVE_USE_GRPC_BY_DEFAULT

from thinkstruct.engine.assembly import load_model_and_compiler
from thinkstruct.server.app import create_app
from thinkstruct.server.cluster.remote_engine import RemoteEngine, ReplicaHeader
from thinkstruct.server.cluster.stats_board import BoardReader, ReplicaCollector

if TYPE_CHECKING:
    from fastapi import FastAPI
    from ray.serve.handle import DeploymentHandle

    from thinkstruct.engine import Engine
    from thinkstruct.engine.assembly import EngineSpec
    from thinkstruct.server.settings import ServerSettings


@serve.ingress()
class Ingress:
    """Ray Serve's ingress replica.

    Args:
        engine: the engine deployment's handle.
        board: the :class:`~.stats_board.StatsBoard` actor the replicas post to.
        spec: the engines' spec: this replica loads its model and a grammar compiler
            from it (the engines' own prompt limit too).
        settings: the server's limits and API key (host and port are Ray Serve's).
    """

    def __init__(
        self,
        engine: DeploymentHandle[Any],
        board: Any,
        spec: EngineSpec,
        settings: ServerSettings,
    ) -> None:
        model, compiler = load_model_and_compiler(spec, progress=False)
        # The handle was made in the driver, which imported Ray Serve before it set the
        # variables of ray_settings.py: it carries Ray's default there (actor calls, each
        # streamed item through the object store). This process started with them, so
        # Ray's setting here is the service's: gRPC between deployments (measured on the
        # embedded model, 8 clients: the ingress's Python time -32 %, tok/s +2-7 %).
        engine = engine.options(_by_reference=not RAY_SERVE_USE_GRPC_BY_DEFAULT)
        self._reader = BoardReader(board)
        self._remote = RemoteEngine(
            model,
            compiler,
            engine,
            max_prompt_tokens=spec.engine.max_prompt_tokens,
            totals=self._reader.total,
        )
        # RemoteEngine offers the part of Engine the routes use (see remote_engine.py).
        self._app = create_app(cast("Engine", self._remote), settings)
        self._app.state.thinkstruct.metrics.registry.register(ReplicaCollector(self._reader))
        self._app.add_middleware(ReplicaHeader)

    def __serve_build_asgi_app__(self) -> FastAPI:
        return self._app

    def __del__(self) -> None:
        reader = getattr(self, "_reader", None)
        if reader is not None:
            reader.stop()
        remote = getattr(self, "_remote", None)
        if remote is not None:
            remote.close()
            remote.compiler.close()
