"""The slot KV cache runners against transformers' own forward pass.

Whatever the schedule — rows joining into free slots, feeding one token or several in a
pass, next to rows of other lengths, moved to another slot when a row before them
leaves — each row's logits must be those of running its whole token sequence alone
through the plain model. Both runners (transformers' modules on the slot cache, and the
decoder runner's own fused computation) are held to it.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kv_reference import kv_dtype_of, reference_logits, tolerance

from thinkstruct.engine.kernels.cpu_kernels import cpu_kernels
from thinkstruct.engine.kv.blocks import PagedKvCache
from thinkstruct.engine.runners.decoder_runner import DecoderRunner, supports
from thinkstruct.engine.runners.runner import ModelRunner, TransformersRunner

SLOTS = 4


class TorchOpsRunner(DecoderRunner):
    """The decoder runner without its compiled kernels (what runs where they cannot)."""

    def __init__(self, model, **kwargs) -> None:
        super().__init__(model, kernels=False, **kwargs)


class StackedInt8Runner(DecoderRunner):
    """The decoder runner on a copy of the model with int8 weights: every layer of a pass in
    one kernel call. Its reference is that quantized model run by transformers."""

    def __init__(self, model, **kwargs) -> None:
        super().__init__(_int8_weights_copy(model), **kwargs)
        assert self.stacked


RUNNERS = [TransformersRunner, DecoderRunner, TorchOpsRunner, StackedInt8Runner]
runners = pytest.mark.parametrize("runner_class", RUNNERS, ids=lambda c: c.__name__)

_quantized: dict[int, torch.nn.Module] = {}


def _int8_weights_copy(model):
    """One int8-weight copy of ``model`` per test run (the runner's and the reference's)."""
    if id(model) not in _quantized:
        import copy

        from thinkstruct.engine.weights.int8_weights import quantize_int8_weights

        quantized = copy.deepcopy(model)
        quantize_int8_weights(quantized)
        _quantized[id(model)] = quantized
    return _quantized[id(model)]


def plain_model(tiny_model, runner_class: type[ModelRunner]):
    """What the runner's logits are held to: the model it computes, run by transformers."""
    model = tiny_model.model
    return _int8_weights_copy(model) if runner_class is StackedInt8Runner else model


def _runner(tiny_model, runner_class: type[ModelRunner] = TransformersRunner) -> ModelRunner:
    runner = runner_class(tiny_model.model, slots=SLOTS, context_length=tiny_model.context_length)  # type: ignore[call-arg]
    if runner_class in (
        DecoderRunner,
        StackedInt8Runner,
    ):  # the tiny model's float32 sizes fit the kernels
        assert runner.compiled
    return runner


@runners
def test_rows_of_different_lengths_match_the_plain_model(tiny_model, runner_class) -> None:
    runner = _runner(tiny_model, runner_class)
    plain = plain_model(tiny_model, runner_class)
    rows = [[5, 6, 7], [100, 200], [9, 8, 7, 6, 5, 4, 3]]
    with torch.inference_mode():
        for slot, ids in enumerate(rows):
            got = runner.forward(slot, [ids], [0])[0]
            torch.testing.assert_close(
                got, reference_logits(plain, ids, kv_dtype_of(runner)), **tolerance(kv_dtype_of(runner))
            )
        # One pass: row 0 feeds one token, row 1 three (a sampled token plus forced ones),
        # row 2 two, each from its own position.
        feeds = [[11], [12, 13, 14], [15, 16]]
        got = runner.forward(0, feeds, [len(r) for r in rows])
    for i, (ids, feed) in enumerate(zip(rows, feeds)):
        torch.testing.assert_close(
            got[i], reference_logits(plain, ids + feed, kv_dtype_of(runner)), **tolerance(kv_dtype_of(runner))
        )


@runners
def test_a_row_moved_to_another_slot_keeps_its_cache(tiny_model, runner_class) -> None:
    runner = _runner(tiny_model, runner_class)
    with torch.inference_mode():
        runner.forward(2, [[1, 2, 3, 4]], [0])
        runner.copy_slot(2, 0, 4)
        got = runner.forward(0, [[5]], [4])[0]
    torch.testing.assert_close(
        got,
        reference_logits(plain_model(tiny_model, runner_class), [1, 2, 3, 4, 5], kv_dtype_of(runner)),
        **tolerance(kv_dtype_of(runner)),
    )


