"""`thinkstruct serve --replicas 2` on the session's local Ray cluster (the tiny model,
half a CPU per replica): both replicas serve, bad input is the same 4xx as the single
process, a chat's next turn goes to its first turn's replica and reuses its prefix, a
killed replica costs no hung request and comes back, SIGTERM drains and ends the
service's processes in the cluster. One service for the module (its replicas take
seconds to start); the SIGTERM test stops it, so it runs last.
"""

from __future__ import annotations

import collections
import concurrent.futures
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "engine"))  # tiny_model
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))  # server_harness

from ray_service import NO_EOS, START_S, RayCluster, RayService, metric_values
from server_harness import serving, start_engine, stop_engine

from thinkstruct.engine.kv.prefix_cache import BLOCK_TOKENS as CACHE_BLOCK
from thinkstruct.server import ServerSettings

MODEL = "tiny-deepseek-v4"
HEADER = "x-thinkstruct-replica"
# Short answers, thinking off: the tests are about where requests go, not what they say.
OFF = {"chat_template_kwargs": {"thinking": False}}
# The first test's time includes the service's start (up to ray_service.START_S), the
# killed replica's test a replica's.
pytestmark = pytest.mark.timeout(600)
#: A shared opening several 16-token routing blocks long.
DOCUMENT = " ".join(f"Clause {i}: the tenant keeps the garden tidy and pays on the {i}th." for i in range(12))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def service(ray_cluster: RayCluster, model_dir: Path) -> Iterator[RayService]:
    with RayService(
        ray_cluster,
        model_dir,
        "--replicas",
        "2",
        "--replica-cpus",
        "0.5",
        "--max-batch",
        "4",
        "--grace",
        "20",
    ) as s:
        yield s


@pytest.fixture(scope="module")
def http(service: RayService) -> Iterator[httpx.Client]:
    with service.http() as client:
        yield client


def chat(http: httpx.Client, messages: list[dict[str, str]], **fields: Any) -> httpx.Response:
    body = {"model": MODEL, "messages": messages, "max_tokens": 4, **OFF, **fields}
    return http.post("/v1/chat/completions", json=body)


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_both_replicas_serve_and_name_themselves(service: RayService, http: httpx.Client) -> None:
    def ask(i: int) -> httpx.Response:
        return chat(http, user(f"question {i}"), max_tokens=24, logit_bias=NO_EOS)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, range(16)))
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    names = {a.headers[HEADER] for a in answers}
    assert len(names) == 2, names
    # The end-of-sequence token is kept out: every answer runs to its max_tokens.
    finishes = [a.json()["choices"][0]["finish_reason"] for a in answers]
    assert finishes == ["length"] * 16, [a.json()["choices"][0] for a in answers]


def test_streams_through_the_deployment_handle(service: RayService) -> None:
    client = service.openai()
    with client.chat.completions.with_streaming_response.create(
        model=MODEL, messages=user("stream please"), max_tokens=6, stream=True, extra_body=OFF
    ) as response:
        assert response.headers[HEADER]
        chunks = list(response.parse())
    finished = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finished == ["length"]
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) >= 1


def test_the_ingress_replica_itself_listens_on_the_port(service: RayService, http: httpx.Client) -> None:
    """Direct ingress: no HTTP proxy between the client and the app (one Ray hop per token)."""
    assert chat(http, user("hello")).status_code == 200
    owners = []
    for p in service.family():
        try:
            if any(c.status == "LISTEN" and c.laddr.port == service.port for c in p.net_connections("tcp")):
                owners.append(" ".join(p.cmdline()))
        except psutil.NoSuchProcess:
            pass
    assert len(owners) == 1 and "ServeReplica:thinkstruct:ingress" in owners[0], owners


def test_the_replicas_run_at_the_services_priority(service: RayService) -> None:
    """Not at Ray's default nice 15, which starves them beside any busy process."""
    replicas = service.engine_replicas()
    assert len(replicas) == 2
    assert [p.nice() for p in replicas] == [psutil.Process(service.process.pid).nice()] * 2


def test_the_stats_board_process_loads_no_torch(service: RayService) -> None:
    """The board holds a few dicts: its process imports Ray, not thinkstruct's server
    and torch (its class goes to Ray by value)."""
    (board,) = service.stats_board()
    maps = Path(f"/proc/{board.pid}/maps").read_text()
    assert "libtorch" not in maps and "_ray" in maps


