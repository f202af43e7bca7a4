"""Faults injected into one request of a running engine, for the fault tests.

Each fault is keyed by a request's seed, so it hits exactly the request that asks for it
and nothing else in the batch; everything else stays real (the model, the grammars, the
sampler). The engine and server fault tests both use these.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

import thinkstruct.engine.core.executor as executor_module

#: A request with this seed fails inside its own sampling.
SAMPLING_FAULT_SEED = 0xFA_0017
#: A request with this seed gets a grammar matcher that rejects its third sampled token.
REJECTING_GRAMMAR_SEED = 0xFA_0018
#: Tokens the rejecting matcher accepts before it rejects one.
ACCEPTED_BEFORE_REJECTING = 2


def inject_sampling_fault(monkeypatch: pytest.MonkeyPatch, *, after: int = 0) -> None:
    """Make sampling fail for requests seeded :data:`SAMPLING_FAULT_SEED`, once they have
    drawn ``after`` tokens.

    The batched draw runs first (every row's generator advances, as it would when a
    fault strikes mid-batch), then fails if the faulty request is among the rows.
    """
    real = executor_module.sample
    draws = [0]

    def sample(logits: Any, params: Any, generators: Any) -> list[int]:
        tokens = real(logits, params, generators)
        if any(p.seed == SAMPLING_FAULT_SEED for p in params):
            draws[0] += 1
            if draws[0] > after:
                raise RuntimeError("injected fault in this request's sampling")
        return tokens

    monkeypatch.setattr(executor_module, "sample", sample)


class RejectingMatcher:
    """A real grammar matcher that rejects the token after the first ``accept`` sampled ones
    (as a matcher whose mask and accept disagree would)."""

    def __init__(self, inner: Any, accept: int = ACCEPTED_BEFORE_REJECTING) -> None:
        self._inner = inner
        self._left = accept

    def accept_token(self, token_id: int) -> bool:
        if self._left == 0:
            return False
        self._left -= 1
        return bool(self._inner.accept_token(token_id))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def inject_rejecting_grammar(monkeypatch: pytest.MonkeyPatch, engine: Any) -> None:
    """Give requests seeded :data:`REJECTING_GRAMMAR_SEED` a :class:`RejectingMatcher`
    over the matcher their own grammar made."""
    matchers = engine._matchers
    real: Callable[[Any], Any] = matchers.matcher

    def matcher(request: Any) -> Any:
        made = real(request)
        if made is not None and request.sampling.seed == REJECTING_GRAMMAR_SEED:
            return RejectingMatcher(made)
        return made

    monkeypatch.setattr(matchers, "matcher", matcher)


@dataclass(frozen=True)
class StepState:
    """The engine as one iteration of its loop left it."""

    steps: int
    slots_used: int
    kv_tokens: int
    #: True once the watched request had been cancelled when this iteration ended.
    cancelled: bool


@dataclass
class StepLog:
    """What every iteration of the engine loop left behind, recorded on the engine thread."""

    engine: Any
    cancelled: Callable[[], bool]
    states: list[StepState] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self) -> None:
        stats = self.engine.stats
        state = StepState(stats.steps, stats.slots_used, stats.kv_tokens, self.cancelled())
        with self._lock:
            self.states.append(state)

    def after_cancel(self) -> list[StepState]:
        with self._lock:
            return [s for s in self.states if s.cancelled]


@contextmanager
def step_log(engine: Any, cancelled: Callable[[], bool]) -> Iterator[StepLog]:
    """Record :class:`StepState` after every engine iteration while the block runs."""
    log = StepLog(engine, cancelled)
    engine._on_step = log
    try:
        yield log
    finally:
        engine._on_step = None
