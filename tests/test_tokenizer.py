from thinkstruct import Tokenizer
from thinkstruct.tokenizer import smollm2_gguf_path


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
    assert tokenizer.xgrammar_info() is tokenizer.xgrammar_info()
    assert tokenizer.llguidance_tokenizer() is tokenizer.llguidance_tokenizer()
    info = tokenizer.xgrammar_info()
    assert info.vocab_size == 129_280
    assert set(info.special_token_ids) >= tokenizer.special_token_ids - {1}
    ll = tokenizer.llguidance_tokenizer()
    assert all(ll.is_special_token(i) for i in tokenizer.special_token_ids)


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
