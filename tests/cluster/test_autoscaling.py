"""Autoscaling on a live local Ray cluster (the tiny model, half a CPU per replica):
`--min-replicas 1 --max-replicas 2` with a low target of requests in flight per replica
and short delays. Streamed load through the official client grows the service to two
replicas, and ``/metrics`` then reports each of them and the service; when the load
stops, the service shrinks back to one: the replica removed stops taking requests while
it still streams a long answer, and finishes that answer (Ray Serve drains it), while
``/metrics`` keeps the service's counters growing. One service for the module; the
tests run in order (the second starts from the first's two replicas and load).
"""

from __future__ import annotations

import concurrent.futures
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "engine"))  # tiny_model

from ray_service import NO_EOS, RayCluster, RayService, metric_values

MODEL = "tiny-deepseek-v4"
HEADER = "x-thinkstruct-replica"
OFF = {"chat_template_kwargs": {"thinking": False}}
#: Requests in flight per replica Ray Serve aims at: LOAD streams call for two replicas
#: (more than TARGET), the two long answers alone for one (fewer).
TARGET = 3
LOAD = 6
#: Tokens of a long answer: seconds of streaming, so that one is in flight on each
#: replica when Ray Serve picks the one to remove (the model's context is 16384).
LONG = 8000
# The first test's time includes the service's start (up to ray_service.START_S).
pytestmark = pytest.mark.timeout(900)
#: Seconds a removed replica may take to finish its long answer (Ray Serve kills it after
#: that): 60 s was too few on a slower machine beside the other test worker.
GRACE_S = 300
#: Seconds any one phase may take on a loaded 2-core machine (a replica starts in
#: about 20 s idle, more under load).
PHASE_S = 150.0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models"), context_length=16384)


@pytest.fixture(scope="module")
def service(ray_cluster: RayCluster, model_dir: Path) -> Iterator[RayService]:
    scaling = ["--min-replicas", "1", "--max-replicas", "2", "--target-ongoing-requests", str(TARGET)]
    quick = ["--upscale-delay", "0.5", "--downscale-delay", "2", "--scaling-window", "3"]
    with RayService(
        ray_cluster,
        model_dir,
        *scaling,
        *quick,
        "--replica-cpus",
        "0.5",
        "--max-batch",
        "8",
        "--grace",
        str(GRACE_S),
    ) as s:
        yield s


@pytest.fixture(scope="module")
def http(service: RayService) -> Iterator[httpx.Client]:
    with service.http() as client:
        yield client


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


class Answer:
    """One streamed chat answer on its own thread: its replica (from the header), how it
    ended (its finish reason, or ``error: ...`` when the stream failed or ended without
    one) and its completion tokens; :meth:`close` leaves it early (the server cancels)."""

    def __init__(self, client: openai.OpenAI, text: str, *, max_tokens: int) -> None:
        self.replica: concurrent.futures.Future[str] = concurrent.futures.Future()
        self.outcome = ""
        self.tokens = 0
        self._leave = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(client, text, max_tokens), daemon=True)
        self._thread.start()

    def _run(self, client: openai.OpenAI, text: str, max_tokens: int) -> None:
        outcome = "error: no finish reason"
        try:
            with client.chat.completions.with_streaming_response.create(
                model=MODEL,
                messages=user(text),
                max_tokens=max_tokens,
                stream=True,
                stream_options={"include_usage": True},
                logit_bias=NO_EOS,
                extra_body=OFF,
            ) as response:
                self.replica.set_result(response.headers.get(HEADER, ""))
                for chunk in response.parse():
                    if self._leave.is_set():
                        outcome = "left"
                        break
                    if chunk.choices and chunk.choices[0].finish_reason:
                        outcome = chunk.choices[0].finish_reason
                    if chunk.usage is not None:
                        self.tokens = chunk.usage.completion_tokens
        except Exception as e:  # the test reports it
            outcome = f"error: {type(e).__name__}: {e}"
        finally:
            if not self.replica.done():
                self.replica.set_result("")
            self.outcome = outcome
            self._done.set()

    def close(self) -> None:
        self._leave.set()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout_s: float) -> str:
        assert self._done.wait(timeout_s), "a streamed answer hung"
        return self.outcome


class Load:
    """LOAD clients each streaming short answers one after another until :meth:`stop`."""

    def __init__(self, client: openai.OpenAI) -> None:
        self.answers: list[Answer] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(client, i), daemon=True) for i in range(LOAD)
        ]
        for t in self._threads:
            t.start()

    def _run(self, client: openai.OpenAI, worker: int) -> None:
        n = 0
        while not self._stop.is_set():
            # A different opening each time: no prefix ties the load to one replica.
            answer = Answer(client, f"{worker}-{n} tell me about the sea", max_tokens=48)
            self.answers.append(answer)
            answer.wait(PHASE_S)
            n += 1

    def replicas(self) -> set[str]:
        return {a.replica.result() for a in list(self.answers) if a.done()}

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(PHASE_S)
            assert not t.is_alive(), "a load client hung"


