"""Real servers for the server tests: uvicorn on a free loopback port, in a background thread."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any, Self

import httpx
import openai
import uvicorn

from thinkstruct.server import ServerSettings, create_app
from thinkstruct.server.runner import listening_socket

API_KEY = "test-key-0123456789"


class ManualClock:
    """A monotonic clock that moves only when a test says (``advance``): a compiler's
    failure memory on it expires when the test decides, however long requests take."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class RunningServer:
    """A uvicorn server in a daemon thread; ``url`` is its base URL."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._sock = listening_socket("127.0.0.1", 0)  # as `thinkstruct serve` listens
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=5)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    def __enter__(self) -> Self:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)
        self._sock.close()

    @property
    def state(self) -> Any:
        return self.app.state.thinkstruct

    def openai(self, *, api_key: str = "none", timeout: float = 300.0) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, timeout=timeout)

    def async_openai(self, *, api_key: str = "none", timeout: float = 300.0) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, timeout=timeout)

    def http(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=300.0, **kwargs)


@contextlib.contextmanager
def serving(engine: Any, settings: ServerSettings | None = None) -> Iterator[RunningServer]:
    with RunningServer(create_app(engine, settings)) as server:
        yield server


def start_engine(model: Any, *, warm: bool = True, **config: Any) -> Any:
    from thinkstruct.engine import Engine, EngineConfig
    from thinkstruct.grammar.service.compiler import CompilerConfig, GrammarCompiler

    # Generous: a loaded 2-core CI machine takes seconds to start a compile worker; the
    # workers are started up front so no test's first compile pays for that.
    compiler = GrammarCompiler(model.tokenizer, CompilerConfig(timeout_s=60.0))
    engine = Engine(model, config=EngineConfig(**config), compiler=compiler)
    engine.start()
    if warm:
        compiler.warm_up(timeout_s=120.0)
    return engine


def stop_engine(engine: Any) -> None:
    """Close the engine, then its compiler (the engine does not own it)."""
    engine.close()
    engine.compiler.close()
