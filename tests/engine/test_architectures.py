"""Every entry of the architecture registry against transformers' own modules.

Each entry gets a random two-layer model (seeded) with every feature it has switched on:
biases, per-head q/k norms, a scaled rotary table (llama3, yarn, linear, longrope), partial
rotary, a layer without rotary, a sliding window shorter than the rows, fused projections.
The decoder runner computes it three ways (torch operations; float32 on the compiled
kernels; int8 weights, every layer in one kernel call), and each must give the logits of
the same model (its int8-weight copy for the last) run whole by transformers: ragged
rows in one pass, a row copied to another slot, greedy decoding. The int8-weight pass is
also the same bits whatever rows are beside it.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest
import torch
from gguf_files import write_gguf
from kv_reference import kv_dtype_of, reference_logits, tolerance

from thinkstruct.engine.kernels.cpu_kernels import cpu_kernels
from thinkstruct.engine.runners.architectures import ARCHITECTURES, REFUSED, architecture_of
from thinkstruct.engine.runners.decoder_runner import DecoderRunner, supports
from thinkstruct.engine.runners.runner import TransformersRunner
from thinkstruct.engine.weights.int8_weights import quantize_int8_weights

VOCAB = 320  # a multiple of 16: the output layer gets int8 weights too (batch-invariant)
CONTEXT = 64  # within the longrope model's original context
#: Every entry's shapes: 4 query heads of 32 over 2 key/value heads, MLP 96, two layers.
COMMON: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 128,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": None,  # greedy runs its whole length
    "initializer_range": 0.3,  # varied tokens (at 0.02 a random model repeats one)
}
#: Each entry's config with every feature of the entry on (windows of 4-5 tokens: the
#: rows below are longer).
FEATURES: dict[str, dict[str, Any]] = {
    "llama": {
        "attention_bias": True,
        "mlp_bias": True,
        "rope_parameters": {
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16, "rope_theta": 10000.0,
        },
    },
    "mistral": {"sliding_window": 4},
    "qwen2": {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1},
    "qwen3": {
        "attention_bias": True,
        "use_sliding_window": True,
        "sliding_window": 5,
        "max_window_layers": 1,
        "rope_parameters": {
            "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": 10000.0,
        },
    },
    "smollm3": {
        "no_rope_layer_interval": 2,
        "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
    },
    "phi3": {
        "sliding_window": 5,
        "original_max_position_embeddings": CONTEXT,
        "rope_parameters": {
            "rope_type": "longrope",
            "short_factor": [1.0 + 0.1 * i for i in range(8)],
            "long_factor": [2.0 + i for i in range(8)],
            "original_max_position_embeddings": CONTEXT,
            "partial_rotary_factor": 0.5,
            "rope_theta": 10000.0,
        },
    },
}  # fmt: skip


def build(model_type: str, *, features: bool = True, **overrides: Any) -> Any:
    """The entry's random model (seeded, float32, eval mode), with its :data:`FEATURES`
    unless ``features`` is off."""
    from transformers import AutoConfig, AutoModelForCausalLM

    chosen = FEATURES[model_type] if features else {}
    config = AutoConfig.for_model(model_type, **{**COMMON, **chosen, **overrides})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(sum(map(ord, model_type)))
        model = AutoModelForCausalLM.from_config(config)
        with torch.no_grad():  # random biases and norm weights, not zeros and ones
            for name, parameter in model.named_parameters():
                if name.endswith("bias") or "norm" in name:
                    parameter.add_(torch.randn_like(parameter) * 0.3)
    return model.eval()


@pytest.fixture(scope="module")
def models() -> dict[str, Any]:
    """Each entry's float32 model and its int8-weight copy, built once."""
    built: dict[str, Any] = {}
    for model_type in FEATURES:
        model = build(model_type)
        quantized = copy.deepcopy(model)
        quantize_int8_weights(quantized)
        built[model_type] = model
        built[model_type + "/int8"] = quantized
    return built


#: How the runner computes: (runner options, whether on int8 weights, what it must use).
WAYS = {
    "torch": ({"kernels": False}, False),
    "kernels": ({}, False),
    "stacked-int8": ({}, True),
}

each_entry = pytest.mark.parametrize("model_type", sorted(FEATURES))
each_way = pytest.mark.parametrize("way", sorted(WAYS))


def _runner(models: dict[str, Any], model_type: str, way: str, slots: int = 3) -> tuple[DecoderRunner, Any]:
    options, int8 = WAYS[way]
    model = models[model_type + ("/int8" if int8 else "")]
    runner = DecoderRunner(model, slots=slots, context_length=CONTEXT, **options)
    assert runner.architecture is ARCHITECTURES[model_type]
    assert runner.compiled == (way != "torch")  # every entry's shapes fit the kernels
    assert runner.stacked == (way == "stacked-int8")
    return runner, model


