"""Servers, load and requests shared by the vLLM benchmarks (``vllm.py``, ``vllm_routes.py``):
thinkstruct's own server or vLLM (from ``.venv-vllm``, as ``make vllm-serve`` starts it)
as a process of its own, closed-loop users, first-token times, a JSONSchemaBench sample
through a server, thinking requests."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jsonschema

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e import PERSON, QUESTIONS  # the schema and prompts of the engine's end-to-end benchmark
from serve_process import free_port, start_serve, wait_healthy
from thinkstruct.vllm_serve import vllm_command

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
MAX_TOKENS = 128


@dataclass
class Server:
    name: str
    url: str
    model: str
    thinking_off: dict[str, Any] = field(default_factory=dict)


@contextmanager
def thinkstruct_server() -> Iterator[Server]:
    port = free_port()
    process = start_serve(port)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, process)
        model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        yield Server("thinkstruct serve", url, model, {"chat_template_kwargs": {"enable_thinking": False}})
    finally:
        _stop(process)


@contextmanager
def vllm_server(
    backend: str, *, extra: Sequence[str] = (), pythonpath: str = "", name: str = ""
) -> Iterator[Server]:
    """vLLM with ``backend`` for structured outputs (``extra``: more of vLLM's flags;
    ``pythonpath``: where vLLM's processes find the modules those flags name)."""
    port = free_port()
    command = vllm_command(port=port, backend=backend, python=str(VLLM_PYTHON), progress=False, extra=extra)
    # vLLM sets its workers' OpenMP threads itself (its CPU binding); this process's
    # settings for thinkstruct's engine stay here.
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMP_")}
    env.update(VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"), PYTHONPATH=pythonpath)
    with tempfile.NamedTemporaryFile("w", prefix="vllm-bench-", suffix=".log", delete=False) as log:
        process = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url, process, timeout_s=900)
        except RuntimeError as error:
            tail = Path(log.name).read_text(errors="replace").splitlines()[-40:]
            raise RuntimeError(f"{error}; the end of {log.name}:\n" + "\n".join(tail)) from None
        model = command[command.index("--served-model-name") + 1]
        yield Server(
            name or f"vLLM {backend}", url, model, {"chat_template_kwargs": {"enable_thinking": False}}
        )
        Path(log.name).unlink()  # kept where the server failed to start
    finally:
        _stop(process)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server (its process group, where it has one), SIGKILL after 3 minutes."""
    if process.poll() is not None:
        return
    _signal(process, signal.SIGTERM)
    try:
        process.wait(timeout=180)
    except subprocess.TimeoutExpired:
        _signal(process, signal.SIGKILL)
        process.wait()


def _signal(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):  # not a group leader: the process alone
        process.send_signal(sig)


def chat_body(
    server: Server, question: str, *, schema: dict[str, Any] | None, thinking: bool = False
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": server.model,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0.7,
        **({} if thinking else server.thinking_off),
    }
    if schema is not None:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema, "strict": True},
        }
    return body


def warm_up(server: Server) -> None:
    """One free and one JSON request, answered before anything is measured: each side's
    lazy start-up (compile services, vocabulary views, first compile) is not measured."""
    with httpx.Client(base_url=server.url, timeout=900) as client:
        for schema in (None, PERSON):
            client.post("/v1/chat/completions", json=chat_body(server, QUESTIONS[0], schema=schema))


@dataclass(frozen=True)
class Load:
    """What a closed loop measured: tokens per second, and the requests behind it."""

    tokens_per_s: float
    requests: int
    mean_tokens: float
    failed: int = 0

    def line(self) -> str:
        failed = f", {self.failed} failed" if self.failed else ""
        return f"{self.tokens_per_s:7.1f} tok/s ({self.requests} answers of {self.mean_tokens:.0f} tokens{failed})"


async def closed_loop(
    server: Server, users: int, window_s: float, make_body: Callable[[int], dict[str, Any]]
) -> Load:
    """``users`` clients sending one request after another for ``window_s`` seconds:
    completion tokens per second of the requests that finish in the window."""
    done: list[int] = []
    failed: list[int] = []
    deadline = time.monotonic() + window_s
    async with httpx.AsyncClient(base_url=server.url, timeout=window_s + 300) as client:

        async def user(index: int) -> None:
            n = index
            while time.monotonic() < deadline:
                try:
                    reply = await client.post("/v1/chat/completions", json=make_body(n))
                except httpx.HTTPError:
                    failed.append(n)  # no answer (a timeout): counted, not fatal
                    continue
                finally:
                    n += users
                if reply.status_code == 200 and time.monotonic() <= deadline:
                    done.append(int(reply.json()["usage"]["completion_tokens"]))
                elif reply.status_code != 200:
                    failed.append(n)

        started = time.monotonic()
        await asyncio.gather(*(user(i) for i in range(users)))
        elapsed = min(time.monotonic(), deadline) - started
    return Load(sum(done) / elapsed, len(done), sum(done) / max(len(done), 1), len(failed))


async def first_token_s(server: Server, body: dict[str, Any]) -> float:
    """Seconds from sending a streamed request to its first content or reasoning chunk."""
    async with httpx.AsyncClient(base_url=server.url, timeout=600) as client:
        started = time.monotonic()
        async with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as reply:
            async for line in reply.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    delta = (
                        json.loads(line[6:])["choices"][0]["delta"] if json.loads(line[6:])["choices"] else {}
                    )
                    if delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"):
                        return time.monotonic() - started
    return float("nan")


def fresh_schema() -> dict[str, Any]:
    """PERSON with one more property of a name never used: a cold compile everywhere."""
    return {
        **PERSON,
        "properties": {
            **PERSON["properties"],
            f"note_{uuid.uuid4().hex[:8]}": {"type": "string", "maxLength": 20},
        },
    }


@dataclass
class Conformance:
    refused: int = 0
    failed: int = 0
    valid: int = 0
    invalid: int = 0
    cut: int = 0

    def line(self) -> str:
        total = self.refused + self.failed + self.valid + self.invalid + self.cut
        return (
            f"refused {self.refused}/{total} ({100 * self.refused / max(total, 1):.1f} %), 5xx {self.failed}, "
            f"valid {self.valid}, invalid {self.invalid}, cut by max_tokens {self.cut}"
        )


async def conformance(server: Server, sample: list[Any]) -> Conformance:
    counts = Conformance()
    async with httpx.AsyncClient(base_url=server.url, timeout=900) as client:
        for entry in sample:
            schema = json.loads(entry.schema)
            body = chat_body(server, "Write an example JSON document for this schema.", schema=schema)
            body.update(temperature=0, max_tokens=256)
            reply = await client.post("/v1/chat/completions", json=body)
            if 400 <= reply.status_code < 500:
                counts.refused += 1
            elif reply.status_code != 200:
                counts.failed += 1
            elif (choice := reply.json()["choices"][0])["finish_reason"] != "stop":
                counts.cut += 1
            elif _valid(choice["message"]["content"], schema):
                counts.valid += 1
            else:
                counts.invalid += 1
    return counts


def _valid(text: str | None, schema: Any) -> bool:
    try:
        validator = jsonschema.validators.validator_for(schema)
        return bool(
            validator(schema, format_checker=validator.FORMAT_CHECKER).is_valid(json.loads(text or ""))
        )
    except (ValueError, jsonschema.exceptions.SchemaError, jsonschema.exceptions.UnknownType, RecursionError):
        return False


async def thinking(server: Server, count: int) -> tuple[int, int]:
    """Requests with thinking on (the family's default): how many of ``count`` came back
    with a thought and a valid answer."""
    good = 0
    async with httpx.AsyncClient(base_url=server.url, timeout=900) as client:
        for i in range(count):
            body = chat_body(
                server, QUESTIONS[i % len(QUESTIONS)] + " Answer in JSON.", schema=PERSON, thinking=True
            )
            body.update(max_tokens=256, temperature=0.7, seed=i)
            reply = await client.post("/v1/chat/completions", json=body)
            if reply.status_code != 200:
                continue
            message = reply.json()["choices"][0]["message"]
            thought = message.get("reasoning_content") or message.get("reasoning")
            if thought and _valid(message.get("content"), PERSON):
                good += 1
    return good, count
