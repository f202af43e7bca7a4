"""load_model: the embedded SmolLM2, local directories, dtypes, int8, family detection,
clear errors, and the GGUF conversion cache surviving kills, races and truncation.

Real models only: the embedded SmolLM2 GGUF and a tiny random Llama over the DeepSeek-V4
tokenizer (tiny_model.py). The cache tests convert the real GGUF into a temporary cache.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from gguf_files import write_gguf
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_model import EOS_ID, THINK_END_ID, THINK_START_ID, build_tiny_model

from polling import wait_until
from thinkstruct.engine.model.errors import ModelNotFoundError, UnsupportedModelError
from thinkstruct.engine.model.families import PLAIN_FAMILY, detect_family
from thinkstruct.engine.model.gguf_conversion import models_cache_dir
from thinkstruct.engine.model.loading import LoadedModel, load_model
from thinkstruct.engine.model.model_cache import MANIFEST, entry_problem, read_manifest
from thinkstruct.engine.model.paths import served_model_name
from thinkstruct.parsers import UnknownName, render_chat
from thinkstruct.tokenizer import gguf_cache_key, smollm2_gguf_path

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
SHORT = "The capital of France is"  # bf16 prefill is slow on CPUs without AVX512-BF16: keep prompts short


def greedy(loaded: LoadedModel, prompt_ids: list[int], n: int) -> list[int]:
    """``n`` greedy tokens, by plain forwards with a KV cache (no sampling code involved)."""
    return greedy_tokens(loaded.model, prompt_ids, n)


def greedy_tokens(model: torch.nn.Module, prompt_ids: list[int], n: int) -> list[int]:
    """:func:`greedy` of a transformers causal LM."""
    import inspect

    from transformers import DynamicCache

    # transformers 5.x renames past_key_values to cache
    cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    cache = DynamicCache()
    ids = torch.tensor([prompt_ids])
    out: list[int] = []
    with torch.inference_mode():
        for _ in range(n):
            logits = model(input_ids=ids, use_cache=True, **{cache_kw: cache}).logits
            token = int(logits[0, -1].argmax())
            out.append(token)
            ids = torch.tensor([[token]])
    return out


def chat_ids(loaded: LoadedModel, messages: list[dict], **kwargs: object) -> list[int]:
    prompt = render_chat(
        messages, family=loaded.family, chat_template=loaded.chat_template, chat_template_kwargs=kwargs
    )
    return loaded.tokenizer.hf.encode(prompt.text, add_special_tokens=False)


# ---- the embedded default -----------------------------------------------------------------


def test_the_default_is_smollm2_from_its_gguf(smollm2: LoadedModel) -> None:
    assert smollm2.name == "SmolLM2-135M-Instruct"
    assert smollm2.path == smollm2_gguf_path().resolve()
    assert smollm2.family.name == "smollm2-think"
    assert "smollm2" in smollm2.family_reason
    assert smollm2.dtype is torch.bfloat16 and smollm2.quantize is None
    assert next(smollm2.model.parameters()).dtype is torch.bfloat16
    assert not smollm2.model.training
    assert smollm2.context_length == 8192  # llama.context_length in the GGUF header
    assert type(smollm2.model).__name__ == "LlamaForCausalLM"
    # The vocabulary: 49,152 ids, <|im_end|> ends a turn, the think tags are plain text.
    assert smollm2.tokenizer.vocab_size == 49152 == smollm2.model.config.vocab_size
    assert smollm2.tokenizer.eos_token_ids == (2,)
    assert len(smollm2.tokenizer.think_start_ids) > 1
    # The family's built-in template (it adds the thinking instruction), not the GGUF's own.
    assert smollm2.chat_template is not None and "smollm2-think" in smollm2.chat_template.name
    # SmolLM2's vocabulary has StarCoder's <repo_name>/<file_sep> tokens but no <fim_*>.
    assert smollm2.completion_template is None
    vocab = smollm2.tokenizer.hf.get_vocab()
    assert "<file_sep>" in vocab and not any("fim" in token.lower() for token in vocab)


def test_the_default_answers_a_question(smollm2: LoadedModel) -> None:
    tokens = greedy(smollm2, chat_ids(smollm2, QUESTION, enable_thinking=False), 12)
    assert "Paris" in smollm2.tokenizer.decode(tokens)


def test_the_cache_is_complete_and_a_second_start_reads_it(smollm2: LoadedModel) -> None:
    entry = smollm2.weights_dir
    assert entry is not None and entry.name == gguf_cache_key(smollm2_gguf_path())
    assert entry_problem(entry) is None
    manifest = read_manifest(entry)
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= set(
        manifest["files"]
    )
    assert manifest["meta"]["dtype"] == "float32"  # lossless: every dtype loads from it
    again = load_model(progress=False)
    assert not again.converted and again.weights_dir == entry
    ids = torch.tensor([smollm2.tokenizer.encode(SHORT)])
    with torch.inference_mode():
        assert torch.equal(again.model(input_ids=ids).logits, smollm2.model(input_ids=ids).logits)


@pytest.mark.parametrize("dtype, expected", [("float32", torch.float32), ("float16", torch.float16)])
def test_other_dtypes_load_from_the_same_cache(
    smollm2: LoadedModel, dtype: str, expected: torch.dtype
) -> None:
    loaded = load_model(dtype=dtype, progress=False)
    assert loaded.dtype is expected and next(loaded.model.parameters()).dtype is expected
    assert loaded.weights_dir == smollm2.weights_dir and not loaded.converted
    assert loaded.tokenizer.decode(greedy(loaded, loaded.tokenizer.encode(SHORT), 1)) == " Paris"


def test_int8_quantizes_the_linear_layers_and_keeps_the_answer(
    smollm2: LoadedModel, smollm2_int8: LoadedModel
) -> None:
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    model = smollm2_int8.model
    assert smollm2_int8.quantize == "int8" and smollm2_int8.dtype is torch.float32
    linear = {name for name, m in model.named_modules() if type(m) is torch.nn.Linear}
    quantized = {name for name, m in model.named_modules() if isinstance(m, DynamicLinear)}
    assert len(linear) + len(quantized) == 30 * 7 + 1  # q, k, v, o, gate, up, down per layer, and the head
    assert linear == set(smollm2_int8.float_modules) and len(quantized) > 150
    # the down_proj fed by SmolLM2's largest massive activations (peak/mean ~17,000) stays float even smoothed
    assert "model.layers.11.mlp.down_proj" in linear and "lm_head" in quantized
    assert smollm2_int8.tokenizer.vocab_size == 49152  # read from the quantized head
    # The next token it predicts along the unquantized model's answer (teacher-forced) is
    # mostly that model's: its own greedy text may part from it at a close call (a CPU's
    # int8 kernels round differently; on one machine here it began "La France, ...").
    ids = chat_ids(smollm2, QUESTION, enable_thinking=False)
    answer = greedy(smollm2, ids, 16)
    assert "Paris" in smollm2.tokenizer.decode(answer)
    fed = torch.tensor([ids + answer])
    with torch.inference_mode():
        want = smollm2.model(input_ids=fed).logits[0, len(ids) - 1 : -1].argmax(-1)
        got = smollm2_int8.model(input_ids=fed).logits[0, len(ids) - 1 : -1].argmax(-1)
    agreed = int((got == want).sum())
    print(f"int8 top-1 along the answer: {agreed}/{len(answer)}")
    assert agreed >= 0.75 * len(answer)


class Haiku(NamedTuple):
    """float32's own greedy answer to a haiku request: the ids (prompt and answer), the
    positions that predict the answer, and float32's log-probabilities there."""

    ids: torch.Tensor
    span: slice
    reference: torch.Tensor