@pytest.fixture(scope="module")
def load(service: RayService) -> Iterator[dict[str, Load]]:
    holder: dict[str, Load] = {}
    yield holder
    if "load" in holder:
        holder["load"].stop()


def replica_metrics(http: httpx.Client) -> tuple[float, dict[str, float], float]:
    """``thinkstruct_replicas``, each replica's generated tokens, the service's total."""
    text = http.get("/metrics").text
    count = metric_values(text, "thinkstruct_replicas").get("", -1.0)
    per_replica = metric_values(text, "thinkstruct_replica_engine_generated_tokens")
    total = metric_values(text, "thinkstruct_engine_generated_tokens_total").get("", -1.0)
    return count, per_replica, total


def test_streamed_load_grows_the_service_to_two_replicas_and_metrics_name_both(
    service: RayService, http: httpx.Client, load: dict[str, Load]
) -> None:
    assert service.engine_replicas() and len(service.engine_replicas()) == 1  # --min-replicas
    client = service.openai()
    load["load"] = current = Load(client)
    deadline = time.monotonic() + PHASE_S
    while len(current.replicas()) < 2:  # the new replica takes requests once it is up
        assert time.monotonic() < deadline, f"no second replica: {current.replicas()}"
        time.sleep(0.2)
    names = current.replicas()
    assert len(names) == 2 and "" not in names, names
    # /metrics while scaled up: each replica with its label, the service as their sum
    # (the replicas post about once a second).
    while True:
        count, per_replica, total = replica_metrics(http)
        if count == 2 and set(per_replica) == names and total == sum(per_replica.values()):
            break
        assert time.monotonic() < deadline, (count, per_replica, total, names)
        time.sleep(0.2)
    failed = [a.outcome for a in list(current.answers) if a.done() and a.outcome != "length"]
    assert not failed, failed


def long_story(n: int) -> str:
    """A prompt several 16-token routing blocks long, its opening its own."""
    return f"Long story number {n}: " + " ".join(
        f"the ship {i} sails from port {i} to port {i + 1}." for i in range(6)
    )


def probe(http: httpx.Client, text: str) -> str:
    """The replica a one-token answer to ``text`` came from."""
    answer = http.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": user(text), "max_tokens": 1, **OFF},
    )
    assert answer.status_code == 200, answer.text
    return answer.headers[HEADER]


def test_when_the_load_stops_it_shrinks_to_one_and_the_removed_replica_finishes_its_answer(
    service: RayService, http: httpx.Client, load: dict[str, Load]
) -> None:
    current = load["load"]
    client = service.openai()
    deadline = time.monotonic() + PHASE_S
    # One long answer on each replica, whichever Ray Serve removes (one on a replica that
    # already has one leaves; a later one opens differently, so no prefix ties it).
    long: dict[str, tuple[str, Answer]] = {}
    tries = 0
    while len(long) < 2:
        assert time.monotonic() < deadline, f"long answers on {set(long)} only"
        text = long_story(tries)
        answer = Answer(client, text, max_tokens=LONG)
        tries += 1
        name = answer.replica.result(timeout=PHASE_S)
        if name in long or not name:
            answer.close()
            answer.wait(PHASE_S)
        else:
            long[name] = (text, answer)
    _, _, total_scaled_up = replica_metrics(http)
    current.stop()  # in flight now: the two long answers, fewer than TARGET
    failed = [a.outcome for a in current.answers if a.outcome != "length"]
    assert not failed, failed
    # A request opening like a replica's long answer goes to that replica (the router
    # follows the prefix) for as long as it takes requests: the first that goes to the
    # other one names the replica being removed, while its long answer still streams.
    removed = ""
    while not removed:
        assert time.monotonic() < deadline, "no replica was removed"
        for name, (text, answer) in long.items():
            served = probe(http, text)
            if served != name:
                assert not answer.done(), (
                    f"the long answers ended before a replica was removed: {answer.outcome}"
                )
                removed = name
                break
        time.sleep(0.1)
    (survivor,) = set(long) - {removed}
    outcomes = {name: (answer.wait(GRACE_S), answer.tokens) for name, (_, answer) in long.items()}
    # Every answer ran to its max_tokens, the removed replica's included: no error, no hang.
    assert outcomes == {removed: ("length", LONG), survivor: ("length", LONG)}, outcomes
    deadline = time.monotonic() + PHASE_S
    while True:  # the removed replica's process exits and leaves /metrics
        count, per_replica, total = replica_metrics(http)
        if count == 1 and set(per_replica) == {survivor} and len(service.engine_replicas()) == 1:
            break
        assert time.monotonic() < deadline, (count, per_replica, total)
        time.sleep(0.2)
    # The service's counters still count the removed replica's tokens (a Prometheus
    # counter must not go down).
    assert total >= total_scaled_up and total >= per_replica[survivor] + LONG, (total, per_replica)
    del load["load"]
