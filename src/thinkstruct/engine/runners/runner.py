"""The model runner seam: :class:`ModelRunner`; :class:`CausalLmRunner`, what runners of
a transformers model share; :class:`SlotRunner`, what runners on a
:class:`~thinkstruct.engine.kv.slots.SlotCache` share; and :class:`TransformersRunner`.

The scheduler asks a runner for one thing: run the model over some consecutive slots,
each row feeding its own tokens from its own position, and return the logits of each
row's last token. Rows may feed different numbers of tokens in one pass (a prompt chunk,
or a sampled token plus the tokens the grammar forces after it); shorter rows are padded
and their padding is never attended. Any runner with this interface (int8/int4 CPU
kernels, another engine, a GPU) slots in without the scheduler knowing.
"""

from __future__ import annotations

import abc
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from thinkstruct.engine.kv.budget import DEFAULT_KV_BYTES, DEFAULT_PREFIX_BYTES, KvBudget
from thinkstruct.engine.kv.prefix_cache import HeldKv, KvSpan
from thinkstruct.engine.kv.slots import SLOT_ATTENTION, SlotCache

#: Tokens per slot allocated at start; buffers double as rows grow, up to the context.
INITIAL_CAPACITY = 256


class ModelRunner(abc.ABC):
    """Runs one causal LM over slots of a batched KV cache.

    Attributes:
        vocab_size: width of the returned logits.
        slots: rows the cache holds.
        context_length: most tokens one row may hold.
        packs_tokens: a pass costs about the tokens its rows feed (its per-token work skips
            padding); ``False``: it costs rows x the longest row's tokens.
        batch_invariant: a row's keys, values and logits are the same bits whatever else
            its passes hold and however its tokens are cut into passes; a prefix the
            engine copies (from another slot or the prefix cache) is then the same bits
            as computing it again (on other runners, equal within rounding).
        kv_budget: what its keys and values may take: the running requests'
            reservations (a request writes only what it reserved) and the prefix cache's.
    """

    vocab_size: int
    slots: int
    context_length: int
    kv_budget: KvBudget
    packs_tokens: bool = False
    batch_invariant: bool = False

    @abc.abstractmethod
    def forward(
        self,
        first_slot: int,
        tokens: Sequence[Sequence[int]],
        starts: Sequence[int],
        *,
        tail: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """Feed ``tokens[i]`` to slot ``first_slot + i`` at positions ``starts[i]...``.

        Each row's tokens are appended to what its slot holds (``starts[i]`` tokens, which
        it keeps). Returns float32 logits ``[len(tokens), vocab_size]`` of each row's last
        fed token; with ``tail``, of each row's last ``tail[i]`` fed tokens (at least 1,
        at most what it feeds), ``[sum(tail), vocab_size]``, row after row in order (a
        speculative draft is verified from them).
        """

    @abc.abstractmethod
    def copy_slot(self, src: int, dst: int, length: int) -> None:
        """Make slot ``dst`` hold the first ``length`` tokens of slot ``src`` (a paged
        runner shares them instead of copying)."""

    @abc.abstractmethod
    def read_kv(self, slot: int, start: int, stop: int) -> HeldKv:
        """The keys and values of positions ``[start, stop)`` of ``slot``, kept apart from
        what the slot will write (a copy, or a paged runner's reference to its whole
        blocks: ``start`` and ``stop`` on block boundaries); the caller ``release()``s it."""

    @abc.abstractmethod
    def write_kv(self, slot: int, start: int, kv: HeldKv) -> None:
        """Make ``slot`` hold ``kv`` at positions ``start...`` (what :meth:`read_kv` of
        this runner gave for the same tokens after the same prefix)."""

    @abc.abstractmethod
    def release_slots(self, first: int) -> None:
        """Slots ``first...`` hold nothing any more (their rows left or moved): a paged
        runner gives their blocks back now rather than when the slot is next used."""

    @property
    @abc.abstractmethod
    def cache_bytes(self) -> int:
        """Bytes the KV cache holds now."""


class CausalLmRunner(ModelRunner):
    """What every runner over a transformers model shares: its sizes read from the
    config and the logits of the output layer (:meth:`_logits`).

    Args:
        model: a transformers ``*ForCausalLM`` in eval mode.
        slots: rows of the KV cache (the running batch plus one being prefilled).
        context_length: most tokens per row.
        vocab_size: logits width to return (default: the output layer's).
    """

    def __init__(self, model: Any, *, slots: int, context_length: int, vocab_size: int | None = None) -> None:
        config = model.config
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        self.slots = slots
        self.context_length = context_length
        self._head = model.get_output_embeddings()
        self.vocab_size = vocab_size or self._head.out_features
        self._heads = text.num_attention_heads
        self._kv_heads = getattr(text, "num_key_value_heads", None) or self._heads
        self._head_dim = getattr(text, "head_dim", None) or text.hidden_size // self._heads
        self._layer_count: int = text.num_hidden_layers
        self._dtype = activation_dtype(model)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits ``[rows, vocab_size]`` of the final hidden states ``[rows, hidden]``."""
        logits: torch.Tensor = self._head(hidden)
        return logits[:, : self.vocab_size].float()


class SlotRunner(CausalLmRunner):
    """What every runner over a transformers model and a :class:`SlotCache` shares: the
    cache sized from the model's config and the checked layout of a pass
    (:meth:`_begin`).

    Each slot holds at most an equal share of ``kv_cache_bytes`` (and the context): a
    request reserves a whole slot's share (its :attr:`kv_budget` unit), so the buffers
    never grow past the budget. Other arguments as for :class:`CausalLmRunner`;
    ``prefix_cache_bytes``: the prefix cache's budget (its copies live apart).
    """

    def __init__(
        self,
        model: Any,
        *,
        slots: int,
        context_length: int,
        vocab_size: int | None = None,
        kv_cache_bytes: int = DEFAULT_KV_BYTES,
        prefix_cache_bytes: int = DEFAULT_PREFIX_BYTES,
    ) -> None:
        super().__init__(model, slots=slots, context_length=context_length, vocab_size=vocab_size)
        per_token = 2 * self._layer_count * self._kv_heads * self._head_dim * self._dtype.itemsize
        #: Positions a slot holds at most: its share of the budget, within the context.
        self.slot_positions = min(context_length, kv_cache_bytes // (slots * per_token))
        unit = max(self.slot_positions, 1)
        self.kv_budget = KvBudget(
            kv_bytes=slots * self.slot_positions * per_token,
            prefix_bytes=prefix_cache_bytes,
            unit_tokens=unit,
            unit_bytes=unit * per_token,
            max_positions=self.slot_positions,
        )
        self.cache = SlotCache(
            layers=self._layer_count,
            slots=slots,
            kv_heads=self._kv_heads,
            head_dim=self._head_dim,
            capacity=min(INITIAL_CAPACITY, unit),
            dtype=self._dtype,
        )

    @property
    def cache_bytes(self) -> int:
        return self.cache.nbytes

    def copy_slot(self, src: int, dst: int, length: int) -> None:
        self.cache.copy_slot(src, dst, length)

    def read_kv(self, slot: int, start: int, stop: int) -> KvSpan:
        return self.cache.read(slot, start, stop)

    def release_slots(self, first: int) -> None:
        """Nothing to give back: slot buffers hold nothing apart from the slots."""

    def write_kv(self, slot: int, start: int, kv: HeldKv) -> None:
        if not isinstance(kv, KvSpan):
            raise TypeError(f"the slot cache writes copies (KvSpan), not {type(kv).__name__}")
        self.cache.write_span(slot, start, kv, limit=self.slot_positions)

    def _begin(self, first_slot: int, tokens: Sequence[Sequence[int]], starts: Sequence[int]) -> PaddedPass:
        """Check and lay out one pass, grow the cache for it and plan its writes."""
        plan = padded_pass(
            tokens, starts, slots=self.slots, first_slot=first_slot, context=self.context_length
        )
        self.cache.ensure_capacity(plan.span, limit=self.slot_positions)
        self.cache.plan(first_slot, first_slot + plan.ids.shape[0], plan.positions, plan.lengths, plan.span)
        return plan


class TransformersRunner(SlotRunner):
    """A Hugging Face transformers causal LM on a :class:`SlotCache`, run by its own modules.

    Its slot buffers split the KV budget evenly between slots, so each slot more shortens
    every request: :func:`~thinkstruct.engine.runners.decoder_runner.default_runner` gives
    it at most :attr:`most_slots` (a pass costs rows x its longest row anyway).

    Args:
        model: a transformers ``*ForCausalLM`` in eval mode whose attention layers use the
            attention-function interface (Llama, Mistral, Qwen, SmolLM... do).
        slots, context_length, vocab_size, kv_cache_bytes, prefix_cache_bytes: as for
            :class:`SlotRunner`.
    """

    #: Most slots the default runner choice gives it: the batch it was measured at, each
    #: slot an eighth of the KV budget.
    most_slots = 8

    def __init__(
        self,
        model: Any,
        *,
        slots: int,
        context_length: int,
        vocab_size: int | None = None,
        kv_cache_bytes: int = DEFAULT_KV_BYTES,
        prefix_cache_bytes: int = DEFAULT_PREFIX_BYTES,
    ) -> None:
        super().__init__(
            model,
            slots=slots,
            context_length=context_length,
            vocab_size=vocab_size,
            kv_cache_bytes=kv_cache_bytes,
            prefix_cache_bytes=prefix_cache_bytes,
        )
        self.model = model
        self._base = model.base_model
        model.set_attn_implementation(SLOT_ATTENTION)
        # transformers 5.x renames past_key_values to cache; accept either spelling.
        params = inspect.signature(self._base.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    def forward(
        self,
        first_slot: int,
        tokens: Sequence[Sequence[int]],
        starts: Sequence[int],
        *,
        tail: Sequence[int] | None = None,
    ) -> torch.Tensor:
        plan = self._begin(first_slot, tokens, starts)
        # Padding queries (j >= length_i) compute garbage that is never read, and write
        # to the slots' scratch position, which is never attended.
        out = self._base(
            input_ids=plan.ids,
            attention_mask=plan.visible().unsqueeze(1),
            position_ids=plan.positions,
            use_cache=True,
            **{self._cache_kw: self.cache},
        )
        rows, width = plan.ids.shape
        hidden = out.last_hidden_state.reshape(rows * width, -1)
        return self._logits(hidden[tail_positions(plan.lengths, tail, width=width)])


@dataclass(frozen=True)
class PaddedPass:
    """One forward pass's inputs, rows right-padded to the longest.

    Attributes:
        ids: ``[rows, width]`` token ids (padding 0).
        positions: ``[rows, width]`` each token's position in its slot (padding continues
            the row's positions; its keys are never attended).
        lengths: ``[rows]`` tokens each row feeds.
        span: positions attended: the longest row's length after the pass.
    """

    ids: torch.Tensor
    positions: torch.Tensor
    lengths: torch.Tensor
    span: int

    def visible(self) -> torch.Tensor:
        """``[rows, width, span]``, True where query ``j`` of row ``i`` may attend: its
        slot's positions ``0..start_i + j`` (everything cached before, and its own chunk
        causally)."""
        return torch.arange(self.span)[None, None, :] <= self.positions[:, :, None]


def padded_pass(
    tokens: Sequence[Sequence[int]], starts: Sequence[int], *, slots: int, first_slot: int, context: int
) -> PaddedPass:
    """Check one :meth:`ModelRunner.forward` call and lay out its inputs.

    Raises:
        ValueError: no rows, rows outside the slots, a row feeding nothing, or a row that
            would hold more than ``context`` tokens.
    """
    rows = len(tokens)
    if rows == 0:
        raise ValueError("forward needs at least one row")
    if first_slot < 0 or first_slot + rows > slots:
        raise ValueError(f"rows {first_slot}..{first_slot + rows} outside {slots} slots")
    lengths = torch.tensor([len(t) for t in tokens])
    if int(lengths.min()) < 1:
        raise ValueError("every row must feed at least one token")
    width = int(lengths.max())
    ids = torch.zeros((rows, width), dtype=torch.long)
    for i, row in enumerate(tokens):
        ids[i, : len(row)] = torch.as_tensor(row, dtype=torch.long)
    start = torch.as_tensor(starts, dtype=torch.long)
    span = int((start + lengths).max())
    if span > context:
        raise ValueError(f"a row would hold {span} tokens, more than the context of {context}")
    positions = start[:, None] + torch.arange(width)[None, :]
    return PaddedPass(ids, positions, lengths, span)


def tail_positions(lengths: torch.Tensor, tail: Sequence[int] | None, *, width: int | None) -> torch.Tensor:
    """Flat indices of each row's last ``tail[i]`` tokens (its last one without ``tail``),
    row after row: in a packed pass (``width`` None: the rows' real tokens end to end) or
    a padded one (row ``i`` starts at ``i * width``).

    Raises:
        ValueError: a ``tail[i]`` below 1 or above row ``i``'s tokens.
    """
    ends = lengths.cumsum(0) if width is None else torch.arange(len(lengths)) * width + lengths
    if tail is None:
        return ends - 1
    counts = torch.tensor(list(tail), dtype=torch.long)
    if counts.shape != lengths.shape or bool((counts < 1).any()) or bool((counts > lengths).any()):
        raise ValueError(f"tail {list(tail)} does not fit rows of {lengths.tolist()} tokens")
    firsts = torch.repeat_interleave(ends - counts, counts)
    offsets = torch.arange(int(counts.sum())) - torch.repeat_interleave(counts.cumsum(0) - counts, counts)
    return firsts + offsets


def activation_dtype(model: Any) -> torch.dtype:
    """The dtype hidden states flow in (float32 for a dynamically quantized model)."""
    embeddings = model.get_input_embeddings()
    weight = getattr(embeddings, "weight", None)
    return weight.dtype if isinstance(weight, torch.Tensor) and weight.is_floating_point() else torch.float32
