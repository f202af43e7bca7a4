"""A model only transformers' modules run, with sliding-window layers (Gemma 2): the
transformers runner gives every layer one causal mask, so the engine's context is the
window, where the two agree, and a longer prompt is refused up front."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from thinkstruct.engine import Engine, EngineConfig, GenerationRequest, SamplingParams, load_model
from thinkstruct.engine.model.hf_loading import attention_window
from thinkstruct.tokenizer import default_tokenizer_dir

WINDOW = 8


@pytest.fixture(scope="module")
def gemma2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    from transformers import Gemma2Config, Gemma2ForCausalLM

    out = tmp_path_factory.mktemp("gemma2") / "tiny-gemma2"
    config = Gemma2Config(
        vocab_size=129_280, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=256,
        sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"],
        bos_token_id=0, eos_token_id=1, pad_token_id=1,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        Gemma2ForCausalLM(config).save_pretrained(str(out))
    for file in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(default_tokenizer_dir() / file, out / file)
    return out


def test_the_context_is_the_window_and_a_longer_prompt_is_refused(gemma2_dir: Path, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="thinkstruct.engine"):
        model = load_model(gemma2_dir, dtype="float32", progress=False)
    assert model.context_length == WINDOW
    assert f"window of {WINDOW} tokens" in caplog.text
    with Engine(model, config=EngineConfig(max_batch=1)) as engine:
        out = engine.submit(
            GenerationRequest(prompt_ids=[5, 6, 7], sampling=SamplingParams(max_tokens=20, temperature=0.0))
        ).wait()
        assert len(out.token_ids) <= WINDOW - 3  # the answer stops at the window too
        with pytest.raises(ValueError, match=f"at most {WINDOW - 1}"):
            engine.submit(GenerationRequest(prompt_ids=list(range(5, 5 + WINDOW)), sampling=SamplingParams()))


def test_which_configs_have_a_window() -> None:
    from transformers import Gemma2Config, LlamaConfig, MistralConfig, Qwen2Config

    assert attention_window(LlamaConfig()) is None
    assert attention_window(Qwen2Config(use_sliding_window=False, sliding_window=4096)) is None
    assert (
        attention_window(Qwen2Config(use_sliding_window=True, sliding_window=64, max_window_layers=0)) == 64
    )
    assert attention_window(MistralConfig(sliding_window=4096)) == 4096
    assert attention_window(MistralConfig(sliding_window=None)) is None
    assert attention_window(Gemma2Config(sliding_window=512)) == 512