def test_metrics_report_each_replica_and_the_service(service: RayService, http: httpx.Client) -> None:
    served = {chat(http, user(f"count me {i}"), max_tokens=8).headers[HEADER] for i in range(8)}
    deadline = time.monotonic() + 60
    while True:  # the replicas post about once a second; the service is idle now
        text = http.get("/metrics").text
        per_replica = metric_values(text, "thinkstruct_replica_engine_generated_tokens")
        total = metric_values(text, "thinkstruct_engine_generated_tokens_total")
        if (
            metric_values(text, "thinkstruct_replicas") == {"": 2.0}
            and len(per_replica) == 2
            and served <= set(per_replica)
            and all(v > 0 for v in per_replica.values())  # both served in the tests before
            and total == {"": sum(per_replica.values())}
        ):
            break
        assert time.monotonic() < deadline, text


BAD_REQUESTS: list[dict[str, Any]] = [
    {"model": MODEL, "messages": []},
    {"model": "no-such-model", "messages": user("hi")},
    {"model": MODEL, "messages": user("hi"), "max_tokens": 10**7},
    {"model": MODEL, "messages": user("hi"), "logit_bias": {"999999": 1}},
    {"model": MODEL, "messages": user("hi"), "temperature": -1},
    {
        "model": MODEL,
        "messages": user("hi"),
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}},
    },
]


def test_bad_input_is_the_same_4xx_as_without_ray(http: httpx.Client, model_dir: Path) -> None:
    from thinkstruct.engine import load_model

    # No compile process started ahead: none of these constraints compiles.
    engine = start_engine(load_model(model_dir, progress=False), warm=False, max_batch=2, max_queue=8)
    try:
        with serving(engine, ServerSettings()) as single, single.http() as alone:
            for body in BAD_REQUESTS:
                expected = alone.post("/v1/chat/completions", json=body)
                got = http.post("/v1/chat/completions", json=body)
                assert 400 <= expected.status_code < 500, body
                assert (got.status_code, got.json()) == (expected.status_code, expected.json()), body
            bad_json = http.post(
                "/v1/chat/completions", content=b"{", headers={"content-type": "application/json"}
            )
            assert bad_json.status_code == 400 and "error" in bad_json.json()
    finally:
        stop_engine(engine)


def test_a_chats_next_turn_goes_to_its_replica_and_reuses_its_prefix(http: httpx.Client) -> None:
    served_first = set()
    for topic in range(4):
        first = user(f"Conversation {topic}. {DOCUMENT} Summarise clause {topic}.")
        one = chat(http, first)
        assert one.status_code == 200, one.text
        answer = one.json()["choices"][0]["message"]["content"]
        second = [
            *first,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "And the next?"},
        ]
        two = chat(http, second)
        assert two.status_code == 200, two.text
        assert two.headers[HEADER] == one.headers[HEADER]
        prompt = one.json()["usage"]["prompt_tokens"]
        cached = two.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached >= prompt // 2, (cached, prompt)
        served_first.add(one.headers[HEADER])


def test_concurrent_conversations_sharing_a_system_prompt_keep_their_replicas(service: RayService) -> None:
    """Twelve chats at once, one long system prompt for all and a short first question
    each (no 16-token block of its own), then all their second turns at once: each
    second turn goes to its first turn's replica and reuses its whole prompt, and the
    shared prompt spread the first turns over both replicas (a shared prefix alone takes
    its holder only within one request of the least busy replica)."""

    def first_turn(chat_id: int) -> tuple[list[dict[str, str]], httpx.Response]:
        messages = [{"role": "system", "content": DOCUMENT}, *user(f"Chat {chat_id}?")]
        with service.http() as client:
            return messages, chat(client, messages, max_tokens=16, temperature=0)

    def second_turn(first: tuple[list[dict[str, str]], httpx.Response]) -> httpx.Response:
        messages, one = first
        answer = one.json()["choices"][0]["message"]["content"]
        turn = [*messages, {"role": "assistant", "content": answer}, *user("And then?")]
        with service.http() as client:
            return chat(client, turn, temperature=0)

    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        firsts = list(pool.map(first_turn, range(12)))
        assert all(one.status_code == 200 for _, one in firsts), [one.text for _, one in firsts]
        seconds = list(pool.map(second_turn, firsts))
    assert all(two.status_code == 200 for two in seconds), [two.text for two in seconds]
    where = [
        (one.headers[HEADER], two.headers[HEADER]) for (_, one), two in zip(firsts, seconds, strict=True)
    ]
    assert all(a == b for a, b in where), where
    for (_, one), two in zip(firsts, seconds, strict=True):
        whole = one.json()["usage"]["prompt_tokens"] // CACHE_BLOCK * CACHE_BLOCK
        assert two.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= whole
    # A replica's load is its requests in flight: one that answers faster (the other
    # still prefilling the shared prompt) frees up sooner and takes more of the burst
    # (9/3 seen beside the rest of the suite; within 2 of even on a quiet machine).
    # Under the conversations' bound (8 more than the least busy) the prompt's first
    # holder could keep 10 of the 12.
    split = collections.Counter(a for a, _ in where)
    assert len(split) == 2 and min(split.values()) >= 3, split


