"""A model's tokenizer, fitted to the model: :func:`load_tokenizer`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from thinkstruct.engine.model.errors import UnsupportedModelError
from thinkstruct.tokenizer import Tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from thinkstruct.parsers import ReasoningFamily


def load_tokenizer(
    weights_dir: Path, model: PreTrainedModel, *, family: ReasoningFamily, name: str, shown: Path
) -> Tokenizer:
    """The tokenizer in ``weights_dir``, with ``family``'s think tags, as wide as the
    model's logits (the bitmask and the logits must have the same width).

    Raises:
        UnsupportedModelError: it cannot be loaded, or has more tokens than the model scores.
    """
    try:
        tokenizer = Tokenizer.from_pretrained(
            weights_dir, think_start=family.think_start, think_end=family.think_end, name=name
        )
    except (ValueError, OSError) as exc:
        raise UnsupportedModelError(f"{shown}: cannot load its tokenizer: {exc}") from None
    logits = _logits_width(model)
    if logits is not None and logits != tokenizer.vocab_size:
        if logits < tokenizer.tokenizer_vocab_size:
            raise UnsupportedModelError(
                f"{shown}: the tokenizer has {tokenizer.tokenizer_vocab_size} tokens but the model "
                f"scores only {logits}"
            )
        # The bitmask and the logits must have the same width: the output layer's.
        tokenizer = Tokenizer(
            tokenizer.hf,
            vocab_size=logits,
            eos_token_ids=tokenizer.eos_token_ids,
            think_start=family.think_start,
            think_end=family.think_end,
            name=name,
        )
    return tokenizer


def _logits_width(model: PreTrainedModel) -> int | None:
    head = model.get_output_embeddings()
    width = getattr(head, "out_features", None)
    return int(width) if isinstance(width, int) else None