@runners
def test_buffers_grow_past_the_initial_capacity(tiny_model, runner_class) -> None:
    runner = _runner(tiny_model, runner_class)
    ids = [(i * 7919) % 5000 + 10 for i in range(300)]  # longer than INITIAL_CAPACITY
    with torch.inference_mode():
        runner.forward(0, [ids[:200]], [0])
        got = runner.forward(0, [ids[200:]], [200])[0]
    cache = runner.cache
    if isinstance(cache, PagedKvCache):  # blocks, not a capacity: the slot holds all 300 positions
        assert len(cache.blocks_of(0)) * cache.block_tokens >= 300
    else:
        assert cache.capacity >= 300
    torch.testing.assert_close(
        got,
        reference_logits(plain_model(tiny_model, runner_class), ids, kv_dtype_of(runner)),
        **tolerance(kv_dtype_of(runner)),
    )


token = st.integers(min_value=2, max_value=120_000)


@runners
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_schedule_matches_the_plain_model(tiny_model, runner_class, data) -> None:
    """A random schedule of joins, multi-token feeds and leaves (with compaction)."""
    runner = _runner(tiny_model, runner_class)
    plain = plain_model(tiny_model, runner_class)
    live: list[list[int]] = []  # live[slot] = the tokens that slot holds
    with torch.inference_mode():
        for _ in range(data.draw(st.integers(2, 6), label="rounds")):
            action = data.draw(st.sampled_from(["join", "step", "leave"]))
            if action == "join" and len(live) < SLOTS:
                ids = data.draw(st.lists(token, min_size=1, max_size=12), label="prompt")
                got = runner.forward(len(live), [ids], [0])[0]
                live.append(ids)
                torch.testing.assert_close(
                    got, reference_logits(plain, ids, kv_dtype_of(runner)), **tolerance(kv_dtype_of(runner))
                )
            elif action == "leave" and live:
                gone = data.draw(st.integers(0, len(live) - 1), label="leaving")
                last = len(live) - 1
                if gone != last:  # the scheduler moves the last row into the hole
                    runner.copy_slot(last, gone, len(live[last]))
                    live[gone] = live[last]
                live.pop()
            elif live:
                feeds = [data.draw(st.lists(token, min_size=1, max_size=4), label="feed") for _ in live]
                got = runner.forward(0, feeds, [len(r) for r in live])
                for i, feed in enumerate(feeds):
                    live[i] = live[i] + feed
                    torch.testing.assert_close(
                        got[i],
                        reference_logits(plain, live[i], kv_dtype_of(runner)),
                        **tolerance(kv_dtype_of(runner)),
                    )


