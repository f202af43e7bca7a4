"""A tiny random-weight Llama over the DeepSeek-V4 tokenizer, saved as a model directory.

The engine tests need a model with native ``<think>``/``</think>`` special tokens (ids
128821/128822) that loads through the ordinary ``load_model(path)`` in well under a
second; SmolLM2 writes its tags as plain text. Two layers of width 64 over 129,280 tokens:
about 8.4 M parameters (the embedding, tied to the output layer), 34 MB in float32, built
and saved in about a second. The weights are random (seeded), so the text is gibberish;
what the engine tests check is structure (grammars, reasoning phases, batching), not
quality.

The directory is named ``tiny-deepseek-v4`` so that family detection picks
``deepseek-v4`` by name, as it would for a real DeepSeek-V4 checkout.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from thinkstruct.tokenizer import default_tokenizer_dir

DEEPSEEK_V4_VOCAB = 129_280
BOS_ID = 0  # <｜begin▁of▁sentence｜>
EOS_ID = 1  # <｜end▁of▁sentence｜>
THINK_START_ID = 128_821
THINK_END_ID = 128_822


def build_tiny_model(
    parent: str | Path,
    *,
    name: str = "tiny-deepseek-v4",
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    context_length: int = 4096,
    seed: int = 0,
) -> Path:
    """Build and save the tiny model in ``parent/name``; returns that directory.

    The same arguments give the same weights (a private generator: the global torch RNG
    is left alone). The directory holds ``config.json``, ``model.safetensors``,
    ``generation_config.json`` (EOS id 1) and the DeepSeek-V4 tokenizer files.
    """
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    out = Path(parent) / name
    out.mkdir(parents=True, exist_ok=True)
    config = LlamaConfig(
        vocab_size=DEEPSEEK_V4_VOCAB,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=context_length,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=EOS_ID,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=EOS_ID)
    model.save_pretrained(str(out))
    for file in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(default_tokenizer_dir() / file, out / file)
    return out
