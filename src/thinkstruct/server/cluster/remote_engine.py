"""The ingress's engine: :class:`RemoteEngine`, whose requests run on engine replicas.

It offers what the server's routes use of an :class:`~thinkstruct.engine.Engine` (the
model for chat templates and token counts, a grammar compiler that validates constraints,
``submit`` returning a handle of deltas), so the routes are the same code with or
without Ray. :meth:`RemoteEngine.submit` checks the request as the engine would (the same
400s), then starts the remote stream at once through the engine deployment's
``DeploymentHandle``.

A replica streams the deltas of all this ingress's requests it holds on whichever of
their streams comes first (:mod:`.outbox`); :class:`Mailroom` hands each request its own,
and the request's :class:`~.outbox.DeltaOrder` puts them in order.

Faults (:class:`RemoteHandle`): a replica that dies or refuses before the request's first
delta is replaced by one retry on another replica; a replica that dies later ends the
stream with ``finish_reason: "error"`` (a streamed answer's error event) and makes
:meth:`RemoteHandle.result` raise a retryable 503 (a non-streamed answer).
:class:`ReplicaHeader` adds ``x-thinkstruct-replica`` to each generation response.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import uuid
from typing import TYPE_CHECKING, Any, cast

from thinkstruct.engine.core.config import EngineClosed, EngineStats, check_request, prompt_token_limit
from thinkstruct.engine.output.detokenizer import TokenTexts
from thinkstruct.engine.request import Completion, Delta, FinishReason, join_deltas
from thinkstruct.server.cluster.outbox import DeltaOrder
from thinkstruct.server.cluster.wire import WireRequest
from thinkstruct.server.errors import UNAVAILABLE, APIError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from thinkstruct.engine import GenerationRequest, LoadedModel
    from thinkstruct.grammar.service.compiler import GrammarCompiler
    from thinkstruct.server.cluster.outbox import Entry

log = logging.getLogger("thinkstruct.cluster")

#: The response header naming the replica(s) that served a generation request.
REPLICA_HEADER = "x-thinkstruct-replica"

#: The handles the current HTTP request submitted (set per request by :class:`ReplicaHeader`).
_submitted: contextvars.ContextVar[list[RemoteHandle] | None] = contextvars.ContextVar(
    "thinkstruct_submitted", default=None
)


class RemoteHandle:
    """One request on the replicas: its deltas, its replica, a way to cancel it.

    Args:
        deployment: the engine deployment's handle.
        request: the request (its grammar may still be compiling: it is sent once ready).
        loop: the event loop the deltas are delivered to.
        mailroom: where the ingress's streams hand each request its deltas.
        retries: replicas tried again, after the first, while no delta has come.
    """

    def __init__(
        self,
        deployment: DeploymentHandle[Any],
        request: GenerationRequest,
        *,
        loop: asyncio.AbstractEventLoop,
        mailroom: Mailroom,
        retries: int = 1,
    ) -> None:
        self.request_id = request.request_id
        #: The replicas that took the request, in order (a retry adds one).
        self.replicas: list[str] = []
        #: Why the request failed for a replica's fault, or ``None``.
        self.replica_failure: str | None = None
        self._deployment = deployment
        self._request = request
        self._retries = retries
        self._known = asyncio.Event()
        self._queue: asyncio.Queue[Delta] = asyncio.Queue()
        self._order = DeltaOrder()
        self._finished = False
        self._mailroom = mailroom
        mailroom.register(self)
        self._task = loop.create_task(self._pump())

    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def cancelled(self) -> bool:
        return self._task.cancelled()

    def cancel(self) -> None:
        """Stop generating: the replica's engine request is cancelled."""
        self._task.cancel()
        self._known.set()  # nobody waits for a replica any more

    async def replica(self, *, timeout_s: float = 60.0) -> str:
        """The replica serving the request, once one has taken it (``""`` if none did
        within ``timeout_s`` seconds: Ray Serve holds a request while no replica is up)."""
        try:
            await asyncio.wait_for(self._known.wait(), timeout_s)
        except TimeoutError:
            return ""
        return self.replicas[-1] if self.replicas else ""

    async def __aiter__(self) -> AsyncIterator[Delta]:
        while True:
            delta = await self._queue.get()
            yield delta
            if delta.finish_reason is not None:
                return

    async def result(self) -> Completion:
        """The whole output.

        Raises:
            APIError: 503 ``replica_failed`` (retryable) when the replica died or refused
                and no retry could take the request.
        """
        deltas = [d async for d in self]
        if self.replica_failure is not None:
            raise APIError(
                503,
                f"the replica serving this request failed ({self.replica_failure}); retry the request",
                type=UNAVAILABLE,
                code="replica_failed",
                headers={"Retry-After": "1"},
            )
        return join_deltas(deltas)

    def _end(self, delta: Delta) -> None:
        self._finished = True
        self._mailroom.unregister(self)
        self._known.set()
        self._queue.put_nowait(delta)

    def accept(self, seq: int, delta: Delta) -> None:
        """Take the request's delta number ``seq`` (from any of the ingress's streams on
        its replica; repeats and early arrivals are sorted out here)."""
        if self._finished:
            return
        for ready in self._order.accept(seq, delta):
            if ready.finish_reason is not None:
                self._end(ready)
                return
            self._queue.put_nowait(ready)

    async def _pump(self) -> None:
        grammar = self._request.grammar
        try:
            if isinstance(grammar, concurrent.futures.Future):
                grammar = await asyncio.wrap_future(grammar)
        except Exception as e:  # noqa: BLE001 - the caller reports the compile's own error
            self._end(Delta(finish_reason=FinishReason.ERROR, error=f"the grammar is not usable: {e}"))
            return
        wire = WireRequest.of(self._request, grammar, ingress=self._mailroom.ingress)
        failure = "no replica answered"
        for attempt in range(1 + self._retries):
            self._order = DeltaOrder()  # a retry's replica numbers the deltas from 0 again
            stream = cast(
                "DeploymentResponseGenerator[Any]",
                self._deployment.options(stream=True).generate.remote(wire),
            )
            try:
                async for item in stream:
                    if isinstance(item, str):
                        self.replicas.append(item)
                        self._known.set()
                        continue
                    self._mailroom.deliver(item)
                    if self._finished:
                        return
                failure = "the replica's stream ended before the request did"
            except asyncio.CancelledError:
                stream.cancel()
                self._end(Delta(finish_reason=FinishReason.ABORT))
                raise
            except Exception as e:  # noqa: BLE001 (a dead or refusing replica: Ray's errors or the engine's)
                failure = f"{type(e).__name__}: {_first_line(e)}"
            where = self.replicas[-1] if self.replicas else "unknown"
            log.warning(
                "request %s on replica %s failed (try %d): %s", self.request_id, where, attempt + 1, failure
            )
            if self._order.delivered:
                break  # part of the answer went out: no other replica can continue it
        self.replica_failure = failure
        self._end(
            Delta(
                finish_reason=FinishReason.ERROR, error=f"the replica failed ({failure}); retry the request"
            )
        )


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "no message"


