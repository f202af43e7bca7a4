"""What the routes share: :class:`ServerState` (the engine once it is ready, settings,
metrics, the stored responses)."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from thinkstruct.server.errors import UNAVAILABLE, APIError
from thinkstruct.server.metrics import ServerMetrics
from thinkstruct.server.response_store import ResponseStore
from thinkstruct.server.settings import ServerSettings

if TYPE_CHECKING:
    from thinkstruct.engine import Engine


class ServerState:
    """The server's view of its engine.

    The HTTP server may start before the model has loaded (``/health`` answers 503
    meanwhile, so a load balancer waits); :meth:`attach` hands it the running engine.
    :meth:`drain` marks the server as stopping: ``/health`` turns 503 again and new
    generation requests are refused while in-flight ones finish.
    """

    def __init__(
        self,
        settings: ServerSettings,
        engine: Engine | None = None,
        *,
        responses: ResponseStore | None = None,
    ) -> None:
        self.settings = settings
        self.responses = responses if responses is not None else ResponseStore(settings.responses_store)
        self.created = int(time.time())
        self._engine: Engine | None = None
        self._lock = threading.Lock()
        self.load_error: str | None = None
        self.draining = False
        self.metrics = ServerMetrics(lambda: self._engine)
        if engine is not None:
            self.attach(engine)

    def attach(self, engine: Engine) -> None:
        """Serve with ``engine`` from now on (it must be started)."""
        with self._lock:
            self._engine = engine

    def fail(self, message: str) -> None:
        """Record that loading the model failed (``/health`` says so)."""
        self.load_error = message

    @property
    def engine(self) -> Engine | None:
        return self._engine

    @property
    def ready(self) -> bool:
        return self._engine is not None and self._engine.running and not self.draining

    @property
    def model_name(self) -> str | None:
        if self.settings.served_model_name:
            return self.settings.served_model_name
        return None if self._engine is None else self._engine.model.name

    def require_engine(self) -> Engine:
        """The engine, or a 503 while the model loads or the server stops."""
        engine = self._engine
        if self.draining or (engine is not None and not engine.running):
            raise APIError(503, "the server is shutting down", type=UNAVAILABLE, code="shutting_down")
        if engine is None:
            message = (
                f"the model failed to load: {self.load_error}"
                if self.load_error
                else "the model is still loading"
            )
            raise APIError(
                503, message, type=UNAVAILABLE, code="model_not_ready", headers={"Retry-After": "5"}
            )
        return engine

    def check_model(self, name: str) -> None:
        """A 404 unless ``name`` is the served model (or one of its aliases)."""
        served = self.model_name
        if name == served or name in self.settings.model_aliases:
            return
        raise APIError(
            404,
            f"The model {name!r} does not exist; this server serves {served!r}",
            type="invalid_request_error",
            param="model",
            code="model_not_found",
        )
