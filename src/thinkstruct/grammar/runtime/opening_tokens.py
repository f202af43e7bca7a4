"""The tokens that open a text: :func:`opening_tokens`.

A model opens a text such as a tool call's trigger (``<tool_call>``) with any token whose
bytes begin it (``<``, ``<tool``) or contain it whole at their start (``<tool_call>[``).
The engine sums the model's probability over these tokens to let it choose between a
call and another answer the way it would in free text, then keeps or drops them in the
grammar's mask row (:mod:`thinkstruct.engine.sampling.call_choice`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from thinkstruct.grammar.runtime.bitmask import allocate_bitmask, allow_only

if TYPE_CHECKING:
    from thinkstruct.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class OpeningTokens:
    """The tokens that open one text.

    Attributes:
        ids: their ids (int64 ``[n]``), added tokens among them.
        row: a bitmask row (int32 ``[ceil(vocab_size / 32)]``) with exactly their bits set.
    """

    ids: torch.Tensor
    row: torch.Tensor


def opening_tokens(tokenizer: Tokenizer, text: str) -> OpeningTokens:
    """The tokens whose bytes are a beginning of ``text`` or begin with all of it, and the
    added tokens whose text is (a grammar spells such a token's text in plain tokens, so
    the mask never allows them; the model's probability of one still counts), built once
    per tokenizer and text.

    Raises:
        ValueError: ``text`` is empty.
    """
    if not text:
        raise ValueError("an empty text has no opening tokens")
    target = text.encode()

    def opens(raw: bytes) -> bool:
        return bool(raw) and (target.startswith(raw) or raw.startswith(target))

    def build() -> OpeningTokens:
        ids = [i for i, raw in enumerate(tokenizer.decoded_vocab()) if opens(raw)]
        # An added token stands for no bytes here (grammars spell its text in plain
        # tokens), but a model that writes it means its text.
        hf = tokenizer.hf
        ids += sorted(
            i
            for i in tokenizer.special_token_ids
            if i < tokenizer.vocab_size and opens(str(hf.convert_ids_to_tokens(i)).encode())
        )
        mask = allocate_bitmask(1, tokenizer.vocab_size)
        allow_only(mask, 0, ids)
        return OpeningTokens(ids=torch.tensor(ids, dtype=torch.int64), row=mask[0])

    return tokenizer.cached(f"opening_tokens:{text}", build)
