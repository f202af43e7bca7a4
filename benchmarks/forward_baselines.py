"""What a model costs with no engine around it: the baselines the engine is measured against.

For a :class:`~thinkstruct.engine.LoadedModel`:

- **bare forward** (:func:`bare_forward`): the batched prompt set left-padded and
  prefilled in one forward, then greedy decoding for ``new_tokens`` steps with
  transformers' ``DynamicCache``, argmax only, logits of the last position only. No
  scheduler, sampling, grammar, detokenization or streaming: the machine's limit for this
  model, dtype and batch.
- **transformers generate()** (:func:`transformers_generate`): the same prompts, left
  padding, greedy, exactly ``new_tokens`` per row (``min_new_tokens`` keeps EOS from
  ending a row early, as the bare loop ignores it).
- **greedy agreement** (:func:`greedy_agreement`): two models (int8 against bf16) decode
  the same chat prompts greedily, batch 1, up to ``new_tokens`` or EOS: the share of
  identical completions and of tokens before the first divergence.

Tokens/s counts generated tokens over wall time, prefill included (the engine's closed
loop counts the same way); :class:`ForwardTiming` also gives the decode-only rate.

``python benchmarks/forward_baselines.py`` prints both tables for bf16, fp32 and int8 on
the embedded SmolLM2 (``--variants`` adds ``int8w``, int8 weights, and ``gguf``, the
file's own Q4_1/Q8_0 blocks: against fp32, the float32 model transformers dequantizes from
the same file, gguf should be that model up to its int16 activations' rounding and float
summation order). Each (variant, side) cell runs alone on the machine: its own process,
started after the machine is quiet and ended before the next (``alone.py``), the cells'
order rotating round by round; a cell is the median over rounds. The agreement tables
(no timing) load every variant in one more process. It asserts nothing.

    python benchmarks/forward_baselines.py [--model PATH] [--variants bf16 int8 fp32]
        [--new-tokens 32] [--rounds 3] [--threads N] [--agreement-prompts 16]

Threads: torch's default (one per core) unless ``--threads``. libgomp's default wait
policy spins; when anything else wants the cores (another process, the engine's grammar
threads) two spinning OpenMP threads collapse (measured 6-30x slower here on 2 shared
cores); ``OMP_WAIT_POLICY=PASSIVE`` in the environment before Python starts avoids it.
The workers run with PASSIVE (as ``thinkstruct serve``) unless the environment sets the
policy; the header prints the policy in force.
"""

from __future__ import annotations

import argparse
import inspect
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

if TYPE_CHECKING:
    from thinkstruct.engine.model.loading import LoadedModel

# Eight timing prompts of different lengths (batch 1 uses the first); sixteen for agreement.
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue.",
    "List three uses of a paperclip.",
    "What is 17 times 23? Show your working.",
    "Give me a short recipe for pancakes.",
    "Translate 'good morning, how are you?' into Spanish and German.",
    "Summarize the plot of Romeo and Juliet in a few sentences.",
    "Name four planets of the solar system and one fact about each.",
    "How do I reverse a list in Python?",
    "What causes the seasons on Earth?",
    "Suggest a name for a small bakery and explain it.",
    "Describe a cat to someone who has never seen one.",
    "What is the difference between weather and climate?",
    "Write a polite email declining a meeting invitation.",
    "Why do we need sleep?",
]


def chat_prompt_ids(loaded: LoadedModel, question: str) -> list[int]:
    """``question`` as one user turn, rendered with the model's chat template, thinking off."""
    from thinkstruct.parsers import render_chat

    prompt = render_chat(
        [{"role": "user", "content": question}],
        family=loaded.family,
        tokenizer=loaded.tokenizer,
        chat_template=loaded.chat_template,
        chat_template_kwargs={"enable_thinking": False} if loaded.family.switch else None,
    )
    return loaded.tokenizer.hf.encode(prompt.text, add_special_tokens=False)