@pytest.fixture(scope="module")
def haiku() -> Haiku:
    reference = load_model(dtype="float32", progress=False)
    prompt = chat_ids(
        reference, [{"role": "user", "content": "Write a haiku about the sea."}], enable_thinking=False
    )
    ids = torch.tensor([prompt + greedy(reference, prompt, 24)])
    span = slice(len(prompt) - 1, ids.shape[1] - 1)
    with torch.inference_mode():
        logprobs = reference.model(input_ids=ids).logits[0, span].log_softmax(-1)
    return Haiku(ids, span, logprobs)


def _haiku_logprobs(haiku: Haiku, model: torch.nn.Module) -> torch.Tensor:
    """``model``'s log-probabilities teacher-forced on float32's haiku."""
    with torch.inference_mode():
        return model(input_ids=haiku.ids).logits[0, haiku.span].log_softmax(-1)


def _haiku_kl(haiku: Haiku, out: torch.Tensor) -> float:
    """KL(float32 || out) per position of the haiku."""
    return float(torch.nn.functional.kl_div(out, haiku.reference, log_target=True, reduction="batchmean"))


def test_keeping_outlier_layers_float_is_closer_to_float32(smollm2_int8: LoadedModel, haiku: Haiku) -> None:
    """Teacher-forced on float32's own answer: less KL than quantizing every Linear."""
    import warnings

    from torch.ao.quantization import quantize_dynamic

    everything = load_model(dtype="float32", progress=False).model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_dynamic(everything, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)
    dynamic, every_linear = _haiku_logprobs(haiku, smollm2_int8.model), _haiku_logprobs(haiku, everything)
    assert _haiku_kl(haiku, dynamic) < _haiku_kl(haiku, every_linear) / 2


