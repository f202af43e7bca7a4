"""``thinkstruct serve`` and ``thinkstruct generate``, run as users run them."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import jsonschema
import pytest

from thinkstruct.cli import main

BOOLEAN_ANSWER = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}


def _environment() -> dict[str, str]:
    # The child imports the same thinkstruct as this process.
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class _Serve:
    """``thinkstruct serve`` in a child process; ``url`` once it listens."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "thinkstruct.cli",
                "serve",
                "--port",
                "0",
                "--log-level",
                "warning",
                *args,
            ],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env=_environment(),
        )
        self.lines: list[str] = []
        self._listening = threading.Event()
        self.url = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._listening.wait(120):
            self.proc.kill()
            raise AssertionError("serve did not start listening:\n" + "".join(self.lines))

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            found = re.search(r"listening on (http://\S+?:\d+)", line)
            if found:
                self.url = found.group(1)
                self._listening.set()

    def wait_healthy(self, seconds: float = 120) -> list[int]:
        seen = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            status = httpx.get(f"{self.url}/health", timeout=5).status_code
            if not seen or seen[-1] != status:
                seen.append(status)
            if status == 200:
                return seen
            time.sleep(0.1)
        raise AssertionError(f"never healthy: {seen}\n{''.join(self.lines)}")

    def stderr_after_exit(self) -> str:
        """Everything the process wrote to stderr, once it has exited."""
        self._reader.join(30)
        return "".join(self.lines)

    def stop(self, sig: int) -> int:
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


def test_serve_answers_then_sigterm_drains_ends_in_flight_requests_and_exits_0(tiny_model_dir: Path) -> None:
    # One backend: the server warms only its compile workers before it reports healthy.
    # A grace of 3 s: room for a 4-token request in flight to finish, not a 4000-token one
    # (seed 1 writes no end-of-sequence token in its first 3000).
    server = _Serve(
        "--model", str(tiny_model_dir), "--dtype", "float32", "--quantize", "none",
        "--grace", "3", "--backend", "llguidance",
    )  # fmt: skip
    statuses = server.wait_healthy()
    assert set(statuses) <= {503, 200} and statuses[-1] == 200
    chat = f"{server.url}/v1/chat/completions"
    model = httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"][0]["id"]
    messages = [{"role": "user", "content": "hi"}]

    def stream(max_tokens: int, lines: list[str], started: threading.Event) -> None:
        body = {"model": model, "messages": messages, "max_tokens": max_tokens, "stream": True, "seed": 1}
        with httpx.stream("POST", chat, json=body, timeout=120) as response:
            for line in response.iter_lines():
                if line:
                    lines.append(line)
                    started.set()

    readers, outputs = [], []
    for max_tokens in (4000, 4):  # both in flight when the signal comes
        lines: list[str] = []
        started = threading.Event()
        reader = threading.Thread(target=stream, args=(max_tokens, lines, started))
        reader.start()
        assert started.wait(60)
        readers.append(reader)
        outputs.append(lines)
    server.proc.send_signal(signal.SIGTERM)
    # From now on nothing new is taken: 503 while draining, then the socket is closed;
    # until then (the signal not yet handled) a request is served as usual.
    deadline = time.monotonic() + 60
    while True:
        try:
            answer = httpx.post(
                chat, json={"model": model, "messages": messages, "max_tokens": 1}, timeout=30
            )
        except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError):
            break  # refused at the socket: closed, or closing as this request arrived
        if answer.status_code == 503:
            assert answer.json()["error"]["code"] == "shutting_down"
            break
        assert answer.status_code == 200
        assert time.monotonic() < deadline, "new requests were still taken after SIGTERM"
        time.sleep(0.05)
    assert server.proc.poll() is None  # refused while the requests in flight still run
    assert server.proc.wait(60) == 0
    for reader in readers:
        reader.join(30)
    finishes = []
    for lines in outputs:
        assert lines[-1] == "data: [DONE]"
        finishes.append([json.loads(line[6:])["choices"][0].get("finish_reason") for line in lines[:-1]][-1])
    # The short one finished within the grace; the long one was ended, with a finish reason.
    assert finishes == ["abort", "length"]


def test_serve_exits_0_on_ctrl_c(tiny_model_dir: Path) -> None:
    server = _Serve("--model", str(tiny_model_dir), "--api-key", "secret", "--backend", "llguidance")
    server.wait_healthy()
    assert httpx.get(f"{server.url}/v1/models", timeout=10).status_code == 401
    assert server.stop(signal.SIGINT) == 0
    # Nothing after the stop: no leak report of native bindings from the interpreter's teardown.
    assert "leaked" not in server.stderr_after_exit()


def test_serve_usage_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["serve", "--backend", "magic"]) == 2
    assert "unknown backend" in capsys.readouterr().err
    assert main(["serve", "--model", str(tmp_path / "missing")]) == 2
    assert "no model at" in capsys.readouterr().err


def test_generate_prints_the_reasoning_and_the_validated_answer(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    schema = tmp_path / "answer.schema.json"
    schema.write_text(json.dumps(BOOLEAN_ANSWER))
    code = main(
        [
            "generate",
            "--model",
            str(tiny_model_dir),
            "--dtype",
            "float32",
            "--schema",
            str(schema),
            "--think",
            "--max-reasoning-tokens",
            "4",
            "--max-tokens",
            "40",
            "--seed",
            "3",
            "Is it on?",
        ]
    )
    out, err = capsys.readouterr()
    assert "--- reasoning" in err and "--- answer" in err
    assert code == 0, err
    jsonschema.validate(json.loads(out), BOOLEAN_ANSWER)
    assert "valid" in err


def test_generate_thinks_for_half_the_tokens_unless_told(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The tiny model never ends its thought by itself: without a budget of its own,
    generate forces the answer after half of --max-tokens, and it still validates."""
    schema = tmp_path / "answer.schema.json"
    schema.write_text(json.dumps(BOOLEAN_ANSWER))
    args = ["generate", "--model", str(tiny_model_dir), "--schema", str(schema), "--think", "--seed", "3"]
    code = main([*args, "--max-tokens", "40", "Is it on?"])
    out, err = capsys.readouterr()
    assert code == 0, err
    jsonschema.validate(json.loads(out), BOOLEAN_ANSWER)
    reasoning = err.split("--- reasoning", 1)[1].split("--- answer", 1)[0]
    assert reasoning.strip()


def test_generate_refuses_a_bad_schema(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    schema = tmp_path / "bad.schema.json"
    schema.write_text('{"type": "object", "properties": {"a": {"type": "strnig"}}}')
    assert main(["generate", "--model", str(tiny_model_dir), "--schema", str(schema), "hi"]) == 1
    assert "/properties/a/type" in capsys.readouterr().err