@runners
def test_the_model_stays_correct_outside_the_runner(tiny_model, runner_class) -> None:
    """A runner may switch the model to its attention or make its weights views of fused
    ones; a padded batch run the ordinary way must still give each row its own logits."""
    _runner(tiny_model, runner_class)
    model = plain_model(tiny_model, runner_class)
    rows = [[3, 4, 5, 6], [7, 8]]
    ids = torch.tensor([rows[0], [1, 1, *rows[1]]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1].float()
    import copy

    plain = copy.deepcopy(model)
    plain.set_attn_implementation("sdpa")
    for i, row in enumerate(rows):
        torch.testing.assert_close(out[i], reference_logits(plain, row), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
def test_fused_int8_projections_compute_what_the_separate_layers_do(tiny_model, per_channel) -> None:
    """The decoder runner stacks a layer's q/k/v (and gate/up) int8 weights into one, each
    row keeping its part's scale: the logits equal those of the quantized model's own
    layers run one by one. (Rows of equal length: in a padded pass the runner quantizes
    only the real tokens, where transformers' layers also see the padding, and torch's
    dynamic int8 takes one input scale per tensor.)"""
    import copy
    import warnings

    from torch.ao.quantization import default_dynamic_qconfig, per_channel_dynamic_qconfig, quantize_dynamic

    model = copy.deepcopy(tiny_model.model)
    qconfig = per_channel_dynamic_qconfig if per_channel else default_dynamic_qconfig
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_dynamic(model, {torch.nn.Linear: qconfig}, dtype=torch.qint8, inplace=True)
    context = tiny_model.context_length
    separate = TransformersRunner(model, slots=2, context_length=context)
    # Keys and values in float32, as the transformers runner keeps them: the projections are the question.
    fused = DecoderRunner(model, slots=2, context_length=context, kv_cache_dtype=torch.float32)
    rows = [[5, 6, 7, 8, 9], [300, 400, 500, 600, 700]]
    with torch.inference_mode():
        expected = separate.forward(0, rows, [0, 0])
        got = fused.forward(0, rows, [0, 0])
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        expected = separate.forward(0, [[10, 13], [11, 12]], [5, 5])
        got = fused.forward(0, [[10, 13], [11, 12]], [5, 5])
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("compiled", [True, False], ids=["kernels", "torch"])
def test_fused_int8_weight_projections_compute_what_the_separate_layers_do(tiny_model, compiled) -> None:
    """The same for int8 weights (float activations): each stacked row keeps its weights
    and scale, and the logits are those of the quantized model's own layers run one by
    one, rows of any lengths."""
    import copy

    from thinkstruct.engine.weights.int8_weights import quantize_int8_weights

    model = copy.deepcopy(tiny_model.model)
    quantize_int8_weights(model, compiled=compiled)
    context = tiny_model.context_length
    separate = TransformersRunner(model, slots=2, context_length=context)
    # Keys and values in float32, as the transformers runner keeps them: the projections are the question.
    fused = DecoderRunner(model, slots=2, context_length=context, kv_cache_dtype=torch.float32)
    assert fused.compiled
    rows = [[5, 6, 7, 8, 9], [300, 400, 500]]
    with torch.inference_mode():
        torch.testing.assert_close(
            fused.forward(0, rows, [0, 0]), separate.forward(0, rows, [0, 0]), rtol=1e-4, atol=1e-4
        )
        feed = [[10, 13], [11]]
        torch.testing.assert_close(
            fused.forward(0, feed, [5, 3]), separate.forward(0, feed, [5, 3]), rtol=1e-4, atol=1e-4
        )


def test_with_int8_weights_a_rows_logits_do_not_depend_on_its_batch(tiny_model) -> None:
    """Bit for bit: with int8 weights on the compiled kernels every step of a row is
    computed from that row alone, so a row decoding alone and the same row beside others
    (a longer prompt prefilled beside it, then rows feeding several tokens) get the same
    logits, and a seeded request the same tokens whatever else the server runs."""
    import copy

    from thinkstruct.engine.weights.int8_weights import quantize_int8_weights

    model = copy.deepcopy(tiny_model.model)
    quantize_int8_weights(model)
    alone = DecoderRunner(model, slots=SLOTS, context_length=tiny_model.context_length)
    crowded = DecoderRunner(model, slots=SLOTS, context_length=tiny_model.context_length)
    ids = [5, 6, 7, 8, 9]
    with torch.inference_mode():
        first = alone.forward(0, [ids], [0])
        beside = crowded.forward(0, [ids, list(range(20, 37)), [3]], [0, 0, 0])
        assert torch.equal(first[0], beside[0])
        after = alone.forward(0, [[11]], [5])
        beside = crowded.forward(0, [[11], [12], [13, 14, 15]], [5, 17, 1])
        assert torch.equal(after[0], beside[0])
        # The AVX2 tiles (where a CPU lacks AVX-512) compute the same bits.
        kernels = cpu_kernels()
        assert kernels is not None
        try:
            kernels.use_avx512(False)
            narrow = DecoderRunner(model, slots=SLOTS, context_length=tiny_model.context_length)
            narrow.forward(0, [ids, list(range(20, 37)), [3]], [0, 0, 0])
            assert torch.equal(narrow.forward(0, [[11], [12], [13, 14, 15]], [5, 17, 1]), beside)
        finally:
            kernels.use_avx512(True)


@pytest.mark.parametrize("threads", [2, 5])
def test_a_pass_gives_the_same_bits_on_any_number_of_threads(tiny_model, threads) -> None:
    """The stacked pass's threads take its phases' chunks first come first served, so
    which thread computes what changes from pass to pass, and a preempted thread's
    chunks are taken by the others: 5 threads on this machine's cores are preempted all
    the time. Prefill (a long pass: norms in phases of their own) and decoding passes
    (each thread's own norms) must give the bits of one thread, every time."""
    model = _int8_weights_copy(tiny_model.model)
    feeds = [([list(range(3, 40)), [5, 6]], [0, 0]), ([[7], [8, 9, 10]], [37, 2]), ([[11], [12]], [38, 5])]

    def run(n: int) -> list[torch.Tensor]:
        runner = DecoderRunner(model, slots=SLOTS, context_length=tiny_model.context_length)
        assert runner.stacked
        before = torch.get_num_threads()
        torch.set_num_threads(n)
        try:
            with torch.inference_mode():
                return [runner.forward(0, ids, starts) for ids, starts in feeds]
        finally:
            torch.set_num_threads(before)

    one = run(1)
    for _ in range(5):
        for got, want in zip(run(threads), one, strict=True):
            assert torch.equal(got, want)


def _small_llama(**config: object):
    """A one-layer random Llama with 4 query heads over 2 key/value heads, vocabulary 300."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = {
        "vocab_size": 300,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        **config,
    }
    return LlamaForCausalLM(LlamaConfig(**config)).eval()


@pytest.mark.parametrize("avx512", [True, False], ids=["avx512", "avx2"])
def test_the_stacked_pass_and_the_kernel_by_kernel_pass_give_the_same_bits(avx512) -> None:
    """Attention in the decoder stack's parallel region and in its own kernel
    (``CpuKernels.attention``, the unstacked compiled pass) is the same code, split
    between the threads alike or not: a prefill beside others, then a pass feeding one,
    one and three tokens (6 query heads of 64 over 2 key/value heads), the same logits."""
    from thinkstruct.engine.weights.int8_weights import quantize_int8_weights

    torch.manual_seed(0)
    model = _small_llama(hidden_size=192, head_dim=64, num_attention_heads=6, num_hidden_layers=2)
    quantize_int8_weights(model)
    kernels = cpu_kernels()
    assert kernels is not None
    try:
        kernels.use_avx512(avx512)
        stacked = DecoderRunner(model, slots=3, context_length=128)
        by_kernel = DecoderRunner(model, slots=3, context_length=128)
        assert stacked.stacked
        by_kernel._stack = None  # the compiled pass, one kernel call a step of a layer
        with torch.inference_mode():
            for tokens, starts in (
                ([[5, 6, 7, 8, 9], list(range(20, 57)), [3]], [0, 0, 0]),
                ([[11], [12], [13, 14, 15]], [5, 37, 1]),
            ):
                assert torch.equal(stacked.forward(0, tokens, starts), by_kernel.forward(0, tokens, starts))
    finally:
        kernels.use_avx512(True)


@pytest.mark.parametrize("avx512", [True, False], ids=["avx512", "avx2"])
def test_a_stacked_pass_whose_attention_is_wider_than_the_model(avx512) -> None:
    """4 heads of 32 (attention 128 wide) over hidden and MLP sizes of 32: the o
    projection reads the widest input of the layer. A 12-token pass (the prefill tiles)
    on both instruction sets gives the quantized model's own logits."""
    from thinkstruct.engine.weights.int8_weights import quantize_int8_weights

    model = _small_llama(hidden_size=32, head_dim=32, intermediate_size=32)
    quantize_int8_weights(model)
    kernels = cpu_kernels()
    assert kernels is not None
    ids = [(7 * i) % 300 for i in range(12)]
    try:
        kernels.use_avx512(avx512)
        runner = DecoderRunner(model, slots=1, context_length=64)
        assert runner.stacked
        with torch.inference_mode():
            got = runner.forward(0, [ids], [0])[0]
    finally:
        kernels.use_avx512(True)
    torch.testing.assert_close(
        got, reference_logits(model, ids, kv_dtype_of(runner)), **tolerance(kv_dtype_of(runner))
    )


def test_a_model_the_decoder_runner_does_not_compute_gets_the_transformers_runner() -> None:
    from thinkstruct.engine.runners.decoder_runner import default_runner

    model = _small_llama(hidden_size=32, hidden_act="gelu")
    assert supports(model) == "activation 'gelu' (the runner computes gated SiLU)"
    with pytest.raises(ValueError, match="activation 'gelu'"):
        DecoderRunner(model, slots=1, context_length=64)
    runner = default_runner(model, slots=1, context_length=64, vocab_size=300)
    assert isinstance(runner, TransformersRunner)
    # Its slot buffers split the KV budget: a large batch cap gives it no more slots than
    # its own, so a request keeps its share.
    budget = {"context_length": 4096, "kv_cache_bytes": 1 << 20}
    wide = default_runner(model, slots=64, vocab_size=300, **budget)
    eight = TransformersRunner(model, slots=TransformersRunner.most_slots, **budget)
    assert wide.slots == TransformersRunner.most_slots < 64
    assert wide.kv_budget.max_positions == eight.kv_budget.max_positions < 4096
    with torch.inference_mode():
        got = runner.forward(0, [[1, 2, 3]], [0])[0]
    torch.testing.assert_close(
        got, reference_logits(model, [1, 2, 3], kv_dtype_of(runner)), **tolerance(kv_dtype_of(runner))
    )


def test_sizes_the_kernels_cannot_take_run_on_torch_operations() -> None:
    """A hidden size that is not a multiple of 8 (here 60, with 4 heads of 16: attention's
    width 64 fits) keeps the decoder runner on torch operations, and its logits right."""
    model = _small_llama(hidden_size=60, head_dim=16)
    runner = DecoderRunner(model, slots=1, context_length=64)
    assert not runner.compiled
    with torch.inference_mode():
        got = runner.forward(0, [[1, 2, 3]], [0])[0]
    torch.testing.assert_close(
        got, reference_logits(model, [1, 2, 3], kv_dtype_of(runner)), **tolerance(kv_dtype_of(runner))
    )


def test_the_kv_cache_holds_float16_on_the_kernels_and_the_budget_twice_the_positions(tiny_model) -> None:
    """By default the kernels keep keys and values in float16 (half the bytes attention
    reads), the torch operations the model's dtype; a choice holds on either, and the
    same bytes of budget hold twice the positions in float16."""
    budget = {"kv_cache_bytes": 1 << 20, "prefix_cache_bytes": 0}
    model, context = tiny_model.model, tiny_model.context_length
    default = DecoderRunner(model, slots=SLOTS, context_length=context, **budget)
    assert default.compiled and default.cache.dtype == torch.float16
    on_torch = DecoderRunner(model, slots=SLOTS, context_length=context, kernels=False, **budget)
    assert on_torch.cache.dtype == torch.float32
    wide = DecoderRunner(model, slots=SLOTS, context_length=context, kv_cache_dtype=torch.float32, **budget)
    assert wide.cache.dtype == torch.float32
    assert default.kv_budget.unit_bytes * 2 == wide.kv_budget.unit_bytes
    assert default.kv_budget.max_positions == min(context, 2 * wide.kv_budget.max_positions)
    # float16 on torch operations: the pools round, attention computes in float32.
    rounded = DecoderRunner(
        model, slots=SLOTS, context_length=context, kernels=False, kv_cache_dtype=torch.float16
    )
    ids = [5, 6, 7, 8]
    with torch.inference_mode():
        got = rounded.forward(0, [ids], [0])[0]
    torch.testing.assert_close(got, reference_logits(model, ids, torch.float16), **tolerance(torch.float16))
    with pytest.raises(ValueError, match="kv_cache_dtype must be float16, float32 or None"):
        DecoderRunner(model, slots=SLOTS, context_length=context, kv_cache_dtype=torch.bfloat16)


def test_a_kv_cache_dtype_for_a_model_the_decoder_runner_cannot_run_is_refused_naming_why() -> None:
    from thinkstruct.engine.runners.decoder_runner import default_runner

    model = _small_llama(hidden_size=32, hidden_act="gelu")
    with pytest.raises(ValueError, match="needs the decoder runner.*activation 'gelu'"):
        default_runner(model, slots=1, context_length=64, vocab_size=300, kv_cache_dtype=torch.float16)