def test_int8_weights_quantize_every_linear_and_keep_the_answer(smollm2_int8_weights: LoadedModel) -> None:
    from thinkstruct.engine.weights.int8_weights import Int8Linear

    loaded = smollm2_int8_weights
    assert loaded.quantize == "int8-weights" and loaded.dtype is torch.float32 and loaded.float_modules == ()
    assert not any(type(m) is torch.nn.Linear for m in loaded.model.modules())
    quantized = {name for name, m in loaded.model.named_modules() if isinstance(m, Int8Linear)}
    assert len(quantized) == 30 * 7 + 1 and "lm_head" in quantized
    assert loaded.tokenizer.vocab_size == 49152  # read from the quantized head
    tokens = greedy(loaded, chat_ids(loaded, QUESTION, enable_thinking=False), 12)
    assert "Paris" in loaded.tokenizer.decode(tokens)


def test_int8_weights_stay_far_closer_to_float32_than_dynamic_int8(
    smollm2_int8: LoadedModel, smollm2_int8_weights: LoadedModel, haiku: Haiku
) -> None:
    """Teacher-forced on float32's own answer: with float32 activations the int8 weights
    keep float32's next token nearly everywhere, at a fraction of dynamic int8's KL."""
    weights = _haiku_logprobs(haiku, smollm2_int8_weights.model)
    dynamic = _haiku_logprobs(haiku, smollm2_int8.model)
    assert _haiku_kl(haiku, weights) < _haiku_kl(haiku, dynamic) / 4
    assert float((weights.argmax(-1) == haiku.reference.argmax(-1)).float().mean()) >= 0.9


# ---- a local model directory ----------------------------------------------------------------


def test_a_tiny_deepseek_v4_directory_loads_with_native_think_tokens(
    tiny_model: LoadedModel, tiny_model_dir: Path
) -> None:
    assert tiny_model.name == "tiny-deepseek-v4" and tiny_model.path == tiny_model_dir.resolve()
    assert tiny_model.family.name == "deepseek-v4"
    assert tiny_model.weights_dir == tiny_model.path and not tiny_model.converted
    assert tiny_model.tokenizer.vocab_size == 129280
    assert tiny_model.tokenizer.think_start_ids == (THINK_START_ID,)
    assert tiny_model.tokenizer.think_end_ids == (THINK_END_ID,)
    assert tiny_model.tokenizer.eos_token_ids == (EOS_ID,)
    assert tiny_model.context_length == 4096
    # DeepSeek-V4's tokenizer ships no chat template: the family's built-in one.
    assert tiny_model.chat_template is not None and "deepseek-v4" in tiny_model.chat_template.name
    # Its vocabulary has the FIM tokens: the family's own completion template.
    assert tiny_model.completion_template is not None and tiny_model.completion_template.name == "deepseek-v4"
    logits = tiny_model.model(input_ids=torch.tensor([[0, 100, 200]])).logits
    assert logits.shape == (1, 3, 129280) and logits.dtype is torch.float32