@dataclass(frozen=True)
class ForwardTiming:
    """One timed run over one batch.

    Attributes:
        batch: rows in the batch.
        new_tokens: tokens generated per row.
        total_s: wall seconds from the prefill's start to the last token.
        prefill_s: wall seconds of the prefill forward (first token included); ``None``
            where the run does not expose it (``generate()``).
        tokens: the generated ids, ``[batch][new_tokens]``.
    """

    batch: int
    new_tokens: int
    total_s: float
    prefill_s: float | None
    tokens: list[list[int]]

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens over wall time, prefill included."""
        return self.batch * self.new_tokens / self.total_s

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens after the first over the decode steps' wall time (the steady rate)."""
        if self.prefill_s is None or self.new_tokens < 2:
            return None
        return self.batch * (self.new_tokens - 1) / (self.total_s - self.prefill_s)


def _pad_id(loaded: LoadedModel) -> int:
    hf = loaded.tokenizer.hf
    return int(hf.pad_token_id if hf.pad_token_id is not None else loaded.tokenizer.eos_token_ids[0])


def _left_padded(prompts: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(list(prompt), dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    return ids, mask


def _cache_keyword(model: Any) -> str:
    # transformers 5.x renames past_key_values to cache
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def bare_forward(loaded: LoadedModel, prompts: Sequence[Sequence[int]], *, new_tokens: int) -> ForwardTiming:
    """Prefill ``prompts`` as one left-padded batch, then ``new_tokens`` greedy steps.

    Every row runs all ``new_tokens`` steps (EOS is not special), as a full batch would.
    """
    from transformers import DynamicCache

    model = loaded.model
    ids, mask = _left_padded(prompts, _pad_id(loaded))
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    kw = _cache_keyword(model)
    out: list[torch.Tensor] = []
    with torch.inference_mode():
        started = time.perf_counter()
        logits = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{kw: cache},
        ).logits
        token = logits[:, -1].argmax(-1)
        out.append(token)
        prefilled = time.perf_counter()
        position = positions[:, -1:]
        for _ in range(new_tokens - 1):
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
            position = position + 1
            logits = model(
                input_ids=token[:, None],
                attention_mask=mask,
                position_ids=position,
                use_cache=True,
                logits_to_keep=1,
                **{kw: cache},
            ).logits
            token = logits[:, -1].argmax(-1)
            out.append(token)
        finished = time.perf_counter()
    tokens = torch.stack(out, dim=1).tolist()
    return ForwardTiming(len(prompts), new_tokens, finished - started, prefilled - started, tokens)


def transformers_generate(
    loaded: LoadedModel, prompts: Sequence[Sequence[int]], *, new_tokens: int
) -> ForwardTiming:
    """``model.generate()`` on the left-padded batch: greedy, exactly ``new_tokens`` per row."""
    from transformers import GenerationConfig

    pad = _pad_id(loaded)
    ids, mask = _left_padded(prompts, pad)
    config = GenerationConfig(
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=pad,
        eos_token_id=list(loaded.tokenizer.eos_token_ids),
    )
    with torch.inference_mode():
        started = time.perf_counter()
        sequences = loaded.model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        finished = time.perf_counter()
    tokens = sequences[:, ids.shape[1] :].tolist()
    return ForwardTiming(len(prompts), new_tokens, finished - started, None, tokens)


def runner_loop(loaded: LoadedModel, prompts: Sequence[Sequence[int]], *, new_tokens: int) -> ForwardTiming:
    """The engine's own model runner (:func:`~thinkstruct.engine.runners.decoder_runner.default_runner`,
    the Llama runner for SmolLM2) in a bare loop: the prompts prefilled in one pass, then
    greedy decoding, argmax only: no scheduler, sampling, grammar or streaming. What the
    engine's forward passes cost; the engine's distance from it is its own overhead.
    (``loaded``'s q/k/v and gate/up weights become views of fused ones: the same values.)"""
    from thinkstruct.engine.runners.decoder_runner import default_runner

    context = max(len(p) for p in prompts) + new_tokens
    runner = default_runner(
        loaded.model, slots=len(prompts), context_length=context, vocab_size=loaded.tokenizer.vocab_size
    )
    out: list[list[int]] = [[] for _ in prompts]
    with torch.inference_mode():
        started = time.perf_counter()
        tokens = runner.forward(0, prompts, [0] * len(prompts)).argmax(-1).tolist()
        prefilled = time.perf_counter()
        lengths = [len(p) for p in prompts]
        for step in range(new_tokens):
            for row, token in enumerate(tokens):
                out[row].append(token)
            if step == new_tokens - 1:
                break
            tokens = runner.forward(0, [[t] for t in tokens], lengths).argmax(-1).tolist()
            lengths = [n + 1 for n in lengths]
        finished = time.perf_counter()
    return ForwardTiming(len(prompts), new_tokens, finished - started, prefilled - started, out)


def runner_loop_tokens_per_s(
    loaded: LoadedModel, prompts: Sequence[Sequence[int]], *, new_tokens: int = 64
) -> float:
    """:func:`runner_loop`'s generated tokens per second, prefill included."""
    return runner_loop(loaded, prompts, new_tokens=new_tokens).tokens_per_s


def bare_forward_tokens_per_s(
    loaded: LoadedModel, prompts: Sequence[Sequence[int]], *, new_tokens: int = 64
) -> float:
    """:func:`bare_forward`'s generated tokens per second, prefill included."""
    return bare_forward(loaded, prompts, new_tokens=new_tokens).tokens_per_s


def generate_tokens_per_s(
    loaded: LoadedModel, prompts: Sequence[Sequence[int]], *, new_tokens: int = 64
) -> float:
    """:func:`transformers_generate`'s generated tokens per second."""
    return transformers_generate(loaded, prompts, new_tokens=new_tokens).tokens_per_s


# ---- greedy agreement -------------------------------------------------------------------------


@dataclass(frozen=True)
class Agreement:
    """How often ``candidate`` decodes greedily what ``reference`` does.

    Attributes:
        prompts: prompts compared.
        identical: completions identical token for token (up to EOS or the limit).
        prefix_share: tokens before the first divergence over the longer completion's
            length, averaged over prompts (1.0 = identical).
        position_share: positions holding the same token over the longer length, averaged
            (counts agreement that resumes after a divergence, which is mostly luck).
        first_divergence: the index of each prompt's first differing token (``None`` when identical).
    """

    prompts: int
    identical: int
    prefix_share: float
    position_share: float
    first_divergence: tuple[int | None, ...]

    def __str__(self) -> str:
        return (
            f"{self.identical}/{self.prompts} identical completions, "
            f"{self.prefix_share:.1%} of tokens before the first divergence, "
            f"{self.position_share:.1%} position-wise"
        )


def greedy_completion(loaded: LoadedModel, prompt: Sequence[int], *, new_tokens: int) -> list[int]:
    """Greedy tokens for one prompt (batch 1) until EOS (included) or ``new_tokens``."""
    from transformers import DynamicCache

    eos = set(loaded.tokenizer.eos_token_ids)
    cache = DynamicCache()
    kw = _cache_keyword(loaded.model)
    ids = torch.tensor([list(prompt)])
    out: list[int] = []
    with torch.inference_mode():
        for _ in range(new_tokens):
            logits = loaded.model(input_ids=ids, use_cache=True, logits_to_keep=1, **{kw: cache}).logits
            token = int(logits[0, -1].argmax())
            out.append(token)
            if token in eos:
                break
            ids = torch.tensor([[token]])
    return out


def greedy_agreement(
    candidate: LoadedModel, reference: LoadedModel, prompts: Sequence[Sequence[int]], *, new_tokens: int = 64
) -> Agreement:
    """Greedy agreement of ``candidate`` with ``reference`` over ``prompts`` (token ids of
    the same tokenizer), ``new_tokens`` at most each."""
    return compare_completions(
        [greedy_completion(candidate, p, new_tokens=new_tokens) for p in prompts],
        [greedy_completion(reference, p, new_tokens=new_tokens) for p in prompts],
    )


def compare_completions(candidate: Sequence[Sequence[int]], reference: Sequence[Sequence[int]]) -> Agreement:
    """The :class:`Agreement` of two lists of completions of the same prompts."""
    identical = 0
    prefix: list[float] = []
    position: list[float] = []
    divergence: list[int | None] = []
    for a_seq, b_seq in zip(candidate, reference, strict=True):
        a, b = list(a_seq), list(b_seq)
        longest = max(len(a), len(b))
        same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        identical += a == b
        divergence.append(None if a == b else same)
        prefix.append(same / longest if longest else 1.0)
        position.append(sum(x == y for x, y in zip(a, b)) / longest if longest else 1.0)
    return Agreement(
        len(divergence), identical, statistics.fmean(prefix), statistics.fmean(position), tuple(divergence)
    )


@dataclass(frozen=True)
class TeacherForced:
    """``candidate``'s next-token predictions along ``reference``'s own greedy answers.

    Attributes:
        positions: answer tokens scored.
        top1: share of positions where both models' argmax agree.
        kl: mean KL(reference || candidate) per position, in nats.
    """

    positions: int
    top1: float
    kl: float

    def __str__(self) -> str:
        return f"top-1 {self.top1:.1%}, KL {self.kl:.4f} nats over {self.positions} positions"


def teacher_forced(
    candidate: LoadedModel,
    reference: LoadedModel,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
) -> TeacherForced:
    """Score ``candidate`` on ``reference``'s completions (one forward per prompt).

    Unlike greedy agreement, one early difference does not make every later token count
    as a miss: each position is scored on the same prefix.
    """
    same = total = 0
    kl = 0.0
    with torch.inference_mode():
        for prompt, completion in zip(prompts, completions, strict=True):
            if not completion:
                continue
            ids = torch.tensor([[*prompt, *completion]])
            span = slice(len(prompt) - 1, len(prompt) + len(completion) - 1)
            ref = reference.model(input_ids=ids).logits[0, span].float().log_softmax(-1)
            cand = candidate.model(input_ids=ids).logits[0, span].float().log_softmax(-1)
            same += int((ref.argmax(-1) == cand.argmax(-1)).sum())
            total += len(completion)
            kl += float(torch.nn.functional.kl_div(cand, ref, log_target=True, reduction="sum"))
    return TeacherForced(total, same / max(total, 1), kl / max(total, 1))


# ---- the table ---------------------------------------------------------------------------------

VARIANTS = {
    "bf16": ("bfloat16", None),
    "fp32": ("float32", None),
    "int8": ("float32", "int8"),
    "int8w": ("float32", "int8-weights"),
    "gguf": ("float32", "gguf"),  # the GGUF's own blocks (a .gguf model only)
}


def _load(job: dict[str, Any]) -> LoadedModel:
    from thinkstruct.engine import load_model

    if job["threads"]:
        torch.set_num_threads(job["threads"])
    dtype, quantize = VARIANTS[job["variant"]]
    return load_model(job["model"], dtype=dtype, quantize=quantize, progress=False)


def timing_worker(job: dict[str, Any]) -> dict[str, Any]:
    """One side alone: ``job["side"]`` (``bare`` or ``generate``) on ``job["variant"]``,
    warmed up, then timed once at every batch size in ``job["batches"]``."""
    run = {"bare": bare_forward, "generate": transformers_generate}[job["side"]]
    loaded = _load(job)
    prompts = [chat_prompt_ids(loaded, q) for q in QUESTIONS[: max(job["batches"])]]
    run(loaded, prompts[:1], new_tokens=2)  # warm-up: first forwards page weights in and pick kernels
    rows = {}
    for batch in job["batches"]:
        timing = run(loaded, prompts[:batch], new_tokens=job["new_tokens"])
        rows[str(batch)] = {
            "tokens_per_s": timing.tokens_per_s,
            "decode_tokens_per_s": timing.decode_tokens_per_s,
            "prefill_s": timing.prefill_s,
            "prompt_tokens": sum(len(p) for p in prompts[:batch]),
        }
    return {
        "rows": rows,
        "name": loaded.name,
        "load_s": loaded.load_seconds,
        "threads": torch.get_num_threads(),
        "capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
    }


def agreement_worker(job: dict[str, Any]) -> dict[str, Any]:
    """Greedy agreement and teacher-forced scores between ``job["variants"]`` (no timing:
    every variant in this one process)."""
    models = {label: _load({**job, "variant": label}) for label in job["variants"]}
    first = next(iter(models.values()))
    prompts = [chat_prompt_ids(first, q) for q in QUESTIONS[: job["prompts"]]]
    completions = {
        label: [greedy_completion(m, p, new_tokens=job["tokens"]) for p in prompts]
        for label, m in models.items()
    }
    lines = [
        f"\n# greedy agreement, {len(prompts)} chat prompts, up to {job['tokens']} tokens or EOS, batch 1"
    ]
    order = list(VARIANTS)
    for reference in order:
        for candidate in order:
            if (
                reference in completions
                and candidate in completions
                and order.index(candidate) > order.index(reference)
            ):
                lines.append(f"{candidate} vs {reference}: {compare_completions(completions[candidate], completions[reference])}")  # fmt: skip
    reference = "fp32" if "fp32" in models else order[0]
    lines.append(f"\n# teacher-forced on {reference}'s answers to the same prompts")
    for label, loaded in models.items():
        if label != reference and reference in models:
            lines.append(f"{label} vs {reference}: {teacher_forced(loaded, models[reference], prompts, completions[reference])}")  # fmt: skip
    if "int8" in models:
        kept = models["int8"].float_modules
        lines.append(f"# int8 keeps {len(kept)} Linear layers in float32 (outlier inputs): {', '.join(kept)}")
    return {"lines": lines}


WORKERS = {"timing": timing_worker, "agreement": agreement_worker}


def main(argv: Sequence[str] | None = None) -> None:
    import alone

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", default=None, help="a model directory or .gguf (default: the embedded SmolLM2)"
    )
    parser.add_argument("--variants", nargs="+", default=["bf16", "int8", "fp32"], choices=sorted(VARIANTS))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--new-tokens", type=int, default=32, help="decode steps per timed run")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every cell, sides in rotating order")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--agreement-prompts", type=int, default=16, help="0 skips the agreement table")
    parser.add_argument("--agreement-tokens", type=int, default=64)
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    alone.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.worker:
        alone.worker_main(WORKERS[args.worker])
        return
    rule = alone.quiet_rule(args)
    env = {"OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}

    def worker(name: str, kind: str) -> alone.Worker:
        argv = [sys.executable, os.path.abspath(__file__), "--worker", kind]
        return alone.Worker(name, argv, rule=rule if kind == "timing" else alone.UNTIMED, env=env)

    print(alone.header())
    base = {"model": args.model, "threads": args.threads}
    cells = [(variant, side) for variant in args.variants for side in ("bare", "generate")]
    results: dict[tuple[str, str], list[dict[str, Any]]] = {cell: [] for cell in cells}
    runs = []
    for r in range(args.rounds):
        for variant, side in alone.rotation(cells, r):
            job = {
                **base,
                "variant": variant,
                "side": side,
                "batches": args.batches,
                "new_tokens": args.new_tokens,
            }
            result, run = worker(f"{variant} {side}", "timing").run(job)
            results[variant, side].append(result)
            runs.append(run)
        print(alone.round_report(r + 1, runs[-len(cells) :]), flush=True)
    first = results[cells[0]][0]
    print(
        f"# forward baselines: {first['name']}, torch {first['torch']}, {first['threads']} threads, "
        f"OMP_WAIT_POLICY={env['OMP_WAIT_POLICY']}, CPU capability {first['capability']}"
    )
    loads = ", ".join(f"{v} {results[v, 'bare'][0]['load_s']:.1f} s" for v in args.variants)
    print(f"# load: {loads}")
    print(
        f"# {args.new_tokens} new tokens per row, median of {args.rounds} rounds (each cell its own process,"
        " alone), tokens/s incl. prefill\n"
    )
    header = f"{'variant':8} {'batch':>5} {'prompt tok':>10} {'bare tok/s':>10} {'(decode)':>9} {'prefill s':>9} {'generate() tok/s':>16} {'gen/bare':>8}"
    print(header)
    print("-" * len(header))
    for variant in args.variants:
        for batch in map(str, args.batches):
            bare = [x["rows"][batch] for x in results[variant, "bare"]]
            gen = [x["rows"][batch] for x in results[variant, "generate"]]
            bare_tps = statistics.median(t["tokens_per_s"] for t in bare)
            gen_tps = statistics.median(t["tokens_per_s"] for t in gen)
            print(
                f"{variant:8} {batch:>5} {bare[0]['prompt_tokens']:10d} {bare_tps:10.1f} "
                f"{statistics.median(t['decode_tokens_per_s'] or 0.0 for t in bare):9.1f} "
                f"{statistics.median(t['prefill_s'] or 0.0 for t in bare):9.3f} {gen_tps:16.1f} {gen_tps / bare_tps:8.2f}"
            )
    if args.agreement_prompts and len(args.variants) > 1:
        job = {
            **base,
            "variants": args.variants,
            "prompts": args.agreement_prompts,
            "tokens": args.agreement_tokens,
        }
        agreement, _ = worker("agreement", "agreement").run(job)
        print("\n".join(agreement["lines"]))
    print(alone.summary(runs))


if __name__ == "__main__":
    main()
