"""What keeping the KV cache in float16 changes in the answers: the embedded model on the
decoder runner (its GGUF blocks, as ``thinkstruct serve`` loads it) decodes the same chat
prompts greedily with keys and values in float16 and in float32, batch 1, up to
``--new-tokens`` or EOS, and the completions are compared token for token (identical
ones, the share of tokens before the first divergence, where each diverges), with the
largest difference between the two runners' logits along the float32 answers
(teacher-forced: both fed the same tokens).

    python benchmarks/kv_dtype.py [--prompts 16] [--new-tokens 128]

It asserts nothing; the timing of a decoding step with either cache is
``batch_kernels.py --kv-cache-dtype float16 float32``.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as serve sets it; before torch loads

import torch

from forward_baselines import QUESTIONS, chat_prompt_ids, compare_completions
from thinkstruct.engine.assembly import EngineSpec
from thinkstruct.engine.model.loading import load_model
from thinkstruct.engine.runners.decoder_runner import DecoderRunner


def greedy(runner: DecoderRunner, prompt: list[int], *, new_tokens: int, eos: set[int]) -> list[int]:
    """``runner``'s greedy completion of ``prompt`` in slot 0, up to ``new_tokens`` or EOS."""
    out: list[int] = []
    logits = runner.forward(0, [prompt], [0])[0]
    while len(out) < new_tokens:
        token = int(logits.argmax())
        out.append(token)
        if token in eos:
            break
        logits = runner.forward(0, [[token]], [len(prompt) + len(out) - 1])[0]
    return out


def logit_gap(runners: list[DecoderRunner], prompt: list[int], answer: list[int]) -> float:
    """The largest difference between the runners' logits over ``prompt`` then ``answer``
    fed token by token (each runner the same tokens)."""
    gap = 0.0
    steps = [runner.forward(0, [prompt], [0])[0] for runner in runners]
    for i, token in enumerate(answer):
        gap = max(gap, float((steps[0] - steps[1]).abs().max()))
        steps = [runner.forward(0, [[token]], [len(prompt) + i])[0] for runner in runners]
    return gap


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompts", type=int, default=len(QUESTIONS), help=f"at most {len(QUESTIONS)}")
    parser.add_argument("--new-tokens", type=int, default=128)
    args = parser.parse_args()
    loaded = load_model(quantize=EngineSpec().quantize, progress=False)
    eos = set(loaded.tokenizer.eos_token_ids)
    runners = {
        name: DecoderRunner(
            loaded.model,
            slots=1,
            context_length=2048,
            vocab_size=loaded.tokenizer.vocab_size,
            kv_cache_dtype=dtype,
        )
        for name, dtype in (("float16", torch.float16), ("float32", torch.float32))
    }
    prompts = [chat_prompt_ids(loaded, q) for q in QUESTIONS[: args.prompts]]
    with torch.inference_mode():
        answers = {
            name: [greedy(r, p, new_tokens=args.new_tokens, eos=eos) for p in prompts]
            for name, r in runners.items()
        }
        gap = max(
            logit_gap(list(runners.values()), p, a) for p, a in zip(prompts, answers["float32"], strict=True)
        )
    agreement = compare_completions(answers["float16"], answers["float32"])
    print(
        f"# embedded model, greedy, {len(prompts)} chat prompts, {args.new_tokens} tokens at most; "
        f"KV cache float16 against float32"
    )
    print(agreement)
    print(f"largest logit difference along the float32 answers: {gap:.4f}")
    print("# python benchmarks/kv_dtype.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