def test_the_tiny_model_is_deterministic(tmp_path: Path, tiny_model: LoadedModel) -> None:
    other = load_model(build_tiny_model(tmp_path), dtype="float32", progress=False)
    ids = [0, 5, 6, 7]
    assert greedy(other, ids, 4) == greedy(tiny_model, ids, 4)
    different = load_model(build_tiny_model(tmp_path / "s1", seed=1), dtype="float32", progress=False)
    first = tiny_model.model(input_ids=torch.tensor([ids])).logits
    assert not torch.equal(different.model(input_ids=torch.tensor([ids])).logits, first)


def test_reasoning_parser_overrides_detection(tiny_model_dir: Path) -> None:
    loaded = load_model(tiny_model_dir, reasoning_parser="qwen3", progress=False)
    assert loaded.family.name == "qwen3" and loaded.family_reason == "reasoning_parser='qwen3'"
    assert loaded.chat_template is not None and "qwen3" in loaded.chat_template.name
    assert load_model(tiny_model_dir, reasoning_parser="plain", progress=False).family is PLAIN_FAMILY
    with pytest.raises(UnknownName, match="nonesuch.*known: .*deepseek-v4"):
        load_model(tiny_model_dir, reasoning_parser="nonesuch", progress=False)


def test_an_unknown_model_gets_the_plain_family_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = build_tiny_model(tmp_path, name="my-model")
    with caplog.at_level(logging.INFO, logger="thinkstruct.engine.model.loading"):
        loaded = load_model(directory, progress=False)
    assert loaded.family is PLAIN_FAMILY
    assert "'my-model'" in loaded.family_reason and "'llama'" in loaded.family_reason
    assert any("reasoning family 'plain'" in r.getMessage() for r in caplog.records)
    # plain: no built-in chat template and the tokenizer has none -> no chat; FIM still fits.
    assert loaded.chat_template is None
    assert loaded.completion_template is not None
    # and it does not think unless asked
    assert not PLAIN_FAMILY.enabled({}) and PLAIN_FAMILY.enabled({"enable_thinking": True})


def test_a_hugging_face_cache_snapshot_is_named_after_its_repository(tmp_path: Path) -> None:
    snapshot = tmp_path / "models--Qwen--Qwen3-0.6B" / "snapshots" / "0123abcd"
    build_tiny_model(snapshot.parent, name=snapshot.name)
    loaded = load_model(snapshot, progress=False)
    assert loaded.name == "Qwen3-0.6B" and loaded.family.name == "qwen3"


# ---- family detection: data in the registry, not code ---------------------------------------


@pytest.mark.parametrize(
    "names, architectures, family",
    [
        (["Qwen3-8B"], ["qwen3"], "qwen3"),
        (["Qwen3-4B-Thinking-2507"], ["qwen3"], "qwen3-thinking"),  # the longer match wins
        (["DeepSeek-R1-Distill-Qwen-7B"], ["qwen2"], "deepseek-r1"),
        (["DeepSeek R1 Distill Llama 8B"], ["llama"], "deepseek-r1"),  # a GGUF general.name
        (["DeepSeek-V3.1"], ["deepseek_v3"], "deepseek-v3"),
        (["gpt-oss-20b"], ["gpt_oss"], "gpt-oss"),
        (["Magistral-Small-2506"], ["mistral"], "mistral"),
        (["GLM-4.5-Air"], ["glm4_moe"], "glm45"),
        (["Kimi-VL-A3B-Thinking"], ["kimi_vl"], "kimi"),
        (["c4ai-command-a-reasoning-08-2025"], ["cohere2"], "cohere-command"),
        (["SmolLM2-360M-Instruct"], ["llama"], "smollm2-think"),
        # no name matches: the architecture decides
        (["my-finetune"], ["qwen3", "Qwen3ForCausalLM"], "qwen3"),
        (["checkpoint-500"], ["gpt_oss", "GptOssForCausalLM"], "gpt-oss"),
        # a name beats an architecture: R1 is a deepseek_v3 model
        (["DeepSeek-R1"], ["deepseek_v3"], "deepseek-r1"),
        # nothing matches
        (["Llama-3.2-1B-Instruct"], ["llama", "LlamaForCausalLM"], "plain"),
        (["SmolLM3-3B"], ["smollm3"], "plain"),
    ],
)
def test_detect_family(names: list[str], architectures: list[str], family: str) -> None:
    assert detect_family(names=names, architectures=architectures).family.name == family


