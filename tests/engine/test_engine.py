"""The engine on the tiny random model: batching, grammars, reasoning, limits, faults.

Random weights make the model emit arbitrary tokens, which is what these tests want: any
structure in the output comes from the grammar and the scheduler, so a grammar that lets
one wrong token through, or a batch that mixes up two rows, shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest

from polling import wait_until
from thinkstruct import Constraint
from thinkstruct.engine import (
    Engine,
    EngineClosed,
    EngineConfig,
    EngineOverloaded,
    FinishReason,
    GenerationRequest,
    SamplingParams,
    load_model,
)
from thinkstruct.engine.core.executor import MASKS_DURING_FORWARD_ROWS
from thinkstruct.grammar.service.compiler import CompilerConfig, GrammarCompiler
from thinkstruct.parsers import render_chat

BOUNDED_SCHEMA = {
    "type": "object",
    "properties": {
        "verdict": {"enum": ["yes", "no", "maybe"]},
        "ok": {"type": "boolean"},
        "score": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["verdict", "ok", "score"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def compiler(tiny_model):
    with GrammarCompiler(tiny_model.tokenizer, CompilerConfig(timeout_s=60)) as c:
        yield c


@pytest.fixture(scope="module")
def engine(tiny_model, compiler):
    with Engine(tiny_model, config=EngineConfig(max_batch=4), compiler=compiler) as e:
        yield e


def prompt_ids(model, text: str = "hello", *, thinking: bool = False) -> tuple[list[int], object]:
    prompt = render_chat(
        [{"role": "user", "content": text}],
        family=model.family,
        tokenizer=model.tokenizer,
        chat_template=model.chat_template,
        chat_template_kwargs={"thinking": thinking},
    )
    return model.tokenizer.hf.encode(prompt.text, add_special_tokens=False), prompt


def run(engine, **kwargs):
    return engine.submit(GenerationRequest(**kwargs)).wait()


def test_free_text_runs_to_max_tokens(engine, tiny_model) -> None:
    ids, _ = prompt_ids(tiny_model)
    out = run(engine, prompt_ids=ids, sampling=SamplingParams(max_tokens=5, temperature=0, seed=1))
    assert out.finish_reason is FinishReason.LENGTH
    assert out.usage.completion_tokens == 5 == len(out.token_ids)
    assert out.usage.prompt_tokens == len(ids)
    assert out.content == tiny_model.tokenizer.decode(out.token_ids)


@pytest.mark.parametrize("backend", ["llguidance", "xgrammar"])
def test_constrained_answers_are_always_valid(engine, compiler, tiny_model, backend: str) -> None:
    grammar = compiler.compile(Constraint.json_schema(BOUNDED_SCHEMA), backend=backend)
    handles = [
        engine.submit(
            GenerationRequest(
                prompt_ids=prompt_ids(tiny_model, f"q{i}")[0],
                sampling=SamplingParams(max_tokens=80, temperature=1.0, seed=i),
                grammar=grammar,
            )
        )
        for i in range(6)
    ]
    for h in handles:
        out = h.wait()
        assert out.finish_reason is FinishReason.STOP, out
        jsonschema.validate(json.loads(out.content), BOUNDED_SCHEMA)
        assert out.usage.backend == backend


def test_regex_and_choice_answers_match(engine, compiler, tiny_model) -> None:
    pattern = r"[a-z]{2,6}@[a-z]{2,4}\.(com|org)"
    cases = [
        (Constraint.regex(pattern), lambda s: re.fullmatch(pattern, s)),
        (
            Constraint.choice(["alpha", "beta", "gamma delta"]),
            lambda s: s in ("alpha", "beta", "gamma delta"),
        ),
    ]
    for constraint, check in cases:
        grammar = compiler.compile(constraint)
        for seed in range(3):
            out = run(
                engine,
                prompt_ids=prompt_ids(tiny_model)[0],
                sampling=SamplingParams(max_tokens=40, seed=seed),
                grammar=grammar,
            )
            assert out.finish_reason is FinishReason.STOP and check(out.content), out


def test_jump_forward_appends_forced_tokens_without_sampling(engine, compiler, tiny_model) -> None:
    schema = {
        "type": "object",
        "properties": {"a_rather_long_property_name_to_force": {"type": "boolean"}},
        "required": ["a_rather_long_property_name_to_force"],
        "additionalProperties": False,
    }
    grammar = compiler.compile(Constraint.json_schema(schema))
    out = run(
        engine,
        prompt_ids=prompt_ids(tiny_model)[0],
        sampling=SamplingParams(max_tokens=40, seed=3),
        grammar=grammar,
    )
    assert out.finish_reason is FinishReason.STOP
    assert json.loads(out.content) in (
        {"a_rather_long_property_name_to_force": True},
        {"a_rather_long_property_name_to_force": False},
    )
    assert out.usage.jump_forward_tokens >= 5
    assert engine.stats.jump_forward_tokens >= out.usage.jump_forward_tokens


def test_reasoning_is_split_and_the_budget_forces_the_answer(engine, compiler, tiny_model) -> None:
    ids, prompt = prompt_ids(tiny_model, "think first", thinking=True)
    assert prompt.reasoning_enabled
    grammar = compiler.compile(Constraint.choice(["left", "right"]))
    out = run(
        engine,
        prompt_ids=ids,
        sampling=SamplingParams(max_tokens=60, seed=5),
        grammar=grammar,
        reasoning=True,
        reasoning_parser=prompt.reasoning_parser(),
        max_reasoning_tokens=6,
    )
    assert out.finish_reason is FinishReason.STOP
    assert out.content in ("left", "right")
    assert out.reasoning  # six random thought tokens
    assert "</think>" not in out.content and "</think>" not in out.reasoning
    assert out.usage.reasoning_tokens == 7  # the budget, plus the end tag the grammar forced


def test_same_seed_same_output_whatever_else_is_in_the_batch(tiny_model_dir, tiny_model, compiler) -> None:
    """With int8 weights on the compiled kernels (the runner says it is batch-invariant),
    whatever joins the batch; float weights through torch are not (shapes pick kernels)."""
    model = load_model(tiny_model_dir, quantize="int8-weights", progress=False)
    ids = prompt_ids(tiny_model, "determinism")[0]
    params = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=1234)
    with Engine(model, config=EngineConfig(max_batch=4), compiler=compiler) as e:
        assert e.runner is not None and e.runner.batch_invariant
        alone = run(e, prompt_ids=ids, sampling=params)
        others = [
            e.submit(
                GenerationRequest(
                    prompt_ids=prompt_ids(tiny_model, "x" * (i + 1))[0],
                    sampling=SamplingParams(max_tokens=30, seed=i),
                )
            )
            for i in range(3)
        ]
        wait_until(lambda: e.stats.running == 3, "the three others running")
        together = run(e, prompt_ids=ids, sampling=params)
        for h in others:
            h.wait()
    assert together.token_ids == alone.token_ids


def test_where_a_prompt_is_cut_changes_nothing_on_a_batch_invariant_runner(
    tiny_model_dir, tiny_model
) -> None:
    """The prefill pass beside decoding rows follows the step latency target, so a prompt
    is cut wherever the load puts it: on a batch-invariant runner the seeded answer is the
    same whatever the cuts (here passes of 256 positions against 7)."""
    model = load_model(tiny_model_dir, quantize="int8-weights", progress=False)
    ids = prompt_ids(tiny_model, "where is this prompt cut? " * 6)[0]
    assert len(ids) > 3 * 7
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=77)
    answers = []
    for chunk in (256, 7):
        config = EngineConfig(max_batch=4, prefill_chunk=chunk, prefix_cache_bytes=0)
        with Engine(model, config=config) as e:
            assert e.runner is not None and e.runner.batch_invariant
            answers.append(run(e, prompt_ids=ids, sampling=params).token_ids)
    assert answers[0] == answers[1]


def test_a_shared_prompt_prefix_is_copied_and_changes_nothing(tiny_model_dir, tiny_model) -> None:
    """On a batch-invariant runner a prompt sharing a prefix with a request in the batch
    (here a system prompt) copies that prefix's keys and values instead of computing
    them: the usage says how many tokens, and the seeded answer is the one computed from
    scratch. The same prompt twice shares all of it but its last token."""
    model = load_model(tiny_model_dir, quantize="int8-weights", progress=False)
    system = prompt_ids(tiny_model, "You are a careful assistant. " * 4)[0][:-1]  # a shared system prompt
    ids = system + prompt_ids(tiny_model, "first question")[0]
    other = system + prompt_ids(tiny_model, "a different one")[0]
    shared = next(i for i, (a, b) in enumerate(zip(ids, other, strict=False)) if a != b)
    assert shared >= len(system) >= 20
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=5)
    # Slot to slot only: the prefix cache (tests/engine/test_prefix_cache.py) would give
    # the second run of `ids` its whole prompt from the first.
    with Engine(model, config=EngineConfig(max_batch=4, prefix_cache_bytes=0)) as e:
        alone = run(e, prompt_ids=ids, sampling=params)
        assert alone.usage.cached_tokens == 0  # nothing else held a prefix
        endless = e.compiler.compile(Constraint.regex("[a-z ]{3000}"))  # no end-of-sequence before max_tokens
        donor = e.submit(
            GenerationRequest(
                prompt_ids=other, sampling=SamplingParams(max_tokens=1000, seed=1), grammar=endless
            )
        )
        # The donor runs, its prompt in its slot.
        wait_until(lambda: e.stats.generated_tokens > len(alone.token_ids), "the donor generating")
        beside = run(e, prompt_ids=ids, sampling=params)
        twin = e.submit(GenerationRequest(prompt_ids=other, sampling=SamplingParams(max_tokens=2, seed=2)))
        twin_out = twin.wait()
        donor.cancel()
        reused = e.stats.prefix_reused_tokens
    assert beside.usage.cached_tokens == shared
    assert beside.token_ids == alone.token_ids
    assert twin_out.usage.cached_tokens == len(other) - 1
    assert reused == shared + len(other) - 1


def test_float_weights_through_torch_reuse_prefixes_too(tiny_model, compiler) -> None:
    """A runner that is not batch-invariant (float32 matrix multiplies pick kernels by
    shape) still copies a prefix another slot holds: the copy is what an earlier pass
    computed, equal within rounding, and the answer goes on from it."""
    ids = prompt_ids(tiny_model, "the same prompt " * 4)[0]
    with Engine(tiny_model, config=EngineConfig(max_batch=4), compiler=compiler) as e:
        assert e.runner is not None and not e.runner.batch_invariant
        first = e.submit(GenerationRequest(prompt_ids=ids, sampling=SamplingParams(max_tokens=40, seed=1)))
        wait_until(lambda: e.stats.generated_tokens > 0, "the first request generating")
        second = run(e, prompt_ids=ids, sampling=SamplingParams(max_tokens=3, seed=2))
        first.wait()
    assert second.usage.cached_tokens == len(ids) - 1 and len(second.token_ids) == 3


def test_more_requests_than_slots_all_finish(tiny_model, compiler) -> None:
    with Engine(tiny_model, config=EngineConfig(max_batch=2), compiler=compiler) as e:
        handles = [
            e.submit(
                GenerationRequest(
                    prompt_ids=prompt_ids(tiny_model, str(i))[0],
                    sampling=SamplingParams(max_tokens=4 + i, seed=i),
                )
            )
            for i in range(7)
        ]
        outs = [h.wait() for h in handles]
        assert [o.usage.completion_tokens for o in outs] == [4 + i for i in range(7)]
        # Batched: fewer decoding steps than tokens.
        assert e.stats.steps < sum(o.usage.completion_tokens for o in outs)


def test_stop_strings_end_the_answer(engine, compiler, tiny_model) -> None:
    grammar = compiler.compile(Constraint.regex("abc STOP def"))
    out = run(
        engine,
        prompt_ids=prompt_ids(tiny_model)[0],
        sampling=SamplingParams(max_tokens=20, stop=("STOP",)),
        grammar=grammar,
    )
    assert out.finish_reason is FinishReason.STOP
    assert out.content == "abc "


def test_cancel_frees_the_slot_and_others_go_on(tiny_model, compiler) -> None:
    with Engine(tiny_model, config=EngineConfig(max_batch=1), compiler=compiler) as e:
        long = e.submit(
            GenerationRequest(prompt_ids=prompt_ids(tiny_model)[0], sampling=SamplingParams(max_tokens=3000))
        )
        first = next(iter(long))  # it is running
        assert first.finish_reason is None
        long.cancel()
        assert long.wait().finish_reason is FinishReason.ABORT
        after = e.submit(
            GenerationRequest(prompt_ids=prompt_ids(tiny_model)[0], sampling=SamplingParams(max_tokens=3))
        )
        # With one slot, the second request can only run once the first one's slot is free.
        assert after.wait().finish_reason is FinishReason.LENGTH
        wait_until(lambda: e.stats.running == 0, "every slot free")


def test_async_consumers_get_the_same_stream(engine, tiny_model) -> None:
    ids = prompt_ids(tiny_model)[0]
    params = SamplingParams(max_tokens=8, seed=9)

    async def consume():
        handle = engine.submit(
            GenerationRequest(prompt_ids=ids, sampling=params), loop=asyncio.get_running_loop()
        )
        return await handle.result()

    async_out = asyncio.run(consume())
    sync_out = run(engine, prompt_ids=ids, sampling=params)
    assert async_out.token_ids == sync_out.token_ids and async_out.content == sync_out.content


def test_a_failure_in_one_request_ends_only_that_request(engine, tiny_model) -> None:
    ids, prompt = prompt_ids(tiny_model)

    class BrokenParser(type(prompt.reasoning_parser())):  # a real parser that fails mid-stream
        def feed(self, chunk):
            raise RuntimeError("parser exploded")

    broken = BrokenParser(tiny_model.family, enabled=False)
    bad = engine.submit(
        GenerationRequest(
            prompt_ids=ids, sampling=SamplingParams(max_tokens=20, seed=1), reasoning_parser=broken
        )
    )
    good = engine.submit(GenerationRequest(prompt_ids=ids, sampling=SamplingParams(max_tokens=20, seed=2)))
    bad_out, good_out = bad.wait(), good.wait()
    assert bad_out.finish_reason is FinishReason.ERROR and "parser exploded" in bad_out.error
    assert good_out.finish_reason is FinishReason.LENGTH and good_out.usage.completion_tokens == 20


def test_limits_are_refused_with_a_reason(tiny_model, compiler) -> None:
    with Engine(
        tiny_model, config=EngineConfig(max_batch=1, max_queue=2, max_prompt_tokens=50), compiler=compiler
    ) as e:
        with pytest.raises(ValueError, match="51 tokens"):
            e.submit(GenerationRequest(prompt_ids=[5] * 51))
        with pytest.raises(ValueError, match="empty"):
            e.submit(GenerationRequest(prompt_ids=[]))
        with pytest.raises(ValueError, match="token ids"):
            e.submit(GenerationRequest(prompt_ids=[10**9]))
        handles = []
        with pytest.raises(EngineOverloaded) as overloaded:
            for _ in range(10):
                handles.append(
                    e.submit(GenerationRequest(prompt_ids=[5, 6], sampling=SamplingParams(max_tokens=200)))
                )
        assert overloaded.value.retry_after_s >= 1
        for h in handles:
            h.cancel()
    with pytest.raises(EngineClosed):
        e.submit(GenerationRequest(prompt_ids=[5]))


def test_close_ends_running_requests_cleanly(tiny_model, compiler) -> None:
    e = Engine(tiny_model, config=EngineConfig(max_batch=2), compiler=compiler).start()
    handles = [
        e.submit(GenerationRequest(prompt_ids=[5, 6, 7], sampling=SamplingParams(max_tokens=5000)))
        for _ in range(3)
    ]
    next(iter(handles[0]))
    closer = threading.Thread(target=e.close, kwargs={"grace_s": 0.2})
    closer.start()
    closer.join(timeout=30)
    assert not closer.is_alive()
    for h in handles:
        out = h.wait()
        assert out.finish_reason is FinishReason.ABORT


def test_outputs_do_not_depend_on_the_schedule(tiny_model, compiler) -> None:
    """Requests arriving together into few slots, prefilled in small shared chunks, leaving
    at different times (rows move between slots, some through the scratch slot): each
    gets exactly the tokens it gets when it runs alone."""
    lengths = [3, 40, 7, 25, 1, 60, 12, 5]
    requests = [
        GenerationRequest(
            prompt_ids=[(97 * i + 13 * j) % 120_000 + 2 for j in range(n)],
            sampling=SamplingParams(max_tokens=3 + (5 * i) % 11, temperature=1.0, seed=100 + i),
        )
        for i, n in enumerate(lengths)
    ]
    with Engine(tiny_model, config=EngineConfig(max_batch=8), compiler=compiler) as e:
        alone = [run(e, prompt_ids=r.prompt_ids, sampling=r.sampling).token_ids for r in requests]
    with Engine(tiny_model, config=EngineConfig(max_batch=3, prefill_chunk=16), compiler=compiler) as e:
        handles = [
            e.submit(GenerationRequest(prompt_ids=r.prompt_ids, sampling=r.sampling)) for r in requests
        ]
        together = [h.wait().token_ids for h in handles]
    assert together == alone


def test_the_thinking_budget_holds_without_a_constraint(engine, tiny_model) -> None:
    ids, prompt = prompt_ids(tiny_model, "think first", thinking=True)
    out = run(
        engine,
        prompt_ids=ids,
        sampling=SamplingParams(max_tokens=30, seed=11),
        reasoning=True,
        reasoning_parser=prompt.reasoning_parser(),
        max_reasoning_tokens=4,
    )
    assert out.usage.reasoning_tokens == 5  # four thought tokens and the forced end tag
    assert out.reasoning and out.content  # the answer after it is free text
    assert out.finish_reason is FinishReason.LENGTH


def _wanting_to_stop_at_once(engine, tiny_model, *, seed: int, grammar=None):
    """A thinking request whose model wants to stop at once (its stop tokens biased to the
    top), with ``grammar`` or free text."""
    ids, prompt = prompt_ids(tiny_model, "think first", thinking=True)
    bias = tuple((eos, 100.0) for eos in tiny_model.tokenizer.eos_token_ids)
    return run(
        engine,
        prompt_ids=ids,
        sampling=SamplingParams(max_tokens=30, seed=seed, logit_bias=bias),
        grammar=grammar,
        reasoning=True,
        reasoning_parser=prompt.reasoning_parser(),
        max_reasoning_tokens=20,
    )


@pytest.mark.parametrize("seed", [3, 4])
def test_a_stop_inside_the_thought_ends_the_thought_and_an_answer_comes(engine, tiny_model, seed) -> None:
    """In its thought the stop ends the thought (the end tag in its place); in the answer
    it comes only after a token with text."""
    tokenizer = tiny_model.tokenizer
    out = _wanting_to_stop_at_once(engine, tiny_model, seed=seed)
    assert out.finish_reason is FinishReason.STOP
    assert out.reasoning == ""  # the first token, a stop, became the end tag
    assert out.usage.reasoning_tokens == len(tokenizer.think_end_ids)
    assert out.content.strip()  # the stop came as soon as the answer had text
    assert list(out.token_ids[: out.usage.reasoning_tokens]) == list(tokenizer.think_end_ids)


def test_a_stop_inside_the_thought_ends_it_before_a_constrained_answer_too(
    engine, compiler, tiny_model
) -> None:
    grammar = compiler.compile(Constraint.choice(["left", "right"]))
    out = _wanting_to_stop_at_once(engine, tiny_model, seed=2, grammar=grammar)
    assert out.finish_reason is FinishReason.STOP
    assert out.reasoning == "" and out.usage.reasoning_tokens == len(tiny_model.tokenizer.think_end_ids)
    assert out.content in ("left", "right")


def test_forced_tokens_past_the_step_budget_wait_for_the_next_step(tiny_model, compiler) -> None:
    """A decoding step computes at most ``decode_positions`` positions: forced tokens that
    do not fit are fed over the next steps, that row not sampling meanwhile. A request
    gets the same tokens as when every forced run is fed at once, and stays valid."""
    schema = {
        "type": "object",
        "properties": {
            "a_rather_long_property_name_to_force": {"type": "boolean"},
            "and_a_second_long_property_name": {"enum": ["first option", "second option"]},
        },
        "required": ["a_rather_long_property_name_to_force", "and_a_second_long_property_name"],
        "additionalProperties": False,
    }
    grammar = compiler.compile(Constraint.json_schema(schema))

    def alone(positions: int, seed: int) -> tuple[object, int]:
        with Engine(
            tiny_model, config=EngineConfig(max_batch=1, decode_positions=positions), compiler=compiler
        ) as e:
            out = run(
                e,
                prompt_ids=prompt_ids(tiny_model, f"question {seed}")[0],
                sampling=SamplingParams(max_tokens=60, temperature=1.0, seed=seed),
                grammar=grammar,
            )
            return out, e.stats.steps

    for seed in (7, 8):
        wide, wide_steps = alone(256, seed)
        narrow, narrow_steps = alone(1, seed)
        assert narrow.token_ids == wide.token_ids
        assert narrow.finish_reason is FinishReason.STOP
        jsonschema.validate(json.loads(narrow.content), schema)
        assert narrow.usage.jump_forward_tokens >= 10
        # Each forced token took a step of its own at one position a step.
        assert narrow_steps >= wide_steps + narrow.usage.jump_forward_tokens - 2


@contextlib.contextmanager
def held_in_a_pass(engine: Engine, *, passes: list[list[int]] | None = None) -> Iterator[None]:
    """Hold the engine thread inside its next forward pass (a small request keeps it busy)
    while the block runs, so what the block submits waits together; ``passes`` records
    the token count of each row of every pass from then on."""
    runner = engine.runner
    forward = runner.forward
    entered, release = threading.Event(), threading.Event()

    def held_forward(first_slot, tokens, starts, **options):
        if not entered.is_set():
            entered.set()
            release.wait(30)
        if passes is not None:
            passes.append([len(t) for t in tokens])
        return forward(first_slot, tokens, starts, **options)

    runner.forward = held_forward
    busy = engine.submit(GenerationRequest(prompt_ids=[9, 10], sampling=SamplingParams(max_tokens=1)))
    assert entered.wait(30)
    try:
        yield
    finally:
        release.set()
        busy.wait()


def _first_tokens_at(
    engine: Engine, prompts: dict[str, list[int]], *, pause_s: float = 0.0
) -> dict[str, Any]:
    """Submit ``prompts`` in order (``pause_s`` apart) while the engine is held; returns
    each one's completion and the time its first token came."""
    sampling = SamplingParams(max_tokens=2, seed=1)
    submitted, handles = {}, {}
    with held_in_a_pass(engine):
        for name, ids in prompts.items():
            if handles:
                time.sleep(pause_s)
            submitted[name] = time.monotonic()
            handles[name] = engine.submit(GenerationRequest(prompt_ids=ids, sampling=sampling))
    outs = {name: h.wait() for name, h in handles.items()}
    return {name: (outs[name], submitted[name] + outs[name].usage.time_to_first_token_s) for name in outs}


