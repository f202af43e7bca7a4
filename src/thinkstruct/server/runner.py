"""Running the server in the foreground: :func:`serve`.

The HTTP server listens at once and loads the model in a background thread (``/health``
answers 503 until the engine runs, so a load balancer or a script can wait on it). Ctrl-C
or SIGTERM stops it cleanly: new requests are refused (503) and ``/health`` turns 503,
requests in flight get ``grace_s`` seconds to finish, then the engine ends the rest with
``finish_reason: "abort"``, and the process exits 0. A second Ctrl-C quits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import uvicorn

from thinkstruct.server.app import create_app
from thinkstruct.server.settings import ServerSettings

if TYPE_CHECKING:
    from thinkstruct.engine import Engine
    from thinkstruct.server.state import ServerState

log = logging.getLogger("thinkstruct.server")


class _Server(uvicorn.Server):
    """uvicorn's server, with thinkstruct's shutdown: drain, grace, abort, exit 0."""

    def __init__(
        self, config: uvicorn.Config, state: ServerState, *, grace_s: float, stop_engine: Callable[[], None]
    ) -> None:
        super().__init__(config)
        self._state = state
        self._grace_s = grace_s
        self._stop_engine = stop_engine

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn re-raises a caught SIGTERM after shutting down, which would end the
        # process with status 143; a clean stop on request is a success.
        with super().capture_signals():
            yield
            self._captured_signals.clear()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._state.draining = True
        loop = asyncio.get_running_loop()
        # After the grace period, end what is still generating (with a finish reason),
        # so the open responses complete instead of being cut off.
        timer = loop.call_later(self._grace_s, lambda: loop.run_in_executor(None, self._stop_engine))
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()


def serve(
    load: Callable[[], Engine],
    settings: ServerSettings | None = None,
    *,
    grace_s: float = 10.0,
    log_level: str = "info",
    on_listening: Callable[[int], None] | None = None,
) -> int:
    """Serve until Ctrl-C or SIGTERM; the exit status (0 after a clean stop, 1 if the
    model failed to load).

    Args:
        load: builds and starts the engine (runs in a background thread).
        settings: host, port, key and limits.
        grace_s: seconds in-flight requests may take to finish after a stop signal.
        log_level: uvicorn's log level.
        on_listening: called with the bound port once the socket listens (``port=0``
            picks a free one).
    """
    settings = settings or ServerSettings()
    app = create_app(None, settings)
    state: ServerState = app.state.thinkstruct
    engine_box: list[Engine] = []
    failed = threading.Event()
    engine_lock = threading.Lock()

    def stop_engine() -> None:
        with engine_lock:
            for engine in engine_box:
                engine.close(grace_s=0.0)

    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        timeout_graceful_shutdown=int(grace_s) + 5,
        access_log=False,
    )
    server = _Server(config, state, grace_s=grace_s, stop_engine=stop_engine)

    def load_in_background() -> None:
        try:
            engine = load()
        except BaseException as e:
            log.exception("loading the model failed")
            state.fail(f"{type(e).__name__}: {e}")
            failed.set()
            server.should_exit = True
            return
        with engine_lock:
            if server.should_exit:  # stopped while loading
                engine.close(grace_s=0.0)
                engine.compiler.close()
                return
            engine_box.append(engine)
        state.attach(engine)
        log.info(
            "model %s loaded; serving on %s:%s",
            engine.model.name,
            settings.host,
            _bound_port(server) or settings.port,
        )

    try:
        sock = listening_socket(settings.host, settings.port)
    except OSError as e:
        log.error("cannot listen on %s:%s: %s", settings.host, settings.port, e)
        return 2
    port = sock.getsockname()[1]
    if on_listening is not None:
        on_listening(port)
    loader = threading.Thread(target=load_in_background, name="thinkstruct-load", daemon=True)
    loader.start()
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        with engine_lock:
            for engine in engine_box:
                engine.close(grace_s=0.0)
                engine.compiler.close()  # its compile workers; the engine does not own it
    return 1 if failed.is_set() else 0


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host:port`` (``port`` 0: a free one).

    Its protocol is named (``IPPROTO_TCP``, not 0) because asyncio sets ``TCP_NODELAY``
    only on accepted sockets whose protocol says TCP, and they inherit this one's: left
    0, every response on a kept-alive connection, and every streamed chunk after the
    first, waited about 40 ms for the client's delayed ACK (measured: ``/health`` 44 ms
    against 1 ms).

    Raises:
        OSError: the address cannot be bound.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


def _bound_port(server: uvicorn.Server) -> int | None:
    for s in getattr(server, "servers", []):
        for sock in getattr(s, "sockets", []):
            return int(sock.getsockname()[1])
    return None