def test_every_built_in_family_has_model_patterns() -> None:
    from thinkstruct.parsers import reasoning_families

    for family in reasoning_families().values():
        if not family.name.startswith("test-"):
            assert family.model_patterns, f"{family.name} has no model_patterns"


def test_a_bad_model_pattern_is_refused_naming_the_family() -> None:
    from thinkstruct.parsers import InvalidTemplateSpec, ReasoningFamily

    with pytest.raises(InvalidTemplateSpec, match="'broken'.*'qwen\\('"):
        ReasoningFamily(
            name="broken",
            think_start="<t>",
            think_end="</t>",
            forced=False,
            switch=None,
            model_patterns=("qwen(",),
        )


def test_a_registered_family_with_patterns_is_detected() -> None:
    from thinkstruct.parsers import (
        ReasoningFamily,
        register_reasoning_family,
        unregister_reasoning_family,
    )

    family = ReasoningFamily(
        name="test-acme",
        think_start="<t>",
        think_end="</t>",
        forced=False,
        switch=None,
        model_patterns=(r"acme-\d+b",),
    )
    register_reasoning_family(family)
    try:
        assert detect_family(names=["Acme-7B-Chat"]).family is family
    finally:
        unregister_reasoning_family("test-acme")
    assert detect_family(names=["Acme-7B-Chat"]).family is PLAIN_FAMILY


@pytest.mark.parametrize(
    "path, name",
    [
        ("/m/SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct"),
        ("/m/Qwen3-8B-Q4_K_M.gguf", "Qwen3-8B"),
        ("/m/gpt-oss-20b-F16.gguf", "gpt-oss-20b"),
        ("/m/model.gguf", "model"),
        ("/m/My Model (v2)", "My-Model-v2"),
    ],
)
def test_served_model_name(path: str, name: str) -> None:
    assert served_model_name(path) == name


@settings(max_examples=50)
@given(st.text(min_size=1, max_size=40).filter(lambda s: "/" not in s and "\x00" not in s))
def test_served_names_are_clean_ids(stem: str) -> None:
    for name in (served_model_name(f"/m/{stem}.gguf"), served_model_name(f"/m/{stem}")):
        assert name and all(c.isascii() and (c.isalnum() or c in "._-") for c in name)
        assert name[0] not in "-." and name[-1] not in "-."


# ---- clear errors -------------------------------------------------------------------------


def test_a_missing_path_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelNotFoundError, match=f"no model at {missing}.*never downloads"):
        load_model(missing)
    with pytest.raises(FileNotFoundError):  # also an ordinary FileNotFoundError
        load_model("HuggingFaceTB/SmolLM2-135M-Instruct")


def test_not_a_model_is_named(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(UnsupportedModelError, match=f"{text} is a file but not a .gguf"):
        load_model(text)
    with pytest.raises(UnsupportedModelError, match=f"{tmp_path} has no config.json"):
        load_model(tmp_path)
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"not a gguf at all")
    with pytest.raises(UnsupportedModelError, match=f"{fake}: cannot read the GGUF header"):
        load_model(fake)


def test_an_unknown_architecture_is_named(tmp_path: Path) -> None:
    model = tmp_path / "strange"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    with pytest.raises(UnsupportedModelError, match=f"{model}: transformers cannot read"):
        load_model(model)


def test_a_model_that_is_not_a_causal_lm_is_named(tmp_path: Path) -> None:
    from transformers import T5Config

    model = tmp_path / "t5"
    T5Config(d_model=16, num_layers=1, num_heads=1, d_ff=16, vocab_size=32).save_pretrained(model)
    with pytest.raises(UnsupportedModelError, match=f"{model}: not a causal language model"):
        load_model(model)


def test_an_unsupported_gguf_architecture_is_refused_before_converting(tmp_path: Path) -> None:
    import gguf
    import numpy as np

    path = tmp_path / "odd.gguf"
    writer = gguf.GGUFWriter(str(path), arch="no-such-arch")
    writer.add_name("odd")
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(
        UnsupportedModelError, match=f"{path}: GGUF architecture 'no-such-arch' is not supported"
    ):
        load_model(path, progress=False)
    assert not (models_cache_dir() / gguf_cache_key(path)).exists()


