import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from thinkstruct import Tokenizer
from thinkstruct.tokenizer import edit_top_level, smollm2_gguf_path


def test_default_is_deepseek_v4(tokenizer: Tokenizer) -> None:
    assert tokenizer.vocab_size == 129_280
    assert tokenizer.eos_token_ids == (1,)
    # <think> and </think> are single added tokens in DeepSeek-V4.
    assert tokenizer.think_start_ids == (128821,)
    assert tokenizer.think_end_ids == (128822,)
    assert tokenizer.decode(list(tokenizer.think_end_ids)) == "</think>"


def test_every_added_token_is_special(tokenizer: Tokenizer) -> None:
    added = set(tokenizer.hf.added_tokens_decoder)
    assert len(added) == 1283
    assert added <= tokenizer.special_token_ids
    assert 0 in tokenizer.special_token_ids  # BOS
    assert 128825 in tokenizer.special_token_ids  # "｜DSML｜", not flagged special upstream


def test_encode_keeps_tag_text_as_text(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode('{"a":"</think>"}')
    assert not set(ids) & tokenizer.special_token_ids
    assert tokenizer.decode(ids) == '{"a":"</think>"}'


def test_backend_vocabularies_are_built_once(tokenizer: Tokenizer) -> None:
    from thinkstruct.grammar.backends.llguidance_backend import ll_tokenizer
    from thinkstruct.grammar.backends.outlines_backend import vocabulary
    from thinkstruct.grammar.backends.xgrammar_backend import tokenizer_info

    assert tokenizer_info(tokenizer) is tokenizer_info(tokenizer)
    assert ll_tokenizer(tokenizer) is ll_tokenizer(tokenizer)
    assert vocabulary(tokenizer) is vocabulary(tokenizer)
    info = tokenizer_info(tokenizer)
    assert info.vocab_size == 129_280
    assert set(info.special_token_ids) >= tokenizer.special_token_ids - {1}
    ll = ll_tokenizer(tokenizer)
    assert all(ll.is_special_token(i) for i in tokenizer.special_token_ids)


@pytest.mark.parametrize("which", ["deepseek-v4", "smollm2"])
def test_decoded_vocab_is_the_tokenizer_own_and_agrees_with_xgrammar(
    tokenizer: Tokenizer, which: str
) -> None:
    # Built from the tokenizer's decoder (no grammar library involved); xgrammar's reading
    # of the same vocabulary is the reference.
    from thinkstruct.grammar.backends.xgrammar_backend import tokenizer_info

    tok = tokenizer if which == "deepseek-v4" else Tokenizer.from_pretrained(smollm2_gguf_path())
    assert tok.vocab_type() == "byte_level"
    ours = tok.decoded_vocab()
    theirs = list(tokenizer_info(tok).decoded_vocab)
    assert len(ours) == tok.vocab_size
    assert ours == theirs
    assert all(ours[i] == b"" for i in tok.special_token_ids)


def test_cache_hook_builds_once_and_stays_out_of_pickles(tokenizer: Tokenizer) -> None:
    import pickle

    calls = []
    value = tokenizer.cached("test.hook", lambda: calls.append(1) or object())
    assert tokenizer.cached("test.hook", lambda: calls.append(1) or object()) is value
    assert calls == [1]
    tokenizer.decoded_vocab()
    copy = pickle.loads(pickle.dumps(tokenizer))
    assert copy.cached("test.hook", lambda: "rebuilt") == "rebuilt"  # library views stay behind
    assert copy.decoded_vocab() == tokenizer.decoded_vocab()  # plain facts travel


def test_padded_vocab(tokenizer: Tokenizer) -> None:
    padded = Tokenizer(tokenizer.hf, vocab_size=129_280 + 128)
    assert padded.vocab_size == 129_408
    assert padded.tokenizer_vocab_size == 129_280


def test_gguf_tokenizer_multi_token_tags() -> None:
    smol = Tokenizer.from_pretrained(smollm2_gguf_path())
    assert smol.vocab_size == 49_152
    assert smol.eos_token_ids == (2,)  # <|im_end|>
    assert len(smol.think_end_ids) == 3  # "</", "think", ">"
    assert smol.decode(list(smol.think_end_ids)) == "</think>"


def test_all_special_json_is_the_tokenizer_with_every_added_token_special(tokenizer: Tokenizer) -> None:
    """What plain-text encoding and llguidance's tokenizer are built from: the whole
    tokenizer's JSON with no padding or truncation and every added token special."""
    want = json.loads(tokenizer.hf.backend_tokenizer.to_str())
    want["padding"] = None
    want["truncation"] = None
    for added in want["added_tokens"]:
        added["special"] = True
    got = json.loads(tokenizer.all_special_json())
    assert got == want and list(got) == list(want)  # the keys in their order too


def _small_tokenizer(*, spelling: str) -> Tokenizer:
    """A three-token vocabulary (plus byte tokens) whose decoder spells tokens the way
    ``spelling`` says: SentencePiece's ``▁`` with byte fallback, or no decoder at all."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<0x0A>": 1, "\u2581a": 2, "b": 3}
    if spelling == "byte_fallback":
        rust = RustTokenizer(models.BPE(vocab, [], unk_token="<unk>", byte_fallback=True))
        rust.pre_tokenizer = pre_tokenizers.Metaspace()
        rust.decoder = decoders.Sequence(
            [
                decoders.Replace("\u2581", " "),
                decoders.ByteFallback(),
                decoders.Fuse(),
                decoders.Strip(" ", 1, 0),
            ]
        )
    else:
        rust = RustTokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    return Tokenizer(PreTrainedTokenizerFast(tokenizer_object=rust, unk_token="<unk>"), eos_token_ids=[0])


@pytest.mark.parametrize(
    ("spelling", "decoded"),
    [
        ("byte_fallback", [b"", b"\n", b" a", b"b"]),
        ("raw", [b"", b"<0x0A>", "\u2581a".encode(), b"b"]),
    ],
)
def test_the_vocab_type_is_read_from_the_decoder(spelling: str, decoded: list[bytes]) -> None:
    tok = _small_tokenizer(spelling=spelling)
    assert tok.vocab_type() == spelling
    assert tok.decoded_vocab() == decoded


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


@given(
    doc=st.dictionaries(st.text(max_size=4), _json_values, max_size=6),
    edited=st.sets(st.text(max_size=4), max_size=3),
    indent=st.sampled_from([None, 0, 2]),
)
def test_edit_top_level_replaces_exactly_the_named_values(
    doc: dict, edited: set[str], indent: int | None
) -> None:
    keys = sorted(edited | set(list(doc)[:1]))  # at times one that is there, at times none
    text = json.dumps(doc, indent=indent, ensure_ascii=False)
    got = edit_top_level(text, {key: (lambda value, key=key: [key, value]) for key in keys})
    want = {key: [key, value] if key in keys else value for key, value in doc.items()}
    parsed = json.loads(got)
    assert parsed == want and list(parsed) == list(want)
