"""Small GGUF files written with the ``gguf`` package, laid out as llama.cpp's converter
lays them out: :func:`write_gguf` (a transformers model, its tensors in float32 or in K
blocks, with a small byte-level BPE tokenizer)."""

from __future__ import annotations

from typing import Any


def byte_level_vocabulary(size: int) -> tuple[list[str], list[str]]:
    """A small byte-level BPE vocabulary of ``size`` tokens (259 to 331): the 256 bytes,
    merges of common pairs, ``<|endoftext|>`` and ``<think>``/``</think>``."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    spelling = bytes_to_unicode()
    tokens = [spelling[b] for b in range(256)]
    merges: list[str] = []
    pairs = [(a, b) for a in "etaoinsr" for b in "etaoinsr"] + [("Ġ", c) for c in "tashwiobmfc"]
    for a, b in pairs[: size - 256 - 3]:
        merges.append(f"{a} {b}")
        tokens.append(a + b)
    return [*tokens, "<|endoftext|>", "<think>", "</think>"], merges


def quantize_q4_k(weight: Any) -> Any:
    """``weight [rows, K]`` (float32, ``K % 256 == 0``) as Q4_K super-blocks ``[rows, K / 256
    * 144]`` uint8, ggml's layout: a plain quantizer (each 32's min and max; llama.cpp's
    searches further), enough for a file whose blocks are Q4_K (``gguf`` quantizes none)."""
    import numpy as np

    rows, k = weight.shape
    sub = weight.reshape(rows, k // 256, 8, 32).astype(np.float32)
    low, high = np.minimum(sub.min(-1), 0), np.maximum(sub.max(-1), 0)
    d = ((high - low) / 15).max(-1, keepdims=True) / 63
    dmin = (-low).max(-1, keepdims=True) / 63
    d, dmin = d.astype(np.float16), dmin.astype(np.float16)
    df, mf = d.astype(np.float32), dmin.astype(np.float32)
    sc = np.clip(np.round((high - low) / 15 / np.where(df > 0, df, 1)), 0, 63).astype(np.uint8)
    mn = np.clip(np.round(-low / np.where(mf > 0, mf, 1)), 0, 63).astype(np.uint8)
    step, offset = (df * sc)[..., None], (mf * mn)[..., None]
    q = np.clip(np.round((sub + offset) / np.where(step > 0, step, 1)), 0, 15).astype(np.uint8)
    scales = np.concatenate(
        [
            sc[..., :4] | ((sc[..., 4:] >> 4) << 6),
            mn[..., :4] | ((mn[..., 4:] >> 4) << 6),
            (sc[..., 4:] & 15) | ((mn[..., 4:] & 15) << 4),
        ],
        axis=-1,
    )
    pairs = q.reshape(rows, k // 256, 4, 2, 32)  # sub-blocks 2j (low nibbles), 2j + 1 (high)
    nibbles = (pairs[:, :, :, 0] | (pairs[:, :, :, 1] << 4)).reshape(rows, k // 256, 128)
    head = np.concatenate([d.view(np.uint8), dmin.view(np.uint8)], axis=-1)
    return np.concatenate([head, scales, nibbles], axis=-1).reshape(rows, -1)


def quantize_q6_k(weight: Any) -> Any:
    """``weight [rows, K]`` (float32, ``K % 256 == 0``) as Q6_K super-blocks ``[rows, K / 256
    * 210]`` uint8, ggml's layout (a plain quantizer: each 16's largest magnitude)."""
    import numpy as np

    rows, k = weight.shape
    n = k // 256
    sub = weight.reshape(rows, n, 16, 16).astype(np.float32)
    scale = np.abs(sub).max(-1) / 31
    d = (scale.max(-1, keepdims=True) / 127).astype(np.float16)
    sc = np.clip(np.round(scale / np.where(d > 0, d.astype(np.float32), 1)), -128, 127).astype(np.int8)
    step = (d.astype(np.float32) * sc)[..., None]
    q = (np.clip(np.round(sub / np.where(step > 0, step, 1)), -32, 31) + 32).astype(np.uint8)
    q = q.reshape(rows, n, 2, 4, 32)  # element 128 h + 32 j + l
    ql = np.concatenate(
        [q[:, :, :, 0] & 15 | (q[:, :, :, 2] & 15) << 4, q[:, :, :, 1] & 15 | (q[:, :, :, 3] & 15) << 4],
        axis=-1,
    )
    qh = sum((q[:, :, :, j] >> 4) << (2 * j) for j in range(4)).astype(np.uint8)
    return np.concatenate(
        [ql.reshape(rows, n, 128), qh.reshape(rows, n, 64), sc.view(np.uint8), d.view(np.uint8)], axis=-1
    ).reshape(rows, -1)


def write_gguf(model: Any, path: Any, arch: str, *, k_quants: bool = False, down: str | None = None) -> None:
    """``model`` (float32) as a GGUF file of ``arch`` with its tokenizer, as llama.cpp's
    converter lays it out (tensor names from gguf-py's map; Llama's q/k rows permuted);
    ``k_quants``: its Linear weights (every 2-D tensor but the token embeddings) in K
    blocks as a Q4_K_M file has them: Q6_K for v, down and the output layer, else Q4_K;
    ``down``: the down projections in that type instead (one ``gguf`` quantizes)."""
    import gguf

    config = model.config
    tokens, merges = byte_level_vocabulary(config.vocab_size)
    writer = gguf.GGUFWriter(str(path), arch=arch)
    writer.add_name(f"tiny-{arch}")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_embedding_length(config.hidden_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_vocab_size(config.vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.NORMAL] * (len(tokens) - 3) + [gguf.TokenType.CONTROL] * 3)
    writer.add_token_merges(merges)
    writer.add_eos_token_id(len(tokens) - 3)
    writer.add_pad_token_id(len(tokens) - 3)  # (Phi-3's config defaults to 32000, past this vocabulary)
    arch_enum = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    names = gguf.get_tensor_name_map(arch_enum, config.num_hidden_layers)
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    for hf_name, tensor in model.state_dict().items():
        base, _, suffix = hf_name.rpartition(".")
        data = tensor.detach().float().numpy()
        if arch == "llama" and base.endswith(("q_proj", "k_proj")):
            n = heads if base.endswith("q_proj") else kv_heads
            data = (
                data.reshape(n, 2, data.shape[0] // n // 2, *data.shape[1:])
                .swapaxes(1, 2)
                .reshape(data.shape)
            )
        name = f"{names.get_name(base)}.{suffix}"
        if down is not None and name.endswith("ffn_down.weight"):
            kind = gguf.GGMLQuantizationType[down]
            writer.add_tensor(name, gguf.quants.quantize(data, kind), raw_dtype=kind)
        elif k_quants and data.ndim == 2 and not name.startswith("token_embd"):
            if name.startswith(("output", "blk.")) and name.split(".")[-2] in (
                "attn_v",
                "ffn_down",
                "output",
            ):
                writer.add_tensor(name, quantize_q6_k(data), raw_dtype=gguf.GGMLQuantizationType.Q6_K)
            else:
                writer.add_tensor(name, quantize_q4_k(data), raw_dtype=gguf.GGMLQuantizationType.Q4_K)
        else:
            writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