@pytest.mark.parametrize(
    "kwargs, message",
    [({"dtype": "int4"}, "dtype must be one of"), ({"quantize": "int4"}, "quantize must be")],
)
def test_bad_options_are_named(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_model(**kwargs)


# ---- the conversion cache: killed, raced, truncated ---------------------------------------

#: A start of the engine on a GGUF (argv: the GGUF, the prompt, a file name) that prints
#: its JSON summary. Its GGUF reading (transformers called with ``gguf_file=``, the
#: conversion's dequantization) first says ``dequantizing`` on stderr, then waits until
#: the named file exists: where a kill or a race lands does not depend on the machine's
#: speed.
_START = r"""
import json, os, sys, time, torch, transformers
from thinkstruct.engine.model.loading import load_model

read_gguf = transformers.AutoModelForCausalLM.from_pretrained
def gated(*args, **kwargs):
    if "gguf_file" in kwargs:
        print("dequantizing", file=sys.stderr, flush=True)
        while not os.path.exists(sys.argv[3]):
            time.sleep(0.01)
    return read_gguf(*args, **kwargs)
transformers.AutoModelForCausalLM.from_pretrained = gated

m = load_model(sys.argv[1], dtype="float32", progress=True)
ids = m.tokenizer.encode(sys.argv[2])
with torch.inference_mode():
    out = m.model.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False)
print(json.dumps({"converted": m.converted, "tokens": out[0, len(ids):].tolist(), "entry": str(m.weights_dir)}))
"""


class _Start:
    """:data:`_START` in a process of its own, over the cache ``cache``; its stderr kept in
    a file (read while it runs)."""

    def __init__(self, cache: Path, gguf: Path, gate: Path, name: str) -> None:
        self.stderr_path = cache / f"{name}.stderr"
        with self.stderr_path.open("w") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _START, str(gguf), SHORT, str(gate)],
                env={**os.environ, "THINKSTRUCT_CACHE": str(cache)},
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def says(self, text: str) -> bool:
        assert self.process.poll() is None, self.stderr()[-3000:]
        return text in self.stderr()

    def result(self) -> dict:
        out, _ = self.process.communicate(timeout=300)
        assert self.process.returncode == 0, self.stderr()[-3000:]
        return {**json.loads(out.strip().splitlines()[-1]), "stderr": self.stderr()}