def test_short_prompts_are_prefilled_before_long_ones_that_came_first(tiny_model, compiler) -> None:
    """Two prompts waiting together: the short one's first token comes first although it
    arrived second (shortest first), and both get the tokens they get alone."""
    prompts = {"long": [(31 * j) % 120_000 + 2 for j in range(40)], "short": [5, 6, 7]}
    sampling = SamplingParams(max_tokens=2, seed=1)
    # No prefix cache: the runs alone would leave the long prompt's first 32 tokens cached,
    # its first token then in the short one's pass (which came first was luck).
    config = EngineConfig(max_batch=4, prefill_chunk=16, prefix_cache_bytes=0)
    with Engine(tiny_model, config=config, compiler=compiler) as e:
        alone = [run(e, prompt_ids=ids, sampling=sampling).token_ids for ids in prompts.values()]
        got = _first_tokens_at(e, prompts)
    assert got["short"][1] < got["long"][1]
    assert [got["long"][0].token_ids, got["short"][0].token_ids] == alone


def test_a_long_prompt_that_waited_goes_before_a_fresh_short_one(tiny_model, compiler, monkeypatch) -> None:
    """A prompt that has waited PREFILL_PATIENCE_S is prefilled before a shorter one that
    just arrived, so shortest-first cannot starve it."""
    from thinkstruct.engine.core import scheduler as scheduler_module

    monkeypatch.setattr(scheduler_module, "PREFILL_PATIENCE_S", 0.3)
    # Three full chunks: the short prompt cannot share the long one's last pass.
    prompts = {"long": [(31 * j) % 120_000 + 2 for j in range(48)], "short": [5, 6, 7]}
    with Engine(tiny_model, config=EngineConfig(max_batch=4, prefill_chunk=16), compiler=compiler) as e:
        got = _first_tokens_at(e, prompts, pause_s=0.5)  # the long one waits past its patience
    assert got["long"][1] < got["short"][1]


