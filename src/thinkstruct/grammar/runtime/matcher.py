"""The per-request matcher interface, :class:`GrammarMatcher`, and the stop-token base
every backend matcher shares, :class:`StopTokenMatcher`.

A matcher follows one request's tokens through a compiled grammar and fills that
request's row of the token bitmask (int32 ``[batch, ceil(vocab_size / 32)]``; bit ``j``
of word ``i`` set means token ``32 * i + j`` is allowed). A refused token is reported by
``accept_token`` returning ``False`` and leaves the state unchanged; no method raises for
a token a model might produce.

Stop tokens behave the same for every backend because the libraries are never shown
them: once the answer is complete any of the model's stop ids is allowed, accepting one
terminates the matcher, and ``rollback`` can undo it. :class:`StopTokenMatcher` owns
that; a backend implements only advancing, rolling back, filling a row and whether the
answer may end here.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import TYPE_CHECKING

from thinkstruct.grammar.runtime.bitmask import allow_only

if TYPE_CHECKING:
    import torch


class GrammarMatcher(abc.ABC):
    """One request's position in a compiled grammar (see the module docstring)."""

    __slots__ = ()

    @abc.abstractmethod
    def accept_token(self, token_id: int) -> bool:
        """Advance by one token. ``False`` (state unchanged) if the grammar forbids it."""

    @abc.abstractmethod
    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens (a stop token counts as one)."""

    @abc.abstractmethod
    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the set of allowed next tokens into row ``row`` of an int32 CPU bitmask."""

    @abc.abstractmethod
    def is_terminated(self) -> bool:
        """True once a stop token has been accepted."""

    @abc.abstractmethod
    def jump_forward(self) -> list[int]:
        """Token ids the grammar forces next (possibly none), without accepting them.

        Feed them with :meth:`accept_token` to skip that many decoding steps.
        """

    @abc.abstractmethod
    def copy(self) -> GrammarMatcher:
        """A fresh matcher at the start, sharing the compiled grammar."""

    def at_answer_start(self) -> bool:
        """Whether the next token is the answer's first (no answer token accepted yet)."""
        return False

    def accept_tokens(self, token_ids: Sequence[int]) -> int:
        """Accept tokens until one is refused; return how many were accepted."""
        for n, token_id in enumerate(token_ids):
            if not self.accept_token(token_id):
                return n
        return len(token_ids)

    def validate_tokens(self, token_ids: Sequence[int]) -> int:
        """How many of ``token_ids``, in order from the current state, the grammar would
        accept; the state is unchanged afterwards (for speculative decoding's drafts)."""
        n = self.accept_tokens(token_ids)
        self.rollback(n)
        return n


class StopTokenMatcher(GrammarMatcher):
    """The stop-token behaviour of every backend matcher, over five small hooks.

    Subclasses implement :meth:`_advance`, :meth:`_rollback`, :meth:`_fill`,
    :meth:`_can_stop` and :meth:`_forced` against their library (which never sees a stop
    token), and may override :meth:`_validate` where the library can check tokens
    without changing its state.

    Args:
        stop_ids: the model's stop token ids.
        start_row: the grammar's mask at its start state
            (:attr:`~thinkstruct.grammar.compiled.CompiledGrammar.start_row`), copied instead
            of asking the library while no token has been accepted.
    """

    __slots__ = ("_depth", "_finished", "_start_row", "_stops")

    def __init__(self, stop_ids: frozenset[int], *, start_row: torch.Tensor | None = None) -> None:
        self._stops = stop_ids
        self._finished = False
        self._start_row = start_row
        #: Tokens accepted and not rolled back (0: at the start state).
        self._depth = 0

    def adopt_start_row(self, row: torch.Tensor) -> None:
        """Copy ``row`` (the grammar's :attr:`~thinkstruct.grammar.compiled.CompiledGrammar.start_row`)
        at the start state from now on, as a matcher built after it was kept does."""
        self._start_row = row

    # ---- the hooks -------------------------------------------------------------------

    @abc.abstractmethod
    def _advance(self, token_id: int) -> bool:
        """Feed one non-stop token to the library; ``False`` and no change if refused."""

    @abc.abstractmethod
    def _rollback(self, num_tokens: int) -> None:
        """Undo ``num_tokens`` tokens fed by :meth:`_advance`."""

    @abc.abstractmethod
    def _fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the library's mask (stop ids allowed where the answer may end)."""

    @abc.abstractmethod
    def _can_stop(self) -> bool:
        """Whether the answer so far is complete (a stop token may come next)."""

    @abc.abstractmethod
    def _forced(self) -> list[int]:
        """The tokens the library forces next (no stop tokens)."""

    def _advance_many(self, token_ids: Sequence[int]) -> int:
        """Feed non-stop tokens until one is refused; how many were fed. Libraries that
        take a list in one call override this (one call instead of one per token)."""
        for n, token_id in enumerate(token_ids):
            if not self._advance(token_id):
                return n
        return len(token_ids)

    def _validate(self, token_ids: Sequence[int]) -> int:
        """How many of ``token_ids`` (no stop ids among them) the library would accept,
        state unchanged afterwards."""
        n = 0
        for token_id in token_ids:
            if not self._advance(token_id):
                break
            n += 1
        if n:
            self._rollback(n)
        return n

    def _before_stop(self, token_ids: Sequence[int]) -> int:
        """How many of ``token_ids`` come before the first stop id (all when none)."""
        stops = self._stops
        return next((i for i, t in enumerate(token_ids) if t in stops), len(token_ids))

    # ---- GrammarMatcher --------------------------------------------------------------

    def accept_token(self, token_id: int) -> bool:
        if self._finished:
            return False
        if token_id in self._stops:
            if self._can_stop():
                self._finished = True  # the library never sees it; see rollback
                return True
            return False
        if self._advance(token_id):
            self._depth += 1
            return True
        return False

    def accept_tokens(self, token_ids: Sequence[int]) -> int:
        if self._finished:
            return 0
        head = self._before_stop(token_ids)
        n = self._advance_many(token_ids[:head]) if head else 0
        self._depth += n
        if n < head or head == len(token_ids):
            return n
        return head + 1 if self.accept_token(token_ids[head]) else head

    def rollback(self, num_tokens: int) -> None:
        if num_tokens <= 0:
            return
        if self._finished:
            self._finished = False
            num_tokens -= 1
        if num_tokens:
            self._rollback(num_tokens)
            self._depth -= num_tokens

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        if self._finished:
            allow_only(bitmask, row, self._stops)
            return
        start = self._start_row
        if (
            self._depth == 0
            and start is not None
            and bitmask.dtype == start.dtype
            and bitmask.shape[-1] == start.shape[0]
            and bitmask.stride(-1) == 1
        ):
            bitmask[row].copy_(start)
        else:
            self._fill(bitmask, row)  # the library's path checks the buffer and says what is wrong

    def is_terminated(self) -> bool:
        return self._finished

    def at_answer_start(self) -> bool:
        return self._depth == 0 and not self._finished

    def jump_forward(self) -> list[int]:
        return [] if self._finished else self._forced()

    def validate_tokens(self, token_ids: Sequence[int]) -> int:
        if self._finished:
            return 0
        head = self._before_stop(token_ids)
        n = self._validate(token_ids[:head])
        if n < head or head == len(token_ids):
            return n
        # A stop token after the head: accepted iff the answer is complete there, and
        # nothing after it.
        for token_id in token_ids[:head]:
            self._advance(token_id)
        complete = self._can_stop()
        if head:
            self._rollback(head)
        return head + 1 if complete else head
