"""From token ids to text, a few tokens at a time: :class:`IncrementalDetokenizer`.

Byte-level vocabularies split multi-byte characters across tokens (an emoji can take
three), so text is built from each token's *bytes* through an incremental UTF-8 decoder:
a character is emitted once all its bytes have arrived, never half of it. Special tokens
(``<think>`` in DeepSeek-V4) keep their text, so the reasoning parser sees them; stop
tokens have none.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from thinkstruct.tokenizer import Tokenizer


class TokenTexts:
    """The bytes each token id stands for in generated text (shared, built once).

    Stop ids and ids past the tokenizer's vocabulary (padding rows of the embedding) map to
    ``b""``.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        table = list(tokenizer.decoded_vocab())
        table.extend([b""] * (tokenizer.vocab_size - len(table)))
        for token_id in tokenizer.special_token_ids:
            if token_id < tokenizer.tokenizer_vocab_size:
                text = tokenizer.hf.convert_ids_to_tokens(token_id)
                table[token_id] = text.encode("utf-8") if isinstance(text, str) else b""
        for token_id in tokenizer.eos_token_ids:
            table[token_id] = b""
        self._table = table

    def __getitem__(self, token_id: int) -> bytes:
        return self._table[token_id] if 0 <= token_id < len(self._table) else b""

    def __len__(self) -> int:
        return len(self._table)


class IncrementalDetokenizer:
    """Turns one request's tokens into text without ever splitting a character.

    Invalid UTF-8 (a model can emit a stray continuation byte) becomes U+FFFD.
    """

    __slots__ = ("_decoder", "_texts")

    def __init__(self, texts: TokenTexts) -> None:
        self._texts = texts
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, token_ids: Iterable[int]) -> str:
        """The text the tokens complete (characters still missing bytes are held back)."""
        texts = self._texts
        return self._decoder.decode(b"".join(texts[t] for t in token_ids))

    def flush(self) -> str:
        """Whatever is held back, at the end of the output."""
        return self._decoder.decode(b"", final=True)