class Mailroom:
    """The ingress's requests in flight, by id: each item a replica streams holds deltas
    of several of them (see :mod:`.outbox`), and :meth:`deliver` hands each its own.

    Args:
        ingress: this ingress's id (the replicas keep one outbox per ingress).
    """

    def __init__(self, ingress: str) -> None:
        self.ingress = ingress
        self._handles: dict[str, RemoteHandle] = {}

    def register(self, handle: RemoteHandle) -> None:
        self._handles[handle.request_id] = handle

    def unregister(self, handle: RemoteHandle) -> None:
        if self._handles.get(handle.request_id) is handle:
            del self._handles[handle.request_id]

    def deliver(self, entries: list[Entry]) -> None:
        """Hand each entry's delta to its request (one that has ended drops it)."""
        for request_id, seq, delta in entries:
            handle = self._handles.get(request_id)
            if handle is not None:
                handle.accept(seq, delta)


class RemoteEngine:
    """An engine-like front for the engine deployment (see the module's docstring).

    Args:
        model: the model, loaded at the ingress for its tokenizer, chat template and family.
        compiler: validates constraints at the ingress (and reports their backend).
        deployment: the engine deployment's handle.
        max_prompt_tokens: the engine's own prompt limit (``None``: the context's).
        totals: the replicas' engine counters, summed (``/metrics``).
    """

    def __init__(
        self,
        model: LoadedModel,
        compiler: GrammarCompiler,
        deployment: DeploymentHandle[Any],
        *,
        max_prompt_tokens: int | None = None,
        totals: Callable[[], EngineStats] = EngineStats,
    ) -> None:
        self.model = model
        self.tokenizer = model.tokenizer
        self.compiler = compiler
        self.token_texts = TokenTexts(model.tokenizer)
        self.max_prompt_tokens = prompt_token_limit(max_prompt_tokens, model.context_length)
        self._totals = totals
        self._deployment = deployment
        self._mailroom = Mailroom(uuid.uuid4().hex)
        self._closed = False

    @property
    def running(self) -> bool:
        return not self._closed

    @property
    def stats(self) -> EngineStats:
        """The replicas' engine counters, summed."""
        return self._totals()

    def submit(
        self, request: GenerationRequest, *, loop: asyncio.AbstractEventLoop | None = None
    ) -> RemoteHandle:
        """Send a request to a replica; its deltas arrive on the returned handle.

        Raises:
            ValueError: as :meth:`Engine.submit <thinkstruct.engine.Engine.submit>`.
            EngineClosed: the service is stopping.
        """
        check_request(request, vocab_size=self.tokenizer.vocab_size, max_prompt_tokens=self.max_prompt_tokens)
        if self._closed:
            raise EngineClosed("the service is stopping")
        handle = RemoteHandle(
            self._deployment, request, loop=loop or asyncio.get_running_loop(), mailroom=self._mailroom
        )
        submitted = _submitted.get()
        if submitted is not None:
            submitted.append(handle)
        return handle

    def close(self, *, grace_s: float = 0.0) -> None:
        """Take no more requests (the replicas finish the ones they have)."""
        self._closed = True


class ReplicaHeader:
    """ASGI middleware: ``x-thinkstruct-replica`` on each response that generated, naming
    the replica of each choice (comma-separated, in choice order)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        handles: list[RemoteHandle] = []
        token = _submitted.set(handles)

        async def send_named(message: Message) -> None:
            if message["type"] == "http.response.start" and handles:
                names = [await h.replica() for h in handles]
                headers: list[Any] = [
                    *message.get("headers", ()),
                    (REPLICA_HEADER.encode(), ",".join(names).encode()),
                ]
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_named)
        finally:
            _submitted.reset(token)
