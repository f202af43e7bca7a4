"""The embedded SmolLM2 GGUF on its own blocks (``--quantize gguf``).

Its Linear layers must hold exactly the weights transformers dequantizes from the file
(the tensor names and llama.cpp's q/k row permutation mapped right), decode the same
greedy text as that float32 model, and stay batch invariant bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from thinkstruct.engine import load_model
from thinkstruct.engine.kernels.cpu_kernels import cpu_kernels
from thinkstruct.engine.model.loading import LoadedModel, default_quantize
from thinkstruct.engine.runners.decoder_runner import DecoderRunner
from thinkstruct.engine.weights.gguf_weights import GGUFLinear
from thinkstruct.tokenizer import smollm2_gguf_path

PROMPTS = [
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "def fibonacci(n):",
    "<|im_start|>user\nList three colors as JSON.<|im_end|>\n<|im_start|>assistant\n",
]


@pytest.fixture(scope="module")
def smollm2_float32() -> LoadedModel:
    return load_model(dtype="float32", progress=False)


def test_every_linear_runs_the_files_blocks_and_holds_its_weights(smollm2_gguf, smollm2_float32) -> None:
    assert smollm2_gguf.quantize == "gguf" and smollm2_gguf.dtype is torch.float32
    layers = {name: m for name, m in smollm2_gguf.model.named_modules() if isinstance(m, GGUFLinear)}
    assert len(layers) == 30 * 7 + 1  # q, k, v, o, gate, up, down per layer, and the head
    assert layers["lm_head"].fmt == "Q8_0"  # tied to the Q8_0 token embeddings
    assert {m.fmt for name, m in layers.items() if name != "lm_head"} == {"Q4_1"}
    reference = dict(smollm2_float32.model.named_modules())
    for name, layer in layers.items():
        # Bit for bit what transformers dequantizes: q/k rows un-permuted as it does.
        assert torch.equal(layer.dequantized(), reference[name].weight), name


def _greedy(runner: DecoderRunner, ids: list[int], steps: int) -> list[int]:
    out: list[int] = []
    feed, start = ids, 0
    for _ in range(steps):
        token = int(runner.forward(0, [feed], [start])[0].argmax())
        out.append(token)
        start, feed = start + len(feed), [token]
    return out


def test_greedy_text_is_the_float32_models(smollm2_gguf, smollm2_float32) -> None:
    """The same function as the dequantized float32 model up to float summation order:
    the same greedy tokens (48 of each prompt)."""
    tokenizer = smollm2_gguf.tokenizer
    blocks = DecoderRunner(smollm2_gguf.model, slots=2, context_length=512)
    plain = DecoderRunner(smollm2_float32.model, slots=2, context_length=512)
    assert blocks.stacked and blocks.batch_invariant  # one kernel call a pass
    with torch.inference_mode():
        for prompt in PROMPTS:
            ids = tokenizer.encode(prompt)
            assert _greedy(blocks, ids, 48) == _greedy(plain, ids, 48), prompt


def test_a_rows_logits_do_not_depend_on_its_batch(smollm2_gguf) -> None:
    model, tokenizer = smollm2_gguf.model, smollm2_gguf.tokenizer
    ids = tokenizer.encode(PROMPTS[0])
    other = tokenizer.encode(PROMPTS[2])
    alone = DecoderRunner(model, slots=4, context_length=512)
    crowded = DecoderRunner(model, slots=4, context_length=512)
    with torch.inference_mode():
        first = alone.forward(0, [ids], [0])
        beside = crowded.forward(0, [ids, other, [3]], [0, 0, 0])
        assert torch.equal(first[0], beside[0])
        after = alone.forward(0, [[11]], [len(ids)])
        beside = crowded.forward(0, [[11], [12], [13, 14, 15]], [len(ids), len(other), 1])
        assert torch.equal(after[0], beside[0])
        kernels = cpu_kernels()
        assert kernels is not None
        try:  # the AVX2 path computes the same bits
            kernels.use_avx512(False)
            narrow = DecoderRunner(model, slots=4, context_length=512)
            narrow.forward(0, [ids, other, [3]], [0, 0, 0])
            assert torch.equal(
                narrow.forward(0, [[11], [12], [13, 14, 15]], [len(ids), len(other), 1]), beside
            )
        finally:
            kernels.use_avx512(True)


def test_gguf_is_the_default_for_a_gguf_whose_blocks_the_kernels_run(tmp_path) -> None:
    assert default_quantize(smollm2_gguf_path()) == "gguf"
    assert default_quantize(tmp_path) == "int8-weights"  # a model directory


def test_gguf_needs_a_gguf_file(tmp_path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="not a .gguf file"):
        load_model(tmp_path, quantize="gguf", progress=False)


def test_without_the_kernels_gguf_is_not_the_default_and_is_refused(monkeypatch) -> None:
    """The blocks run on the compiled kernels only (no torch fallback multiplies them)."""
    from thinkstruct.engine.weights import gguf_weights

    monkeypatch.setattr(gguf_weights, "cpu_kernels", lambda: None)
    assert default_quantize(smollm2_gguf_path()) == "int8-weights"
    with pytest.raises(ValueError, match="runs on the compiled kernels"):
        gguf_weights.quantize_gguf(torch.nn.Linear(32, 16), smollm2_gguf_path())
