"""Faults seen from the HTTP side, on the tiny model's shared server: clients that leave
or stall, requests whose grammar or sampling fails, compile workers killed from outside.
Each fault costs only the request it belongs to; the server goes on.

Faults inside a request are injected by seed (``tests/engine/fault_injection.py``); the
server, engine, model and grammars are the real ones.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import threading
import uuid
from typing import Any

import httpx
import psutil
import pytest
from fault_injection import (
    REJECTING_GRAMMAR_SEED,
    SAMPLING_FAULT_SEED,
    inject_rejecting_grammar,
    inject_sampling_fault,
    step_log,
)
from server_harness import RunningServer

from polling import HANG_S, wait_until
from thinkstruct.engine import RequestHandle

MESSAGES = [{"role": "user", "content": "Say something."}]
NO_THINKING = {"chat_template_kwargs": {"thinking": False}}


@pytest.fixture(scope="module")
def model(tiny_server: RunningServer) -> str:
    return str(tiny_server.state.model_name)


def sse_events(text: str) -> list[Any]:
    """The JSON payloads of an SSE body, and ``"[DONE]"`` for the end marker."""
    events: list[Any] = []
    for line in text.splitlines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def test_a_client_that_disconnects_mid_stream_frees_its_slot_within_one_step(
    tiny_server: RunningServer, tiny_engine: Any, model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    stats = tiny_engine.stats
    wait_until(lambda: stats.slots_used == 0, "the engine is idle")
    cancelled = threading.Event()
    real_cancel = RequestHandle.cancel
    real_submit = type(tiny_engine).submit
    mine: list[RequestHandle] = []

    def submit(engine: Any, *args: Any, **kwargs: Any) -> RequestHandle:
        handle = real_submit(engine, *args, **kwargs)
        mine.append(handle)
        return handle

    def cancel(handle: RequestHandle) -> None:  # the server's cancel, noted for the step log
        real_cancel(handle)
        if any(handle is h for h in mine):  # not a late cancel of an earlier test's request
            cancelled.set()

    monkeypatch.setattr(type(tiny_engine), "submit", submit)
    monkeypatch.setattr(RequestHandle, "cancel", cancel)
    aborted = stats.finished["abort"]
    body = {"model": model, "messages": MESSAGES, "max_tokens": 2000, "stream": True, "temperature": 1.0}
    with step_log(tiny_engine, cancelled.is_set) as log:
        with httpx.Client(base_url=tiny_server.url, timeout=HANG_S) as http:
            with http.stream("POST", "/v1/chat/completions", json=body) as response:
                assert response.status_code == 200
                for i, _ in enumerate(response.iter_lines()):
                    if i > 6:
                        assert stats.slots_used == 1 and stats.kv_tokens > 0
                        break  # leave mid-stream: the connection closes here
        wait_until(lambda: any(s.slots_used == 0 for s in log.after_cancel()), "the slot is free")
    assert stats.finished["abort"] == aborted + 1
    after = log.after_cancel()
    # At most the engine iteration under way when the server cancelled ends with the slot held.
    assert len([s for s in after if s.slots_used]) <= 1
    freed = next(s for s in after if s.slots_used == 0)
    assert freed.kv_tokens == 0


def test_a_client_that_stops_reading_blocks_nobody_and_loses_nothing(
    tiny_server: RunningServer, tiny_engine: Any, model: str
) -> None:
    stats = tiny_engine.stats
    wait_until(lambda: stats.slots_used == 0, "the engine is idle")
    finished = stats.finished["length"]
    body = json.dumps(
        {
            "model": model,
            "messages": MESSAGES,
            "max_tokens": 24,
            "stream": True,
            "stream_options": {"include_usage": True},
            **NO_THINKING,
        }
    ).encode()
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the smallest window the kernel allows
    stalled.settimeout(HANG_S)
    stalled.connect(("127.0.0.1", tiny_server.port))
    try:
        stalled.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\nconnection: close\r\n"
            b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
        )
        # Nothing is read from `stalled` until the others are done.
        with tiny_server.http() as http:
            for _ in range(2):
                other = {"model": model, "messages": MESSAGES, "max_tokens": 4, **NO_THINKING}
                answer = http.post("/v1/chat/completions", json=other)
                assert answer.status_code == 200 and answer.json()["choices"][0]["finish_reason"] == "length"
        # The engine finished the stalled request without waiting for its reader: its slot
        # is free, and what it wrote waits for the reader (at most its max_tokens deltas).
        wait_until(
            lambda: stats.finished["length"] >= finished + 3 and stats.slots_used == 0, "all three done"
        )
        received = b""
        while chunk := stalled.recv(65536):
            received += chunk
    finally:
        stalled.close()
    head, _, rest = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    events = sse_events(_unchunk(rest).decode())
    assert events[-1] == "[DONE]"
    finishes = [c["choices"][0]["finish_reason"] for c in events[:-1] if c["choices"]]
    assert finishes[-1] == "length"
    assert events[-2]["usage"]["completion_tokens"] == 24


def _dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # dead, not yet reaped
    except psutil.NoSuchProcess:
        return True


def _unchunk(body: bytes) -> bytes:
    """The payload of an HTTP/1.1 chunked body."""
    out = b""
    while body:
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out, body = out + body[:size], body[size + 2 :]
    return out


@pytest.mark.parametrize("fault", ["rejecting grammar", "sampling"])
def test_a_fault_in_one_request_fails_only_that_request(
    tiny_server: RunningServer, tiny_engine: Any, model: str, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    if fault == "sampling":
        inject_sampling_fault(monkeypatch, after=2)
        bad_seed, expected = SAMPLING_FAULT_SEED, "internal error sampling this request"
    else:
        inject_rejecting_grammar(monkeypatch, tiny_engine)
        bad_seed, expected = REJECTING_GRAMMAR_SEED, "rejected the sampled token"
    regex = "[a-z]{40}"
    body = {
        "model": model,
        "messages": MESSAGES,
        "max_tokens": 60,
        "temperature": 1.0,
        "regex": regex,
        **NO_THINKING,
    }
    errors = tiny_engine.stats.finished["error"]

    async def together() -> tuple[httpx.Response, httpx.Response, httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(base_url=tiny_server.url, timeout=HANG_S) as http:
            return await asyncio.gather(  # one batch: the faulty requests and a good one
                http.post("/v1/chat/completions", json={**body, "seed": bad_seed}),
                http.post("/v1/chat/completions", json={**body, "seed": bad_seed, "stream": True}),
                http.post(
                    "/v1/completions",
                    json={
                        "model": model,
                        "prompt": "Say",
                        "max_tokens": 60,
                        "regex": regex,
                        "seed": bad_seed,
                    },
                ),
                http.post("/v1/chat/completions", json={**body, "seed": 5}),
            )

    whole, streamed, completion, good = asyncio.run(together())
    # Not streamed: an OpenAI error object with a 500 (the official clients retry it).
    for failed in (whole, completion):
        assert failed.status_code == 500
        error = failed.json()["error"]
        assert error["type"] == "server_error" and error["code"] == "generation_failed"
        assert (
            error["message"].startswith("choice 0 failed while generating: ") and expected in error["message"]
        )
    # Streamed (the 200 was sent before the fault): the choice ends with finish_reason
    # "error" and its error message, and the stream completes.
    assert streamed.status_code == 200
    events = sse_events(streamed.text)
    assert events[-1] == "[DONE]"
    last = events[-2]["choices"][0]
    assert last["finish_reason"] == "error" and expected in last["error"]["message"]
    # The request in the same batch without the fault is answered as usual.
    assert good.status_code == 200
    choice = good.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and re.fullmatch(regex, choice["message"]["content"])
    assert tiny_engine.stats.finished["error"] == errors + 3
    with tiny_server.http() as http:
        assert http.get("/health").status_code == 200


def test_a_killed_compile_worker_is_replaced_and_the_next_request_succeeds(
    tiny_server: RunningServer, tiny_engine: Any, model: str
) -> None:
    # The session's compiler started an xgrammar worker up front (start_engine warms it).
    pool = tiny_engine.compiler._pools["xgrammar"]
    killed = pool.pids()
    assert killed
    for pid in killed:
        os.kill(pid, signal.SIGKILL)  # the kernel's OOM killer does the same
    wait_until(lambda: all(_dead(pid) for pid in killed), "the killed workers are dead")
    answers = [f"yes-{uuid.uuid4().hex[:8]}", "no"]  # a schema no earlier request compiled
    schema = {
        "type": "object",
        "properties": {"a": {"enum": answers}},
        "required": ["a"],
        "additionalProperties": False,
    }
    with tiny_server.http() as http:
        reply = http.post(
            "/v1/chat/completions",
            json={
                "model": model,
                "messages": MESSAGES,
                "max_tokens": 40,
                "backend": "xgrammar",
                "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
                **NO_THINKING,
            },
        )
    assert reply.status_code == 200, reply.text
    answer = reply.json()
    assert answer["thinkstruct"]["backend"] == "xgrammar"
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert json.loads(answer["choices"][0]["message"]["content"])["a"] in answers
    fresh = pool.pids()
    assert fresh and not set(fresh) & set(killed)
