"""vLLM's real OpenAI server with thinkstruct's plugin, for the integration tests.

The server runs from ``.venv-vllm`` (``make venv-vllm``; ``make test`` builds it first),
as ``make vllm-serve`` starts it (:func:`thinkstruct.vllm_serve.vllm_command`), on a free
loopback port; the tests talk to it with the ``openai`` client of this environment.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import httpx
import openai
import pytest

from thinkstruct.vllm_serve import vllm_command

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from alone import free_port  # noqa: E402 - a port below the ephemeral range (see its doc)

VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
#: Most seconds vLLM may take to report healthy (60-120 s measured on 2 idle cores; the
#: test machine may be shared). The test modules' pytest timeout leaves room for it.
START_DEADLINE_S = 420.0
#: vLLM runs eagerly in the tests: its default torch.compile warm-up, with a cold compile
#: cache (a fresh machine), did not finish within 3 minutes on 2 shared cores. What the
#: tests check (the plugin's masks, refusals, reasoning and tool calls) does not depend on
#: how vLLM runs the model's layers.
TEST_ARGS = ("--enforce-eager",)


class VllmServer:
    """A running vLLM server: ``url``, ``model``, a client factory, the log so far."""

    def __init__(self, url: str, model: str, log: Path) -> None:
        self.url = url
        self.model = model
        self.log = log

    def openai(self, *, timeout: float = 600.0) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="none", max_retries=0, timeout=timeout)

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@contextlib.contextmanager
def vllm_server(
    *, backend: str = "thinkstruct", env: Mapping[str, str] | None = None
) -> Iterator[VllmServer]:
    """Start vLLM on the embedded model and wait until ``/health`` answers 200."""
    if not VLLM_PYTHON.is_file():
        pytest.fail(f"{VLLM_PYTHON} is missing: run `make venv-vllm` (make test builds it)")
    port = free_port()
    command = vllm_command(
        port=port, backend=backend, python=str(VLLM_PYTHON), progress=False, extra=TEST_ARGS
    )
    model = command[command.index("--served-model-name") + 1]
    # vLLM sets its workers' OpenMP threads itself (its CPU binding), not as the test run
    # sets them for thinkstruct's engine; the main environment's paths stay out too.
    environment = {k: v for k, v in os.environ.items() if not k.startswith("OMP_")}
    environment.update({"VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": "", **(env or {})})
    with tempfile.NamedTemporaryFile("w", prefix="vllm-", suffix=".log", delete=False) as log_file:
        log = Path(log_file.name)
        process = subprocess.Popen(
            command, env=environment, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
    server = VllmServer(f"http://127.0.0.1:{port}", model, log)
    try:
        deadline = time.monotonic() + START_DEADLINE_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"vLLM exited with {process.returncode}:\n{server.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{server.url}/health", timeout=5).status_code == 200:
                    break
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM not healthy after {START_DEADLINE_S:.0f} s:\n{server.log_tail()}")
            time.sleep(1)
        yield server
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        print(server.log_tail(), file=sys.stderr)