def _ids(seed: int, n: int) -> list[int]:
    return [(seed * 131 + 17 * i * i + 7 * i) % (VOCAB - 3) + 3 for i in range(n)]


def test_every_entry_is_tested_here() -> None:
    assert set(FEATURES) == set(ARCHITECTURES)


@each_entry
@each_way
def test_ragged_rows_and_a_copied_slot_give_transformers_logits(models, model_type, way) -> None:
    runner, model = _runner(models, model_type, way)
    rows = [_ids(1, 9), _ids(2, 3), _ids(3, 12)]  # longer than every window
    with torch.inference_mode():
        for slot, ids in enumerate(rows):
            got = runner.forward(slot, [ids], [0])[0]
            torch.testing.assert_close(
                got, reference_logits(model, ids, kv_dtype_of(runner)), **tolerance(kv_dtype_of(runner))
            )
        # One pass: rows feeding 1, 4 and 2 tokens, each from its own position.
        feeds = [_ids(4, 1), _ids(5, 4), _ids(6, 2)]
        got = runner.forward(0, feeds, [len(r) for r in rows])
        rows = [r + f for r, f in zip(rows, feeds, strict=True)]
        for i, ids in enumerate(rows):
            torch.testing.assert_close(
                got[i], reference_logits(model, ids, kv_dtype_of(runner)), **tolerance(kv_dtype_of(runner))
            )
        # Row 2 moves to slot 0 (the scheduler's compaction) and goes on there.
        runner.copy_slot(2, 0, len(rows[2]))
        got = runner.forward(0, [_ids(7, 3)], [len(rows[2])])[0]
    torch.testing.assert_close(
        got,
        reference_logits(model, rows[2] + _ids(7, 3), kv_dtype_of(runner)),
        **tolerance(kv_dtype_of(runner)),
    )


@each_entry
def test_greedy_decoding_is_transformers_float32_greedy_generate(models, model_type) -> None:
    """On the compiled kernels (float32), token by token after a prompt prefilled in one
    pass, past the sliding window."""
    runner, model = _runner(models, model_type, "kernels", slots=1)
    prompt = _ids(8, 6)
    steps = 16
    with torch.inference_mode():
        want = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=steps,
            do_sample=False,
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
        got: list[int] = []
        logits = runner.forward(0, [prompt], [0])[0]
        for _ in range(steps):
            got.append(int(logits.argmax()))
            logits = runner.forward(0, [[got[-1]]], [len(prompt) + len(got) - 1])[0]
    assert got == want


@each_entry
def test_int8_weight_rows_are_the_same_bits_whatever_is_beside_them(models, model_type) -> None:
    """Alone, beside a longer prompt, beside rows feeding several tokens, and on the AVX2
    tiles instead of AVX-512: the same logits, bit for bit."""
    kernels = cpu_kernels()
    assert kernels is not None
    alone, _ = _runner(models, model_type, "stacked-int8")
    crowded, _ = _runner(models, model_type, "stacked-int8")
    ids = _ids(9, 7)
    with torch.inference_mode():
        first = alone.forward(0, [ids], [0])
        beside = crowded.forward(0, [ids, _ids(10, 17), _ids(11, 1)], [0, 0, 0])
        assert torch.equal(first[0], beside[0])
        after = alone.forward(0, [[11]], [7])
        beside = crowded.forward(0, [[11], [12], [13, 14, 15]], [7, 17, 1])
        assert torch.equal(after[0], beside[0])
        try:
            kernels.use_avx512(False)
            narrow, _ = _runner(models, model_type, "stacked-int8")
            narrow.forward(0, [ids, _ids(10, 17), _ids(11, 1)], [0, 0, 0])
            assert torch.equal(narrow.forward(0, [[11], [12], [13, 14, 15]], [7, 17, 1]), beside)
        finally:
            kernels.use_avx512(True)


def test_a_longrope_model_beyond_its_original_context_is_refused() -> None:
    """transformers switches longrope's frequencies with the batch's longest row: exact
    only within the original context."""
    model = build("phi3")
    assert supports(model, context_length=CONTEXT) is None
    reason = supports(model, context_length=CONTEXT + 1)
    assert reason is not None and "longrope" in reason
    with pytest.raises(ValueError, match="longrope"):
        DecoderRunner(model, slots=1, context_length=CONTEXT + 1)


