"""Fixtures of the playground tests: a real server on the embedded SmolLM2 and a real
headless Chromium (Debian's ``chromium`` package) driven by Playwright.

The browser is found by path; the tests skip without it on a developer's machine and fail
under CI, where ``.ci/run`` installs it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))  # server_harness

from playground_harness import PREFIX, StripPrefix
from server_harness import API_KEY, RunningServer, start_engine

from thinkstruct.server import ServerSettings, create_app

CHROMIUM = Path(os.environ.get("THINKSTRUCT_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _require_browser() -> None:
    missing = []
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright package")
    if not CHROMIUM.exists():
        missing.append(f"chromium at {CHROMIUM} (apt-get install -y chromium)")
    if not missing:
        return
    message = "the playground tests need " + " and ".join(missing)
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def engine() -> Iterator[Any]:
    from thinkstruct.engine import load_model

    # The embedded model as `make serve` runs it (its GGUF's own blocks).
    engine = start_engine(load_model(None, quantize="auto", progress=False), max_batch=4, max_queue=16)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def server(engine: Any) -> Iterator[RunningServer]:
    """The playground without an API key, at the server's root."""
    with RunningServer(create_app(engine, ServerSettings(default_max_tokens=256))) as running:
        yield running


@pytest.fixture(scope="session")
def keyed_server(engine: Any) -> Iterator[RunningServer]:
    """The same engine behind a server with an API key, under the proxy prefix ``/ts``."""
    app = create_app(engine, ServerSettings(api_key=API_KEY, default_max_tokens=64))
    with RunningServer(StripPrefix(app, PREFIX)) as running:
        running.app = app  # RunningServer.state reads app.state
        yield running


# Module scope: Playwright's sync API keeps an event loop running on the main thread while
# it is open, and later tests that call asyncio.run() must not find it.
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    _require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


class Console:
    """Everything the page wrote to its console, and its uncaught errors."""

    def __init__(self, page: Any) -> None:
        self.messages: list[tuple[str, str]] = []
        page.on("console", lambda m: self.messages.append((m.type, m.text)))
        page.on("pageerror", lambda e: self.messages.append(("pageerror", str(e))))

    def errors(self, *, allow: tuple[str, ...] = ()) -> list[tuple[str, str]]:
        return [
            (kind, text)
            for kind, text in self.messages
            if kind in ("error", "pageerror") and not any(a in text for a in allow)
        ]


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 780})
    page = context.new_page()
    page.set_default_timeout(120_000)  # a whole answer on two shared cores
    yield page
    context.close()


@pytest.fixture
def console(page: Any) -> Console:
    return Console(page)