def test_a_prefill_pass_counts_the_tokens_a_packing_runner_computes(tiny_model, compiler) -> None:
    """The Llama runner skips padding, so prompts of 12 and 3 tokens share a 16-token pass
    (padded they would be 24 positions); no pass feeds more than prefill_chunk tokens."""
    passes: list[list[int]] = []
    prompts = [
        [(37 * j) % 120_000 + 2 for j in range(12)],
        [5, 6, 7],
        [(11 * j) % 120_000 + 2 for j in range(30)],
    ]
    with Engine(tiny_model, config=EngineConfig(max_batch=4, prefill_chunk=16), compiler=compiler) as e:
        assert e.runner.packs_tokens
        with held_in_a_pass(e, passes=passes):
            handles = [
                e.submit(GenerationRequest(prompt_ids=ids, sampling=SamplingParams(max_tokens=1)))
                for ids in prompts
            ]
        for h in handles:
            h.wait()
    assert sorted(passes[1]) == [3, 12]  # the first pass after the held one: both prompts
    assert all(sum(p) <= 16 for p in passes)


def test_a_request_waits_for_its_grammar_without_holding_up_others(engine, compiler, tiny_model) -> None:
    """A request submitted while its grammar compiles keeps its place in the queue, lets
    a later request pass and run to its end, then runs under the grammar once it is ready;
    a compile that fails ends it with the error."""
    import concurrent.futures

    ids, _ = prompt_ids(tiny_model)
    compiling: concurrent.futures.Future = concurrent.futures.Future()
    failing: concurrent.futures.Future = concurrent.futures.Future()
    waiting = engine.submit(
        GenerationRequest(prompt_ids=ids, sampling=SamplingParams(max_tokens=8, seed=3), grammar=compiling)
    )
    doomed = engine.submit(GenerationRequest(prompt_ids=ids, grammar=failing))
    later = run(engine, prompt_ids=ids, sampling=SamplingParams(max_tokens=4, seed=4))
    assert later.finish_reason is FinishReason.LENGTH
    assert not waiting.finished and not doomed.finished
    failing.set_exception(ValueError("no such schema"))
    compiling.set_result(compiler.compile(Constraint.choice(["left", "right"])))
    out = waiting.wait()
    assert out.finish_reason is FinishReason.STOP and out.content in ("left", "right")
    failed = doomed.wait()
    assert failed.finish_reason is FinishReason.ERROR and "no such schema" in (failed.error or "")