def test_a_rotary_the_tables_cannot_hold_is_refused() -> None:
    model = build("llama", rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    assert "rope type 'dynamic'" in str(supports(model, context_length=CONTEXT))


def test_an_architecture_with_soft_capping_is_refused_with_the_reason(caplog) -> None:
    """Gemma 3 is refused by the registry (never computed approximately); the engine
    runs it on transformers' modules and logs why."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from thinkstruct.engine.runners.decoder_runner import default_runner

    assert "soft-caps" in REFUSED["gemma3_text"]
    config = Gemma3TextConfig(**{**COMMON, "head_dim": 32})
    model = Gemma3ForCausalLM(config).eval()
    reason = architecture_of(model)
    assert isinstance(reason, str) and "soft-caps" in reason
    with caplog.at_level(logging.INFO, logger="thinkstruct.engine"):
        runner = default_runner(model, slots=1, context_length=CONTEXT, vocab_size=VOCAB)
    assert isinstance(runner, TransformersRunner)
    assert "soft-caps" in caplog.text


def test_a_model_type_without_an_entry_names_itself() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2)).eval()
    assert supports(model) == "model type 'gpt2' has no entry in the architecture registry"


# ---- GGUF files of each architecture through load_model (what --model reads) ----------

#: The architectures transformers' GGUF loader reads (a Mistral GGUF is written as
#: ``llama``, as llama.cpp writes it; transformers reads no SmolLM3 GGUF).
GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3", "phi3")


@pytest.mark.parametrize("arch", GGUF_ARCHITECTURES)
def test_a_gguf_of_each_architecture_loads_onto_the_decoder_runner(tmp_path, monkeypatch, arch) -> None:
    """A small GGUF written with the ``gguf`` package loads through ``load_model`` (what
    ``--model file.gguf`` runs), lands on the decoder runner's int8-weight pass, and computes
    the source model's logits (to int8 rounding) and, in float32, exactly its function."""
    from thinkstruct.engine.model.loading import load_model

    monkeypatch.setenv("THINKSTRUCT_CACHE", str(tmp_path / "cache"))
    # Heads of 128 (GGUF's qwen3 and phi3 keys do not carry head_dim: the configs' default),
    # the architecture's own layout (Qwen2's biases, Qwen3's q/k norms, Phi-3's fused
    # projections), default rotary (GGUF keys hold no scaling), an untied output layer.
    source = build(
        arch, features=False, hidden_size=256, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=128, tie_word_embeddings=False,
    )  # fmt: skip
    path = tmp_path / f"tiny-{arch}.gguf"
    write_gguf(source, path, arch)
    ids = _ids(12, 10)
    # float32 to 3e-4: summation order differs between torch's matmuls and the runner's
    # (1.1e-4 seen once on one CPU, phi3; float16 keys and values: kv_reference.tolerance);
    # a layout error moves logits by far more.
    for quantize in (None, "int8-weights"):
        loaded = load_model(path, dtype="float32", quantize=quantize, progress=False)
        assert loaded.model.config.model_type == arch
        runner = DecoderRunner(loaded.model, slots=1, context_length=CONTEXT)
        assert runner.stacked == (quantize == "int8-weights")
        with torch.inference_mode():
            got = runner.forward(0, [ids], [0])[0]
        want = reference_logits(source, ids, kv_dtype_of(runner))
        if quantize is None:
            bound = max(3e-4, tolerance(kv_dtype_of(runner))["atol"])
            torch.testing.assert_close(got, want, rtol=bound, atol=bound)
        else:  # int8 weights: the same greedy pick and close logits
            assert int(got.argmax()) == int(want.argmax())
            assert float((got - want).norm() / want.norm()) < 0.05


def _k_quant_gguf(tmp_path: Any, monkeypatch: Any, *, down: str | None = None) -> Any:
    """A small Llama (rows of 256 and 512: K blocks fit) as a Q4_K_M-style GGUF
    (:func:`write_gguf`), the cache in ``tmp_path``."""
    monkeypatch.setenv("THINKSTRUCT_CACHE", str(tmp_path / "cache"))
    source = build(
        "llama", features=False, hidden_size=256, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=512, tie_word_embeddings=False,
    )  # fmt: skip
    path = tmp_path / "tiny-k-quants.gguf"
    write_gguf(source, path, "llama", k_quants=True, down=down)
    return path


def test_a_q4_k_m_gguf_runs_its_own_blocks(tmp_path, monkeypatch) -> None:
    """A Llama GGUF whose Linear weights are Q4_K and Q6_K as a Q4_K_M file has them (the
    most common download): by default on its own blocks, each holding exactly the weights transformers dequantizes,
    computing that float32 model's logits up to the activations' int16 rounding, the same
    bits for a row in any batch."""
    from thinkstruct.engine.model.loading import default_quantize, load_model
    from thinkstruct.engine.weights.gguf_weights import GGUFLinear

    path = _k_quant_gguf(tmp_path, monkeypatch)
    assert default_quantize(path) == "gguf"
    blocks = load_model(path, quantize="auto", progress=False)
    plain = load_model(path, dtype="float32", quantize=None, progress=False)
    assert blocks.quantize == "gguf"
    layers = {name: m for name, m in blocks.model.named_modules() if isinstance(m, GGUFLinear)}
    assert len(layers) == 2 * 7 + 1
    six = {name for name, m in layers.items() if m.fmt == "Q6_K"}
    assert six == {"lm_head"} | {
        f"model.layers.{i}.{p}" for i in (0, 1) for p in ("self_attn.v_proj", "mlp.down_proj")
    }
    assert {m.fmt for name, m in layers.items() if name not in six} == {"Q4_K"}
    reference = dict(plain.model.named_modules())
    for name, layer in layers.items():
        assert torch.equal(layer.dequantized(), reference[name].weight), name
    runner = DecoderRunner(blocks.model, slots=3, context_length=CONTEXT)
    assert runner.stacked and runner.batch_invariant
    ids, other = _ids(15, 10), _ids(16, 7)
    with torch.inference_mode():
        want = reference_logits(plain.model, ids, kv_dtype_of(runner))
        got = runner.forward(0, [ids], [0])[0]
        beside = DecoderRunner(blocks.model, slots=3, context_length=CONTEXT).forward(
            0, [other, ids], [0, 0]
        )[1]
    assert int(got.argmax()) == int(want.argmax())
    assert float((got - want).norm() / want.norm()) < 1e-3
    assert torch.equal(got, beside)


def test_a_gguf_with_a_type_the_kernels_do_not_run_takes_int8_rows_for_those_tensors(
    tmp_path, monkeypatch
) -> None:
    """MXFP4 down projections beside Q4_K and Q6_K ones: still on the blocks by default,
    those tensors int8 rows (dequantized, then rounded per row), the answer the float32
    model's to int8's rounding."""
    from thinkstruct.engine.model.loading import default_quantize, load_model
    from thinkstruct.engine.weights.gguf_weights import GGUFLinear

    path = _k_quant_gguf(tmp_path, monkeypatch, down="MXFP4")
    assert default_quantize(path) == "gguf"
    blocks = load_model(path, quantize="auto", progress=False)
    plain = load_model(path, dtype="float32", quantize=None, progress=False)
    kinds = {name: type(m).__name__ for name, m in blocks.model.named_modules() if name.endswith("proj")}
    assert {kinds[f"model.layers.{i}.mlp.down_proj"] for i in (0, 1)} == {"Int8Linear"}
    assert sum(isinstance(m, GGUFLinear) for m in blocks.model.modules()) == 2 * 6 + 1
    runner = DecoderRunner(blocks.model, slots=1, context_length=CONTEXT)
    assert runner.stacked
    ids = _ids(17, 9)
    with torch.inference_mode():
        got, want = runner.forward(0, [ids], [0])[0], reference_logits(plain.model, ids, kv_dtype_of(runner))
    assert int(got.argmax()) == int(want.argmax())
    assert float((got - want).norm() / want.norm()) < 0.05


def test_dynamic_int8_projections_keep_their_biases_when_stacked(models) -> None:
    """``--quantize int8`` on Qwen2 (biased q/k/v): the runner's stacked q/k/v computes
    what the quantized model's own layers do (rows of equal length, batched alike on both
    sides: torch's dynamic int8 takes one input scale per tensor)."""
    import warnings

    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    model = copy.deepcopy(models["qwen2"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_dynamic(
            model, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8, inplace=True
        )
    assert model.model.layers[0].self_attn.q_proj.bias() is not None
    # Keys and values in float32, as transformers keeps them: the projections are the question.
    fused = DecoderRunner(model, slots=2, context_length=CONTEXT, kv_cache_dtype=torch.float32)
    rows = [_ids(13, 6), _ids(14, 6)]
    with torch.inference_mode():
        # The output layer over the last positions only, as the runner runs it.
        want = model(input_ids=torch.tensor(rows), use_cache=False, logits_to_keep=1).logits[:, -1].float()
        torch.testing.assert_close(fused.forward(0, rows, [0, 0]), want, rtol=1e-5, atol=1e-5)