def replica_names(http: httpx.Client, *, tries: int) -> set[str]:
    def ask(i: int) -> str:
        answer = chat(http, user(f"who serves {i}"))
        assert answer.status_code == 200, answer.text
        return answer.headers[HEADER]

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        return set(pool.map(ask, range(tries)))


def stream_outcome(service: RayService, text: str, started: concurrent.futures.Future[None] | None) -> str:
    """How a streamed request ended: its finish reason, or ``error`` for an error event."""
    with (
        service.http() as client,
        client.stream(
            "POST",
            "/v1/chat/completions",
            # No end-of-sequence token: an answer that is not cut runs to its max_tokens.
            json={
                "model": MODEL,
                "messages": user(text),
                "max_tokens": 400,
                "stream": True,
                "logit_bias": NO_EOS,
                **OFF,
            },
        ) as response,
    ):
        assert response.status_code == 200
        outcome = "none"
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk and "choices" not in chunk:
                outcome = "error"
                continue
            choice = chunk["choices"][0]
            if started is not None and choice["delta"].get("content") and not started.done():
                started.set_result(None)
            if choice.get("finish_reason"):
                outcome = choice["finish_reason"]
        return outcome


def test_a_killed_replica_ends_its_requests_clearly_and_comes_back(
    service: RayService, http: httpx.Client
) -> None:
    before = replica_names(http, tries=16)
    assert len(before) == 2
    victim = service.engine_replicas()[0]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        starts = [concurrent.futures.Future[None]() for _ in range(6)]
        streams = [pool.submit(stream_outcome, service, f"long story {i}", starts[i]) for i in range(6)]
        concurrent.futures.wait(starts, timeout=120)
        victim.kill()  # SIGKILL: as the kernel's OOM killer would
        # Sent after the kill: the dead replica may still be chosen; a request that has
        # produced nothing yet is retried once on the other replica.
        late = list(pool.map(lambda i: chat(http, user(f"after the kill {i}")), range(6)))
        outcomes = [s.result(timeout=180) for s in streams]  # none hangs
    assert all(a.status_code == 200 for a in late), [a.text for a in late]
    assert set(outcomes) <= {"length", "stop", "error"}, outcomes
    assert "error" in outcomes  # the victim's streams end with an error event
    assert any(o != "error" for o in outcomes)  # the other replica's go on
    # Ray Serve replaces the replica: a new process that loads the model and starts its
    # compile workers (over 100 s seen beside the other test worker; the service's start
    # is allowed as long).
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        names = replica_names(http, tries=8)
        if len(names) == 2 and names != before:
            break
        time.sleep(0.5)  # between rounds of requests: the new replica's start needs the cores
    else:
        pytest.fail(f"the killed replica did not come back: still {names}")


def test_sigterm_drains_in_flight_requests_and_leaves_no_process(service: RayService) -> None:
    family = service.family()
    assert service.engine_replicas() and set(service.engine_replicas()) <= set(family)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        started = concurrent.futures.Future[None]()
        stream = pool.submit(stream_outcome, service, "a story to finish", started)
        started.result(timeout=120)
        status = service.stop(timeout_s=120)
        assert stream.result(timeout=60) == "length"  # it ran to its max_tokens
    assert status == 0, "".join(service.log[-30:])
    assert not [p for p in family if p.is_running() and p.status() != "zombie"]