def test_finished_requests_give_their_kv_blocks_back(tiny_model, compiler) -> None:
    """On the paged decoder runner, once every request has ended (prefix cache off),
    every block is free again: leaving rows and moved rows keep nothing."""
    ids, _ = prompt_ids(tiny_model, "a question long enough to fill more than one block " * 3)
    config = EngineConfig(max_batch=4, prefix_cache_bytes=0)
    with Engine(tiny_model, config=config, compiler=compiler) as e:
        handles = [
            e.submit(GenerationRequest(prompt_ids=ids, sampling=SamplingParams(max_tokens=4 + 9 * i, seed=i)))
            for i in range(6)
        ]
        for h in handles:
            h.wait()
        wait_until(lambda: e.stats.slots_used == 0, "the engine laid out the last finished row")
        cache = e.runner.cache
        assert cache.free_blocks == cache.num_blocks


def test_masks_filled_during_or_after_the_pass_give_the_same_answers(tiny_model, compiler) -> None:
    """The mask thread (a spare core) and the engine thread after the pass (none spare)
    fill the same masks: a seeded batch of schema answers is the same tokens either way,
    and with the choice by the step's constrained rows (``None``: 8 rows here)."""
    ids, _ = prompt_ids(tiny_model)
    grammar = compiler.compile(Constraint.json_schema(BOUNDED_SCHEMA))
    answers = []
    for during in (True, False, None):
        config = EngineConfig(max_batch=MASKS_DURING_FORWARD_ROWS, masks_during_forward=during)
        with Engine(tiny_model, config=config, compiler=compiler) as e:
            handles = [
                e.submit(
                    GenerationRequest(
                        prompt_ids=ids, sampling=SamplingParams(max_tokens=60, seed=seed), grammar=grammar
                    )
                )
                for seed in range(MASKS_DURING_FORWARD_ROWS)
            ]
            outs = [h.wait() for h in handles]
        for out in outs:
            assert out.finish_reason is FinishReason.STOP
            jsonschema.validate(json.loads(out.content), BOUNDED_SCHEMA)
        answers.append([o.token_ids for o in outs])
    assert answers[0] == answers[1] == answers[2]