class TinyGGUF(NamedTuple):
    path: Path
    #: The source model's 4 greedy tokens after SHORT (float32, its own forward).
    tokens: list[int]
    #: A complete cache entry of it (converted in this process, in a cache of its own).
    entry: Path


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> TinyGGUF:
    """A two-layer Llama (seeded, float32) as a GGUF of float32 tensors: its conversion
    gives back the same weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        initializer_range=0.3, tie_word_embeddings=False, bos_token_id=None, eos_token_id=317,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        source = LlamaForCausalLM(config).eval()
    directory = tmp_path_factory.mktemp("tiny-gguf")
    path = directory / "tiny-llama.gguf"
    write_gguf(source, path, "llama")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("THINKSTRUCT_CACHE", str(directory / "cache"))
        converted = load_model(path, dtype="float32", progress=False)
    assert converted.weights_dir is not None
    ids = converted.tokenizer.encode(SHORT)
    tokens = greedy_tokens(source, ids, 4)
    return TinyGGUF(path, tokens, converted.weights_dir)


@pytest.fixture(scope="module")
def crashed_then_raced(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: TinyGGUF) -> dict:
    """In a fresh cache: a first start killed mid-conversion; then a damaged entry (a
    complete one with its weights cut short); then two starts at once."""
    cache = tmp_path_factory.mktemp("cache")
    root = cache / "models"
    key = gguf_cache_key(tiny_gguf.path)
    never, go = cache / "never", cache / "go"
    victim = _Start(cache, tiny_gguf.path, never, "victim")
    # It dequantizes with the tokenizer already written to the staging directory.
    wait_until(lambda: victim.says("dequantizing"), "the first start converting", timeout_s=240)
    assert [p for p in root.glob(f"{key}.staging-*") if (p / "tokenizer.json").exists()]
    victim.process.send_signal(signal.SIGKILL)
    victim.process.wait(30)
    after_kill = {
        "entry_exists": (root / key).exists(),
        "leftovers": [p.name for p in root.glob(f"{key}.staging-*")],
        "problem": entry_problem(root / key),
    }
    # The damage: a complete-looking entry whose weights file lost its second half.
    damaged = root / key
    damaged.mkdir()
    for path in tiny_gguf.entry.iterdir():
        if path.name != "model.safetensors":
            shutil.copyfile(path, damaged / path.name)
    weights = (tiny_gguf.entry / "model.safetensors").read_bytes()
    kept = len(weights) // 2
    (damaged / "model.safetensors").write_bytes(weights[:kept])
    damage = entry_problem(damaged)
    # Two starts at once: one converts (held in its dequantization until the other says
    # it waits), the other waits for it.
    racers = [_Start(cache, tiny_gguf.path, go, f"racer-{i}") for i in range(2)]
    wait_until(
        lambda: (
            any(r.says("dequantizing") for r in racers)
            and any(r.says("waiting for another process") for r in racers)
        ),
        "one start converting while the other waits",
        timeout_s=240,
    )
    go.touch()
    results = [racer.result() for racer in racers]
    return {
        "root": root, "key": key, "after_kill": after_kill, "damage": damage, "kept": kept,
        "results": results,
    }  # fmt: skip


@pytest.mark.slow
def test_a_kill_mid_conversion_leaves_no_entry(crashed_then_raced: dict) -> None:
    after = crashed_then_raced["after_kill"]
    assert not after["entry_exists"]
    assert after["leftovers"]  # it was killed with a half-written staging directory
    assert "does not exist" in after["problem"]


@pytest.mark.slow
def test_a_truncated_entry_is_detected_and_rebuilt(crashed_then_raced: dict) -> None:
    entry = crashed_then_raced["root"] / crashed_then_raced["key"]
    assert crashed_then_raced["damage"].startswith(
        f"{entry / 'model.safetensors'} has {crashed_then_raced['kept']} bytes, the manifest says "
    )
    converter = next(r for r in crashed_then_raced["results"] if r["converted"])
    assert "is incomplete" in converter["stderr"] and "converting it again" in converter["stderr"]
    assert entry_problem(entry, full=True) is None  # rebuilt: every file matches its SHA-256


@pytest.mark.slow
def test_concurrent_starts_convert_once_and_agree(crashed_then_raced: dict) -> None:
    results = crashed_then_raced["results"]
    root, key = crashed_then_raced["root"], crashed_then_raced["key"]
    assert sorted(r["converted"] for r in results) == [False, True]
    converter = next(r for r in results if r["converted"])
    waiter = next(r for r in results if not r["converted"])
    assert "converting tiny-llama.gguf (first start only)" in converter["stderr"]
    assert "waiting for another process converting" in waiter["stderr"]
    assert "dequantizing" not in waiter["stderr"]  # it read the converter's entry
    assert results[0]["tokens"] == results[1]["tokens"] and results[0]["entry"] == str(root / key)
    assert not list(root.glob(f"{key}.staging-*"))  # the killed start's leftovers are gone


@pytest.mark.slow
def test_the_rebuilt_entry_gives_the_same_model(crashed_then_raced: dict, tiny_gguf: TinyGGUF) -> None:
    assert crashed_then_raced["results"][0]["tokens"] == tiny_gguf.tokens


def test_an_entry_without_its_manifest_is_incomplete(tmp_path: Path, smollm2: LoadedModel) -> None:
    assert smollm2.weights_dir is not None
    entry = tmp_path / "entry"
    entry.mkdir()
    for path in smollm2.weights_dir.iterdir():
        if path.name != "model.safetensors":
            shutil.copyfile(path, entry / path.name)
    assert "model.safetensors is missing" in (entry_problem(entry) or "")
    (entry / MANIFEST).unlink()
    assert entry_problem(entry) == f"{entry} has no {MANIFEST}: its conversion did not finish"
