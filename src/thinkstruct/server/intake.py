"""The one start of every generation request, whatever API it came in by.

Each API (chat and text completions, Responses, Anthropic Messages) reads its own body
into its own wire model and translates it into a :class:`GenerationSpec`: the
conversation or prompts, sampling, ``n``, ``max_tokens``, the constraint, the tools, the
thinking budget or effort. :func:`start_generation` then does what every request needs,
in one place and in this order, so that everything that can refuse a request does before
anything is generated: the served model, the operator's limits, the tool calls'
constraint, the prompt (rendered off the event loop), its length against the limit and
the context, ``max_tokens``, the compile (started at once), the thinking budget, the
engine requests (submitted while their grammar compiles) and the compile's outcome.

Errors name the internal field (``messages``, ``max_tokens``, ``stop``...); a spec's
:attr:`GenerationSpec.names` maps them to its API's own field names.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from starlette.concurrency import run_in_threadpool

from thinkstruct.server.constraints import RequestedConstraint
from thinkstruct.server.effort import Effort, EffortPlan, effort_budget, effort_max_tokens, effort_plan
from thinkstruct.server.errors import APIError
from thinkstruct.server.generation import (
    Sampling,
    Submitted,
    engine_requests,
    max_new_tokens,
    room_left,
    sampling_params,
    start_compile,
    submit_compiling,
)
from thinkstruct.server.limits import check_prompt_length, check_request_limits
from thinkstruct.server.prompts import (
    ChatSource,
    Prompt,
    TextSource,
    chat_prompt,
    completion_prompt,
    thinking_kwargs,
)
from thinkstruct.server.protocol import GenerationInfo, SamplingFields, Usage
from thinkstruct.server.reasoning_budget import thinking_budget
from thinkstruct.server.state import ServerState
from thinkstruct.server.tools import ToolPlan
from thinkstruct.server.usage import generation_info, total_usage

if TYPE_CHECKING:
    from thinkstruct.engine import Engine
    from thinkstruct.engine import Usage as EngineUsage
    from thinkstruct.grammar.base import CompiledGrammar


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerationSpec:
    """One request, translated from its API: what every API asks of the engine.

    Attributes:
        model: the model the request names (checked against the served one).
        source: a conversation (rendered by the chat template) or text prompts.
        sampling: the sampling fields.
        n: choices per prompt.
        max_tokens: tokens to generate per choice, thought included (``None``: the
            server's default, capped by the context).
        constraint: the answer's constraint, before the tools are added.
        tools: the request's tools, read and checked.
        backend: the grammar backend asked for (``None``: the server's).
        max_reasoning_tokens: the thinking budget asked for (wins over ``effort``).
        effort: the reasoning effort (:mod:`.effort`).
        separate_reasoning: the thought is told apart from the answer.
        count_allowed_tokens: record per token how many tokens the grammar allowed.
        names: the API's own names of the internal fields errors name
            (``{"max_tokens": "max_output_tokens"}``).
    """

    model: str
    source: ChatSource | TextSource
    sampling: Sampling = field(default_factory=Sampling)
    n: int = 1
    max_tokens: int | None = None
    constraint: RequestedConstraint | None = None
    tools: ToolPlan = field(default_factory=ToolPlan)
    backend: str | None = None
    max_reasoning_tokens: int | None = None
    effort: Effort | None = None
    separate_reasoning: bool = True
    count_allowed_tokens: bool = False
    names: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class Started:
    """A request whose engine requests run: what its answer is built from.

    Attributes:
        submitted: the engine requests, in choice order (prompt ``i``'s choices first).
        prompts: the distinct prompts (one for a conversation).
        grammar: the compiled constraint (``None``: free text).
        compile_s: seconds the request waited for it.
        reasoning: the prompt opened a thought (the answer starts with one).
        max_reasoning_tokens: the thinking budget each choice has (``None``: no thought).
        model: the model name answers carry.
        split: the thought is told apart from the answer.
    """

    submitted: Submitted
    prompts: list[Prompt]
    grammar: CompiledGrammar | None
    compile_s: float | None
    reasoning: bool
    max_reasoning_tokens: int | None
    model: str
    split: bool

    def usage(self, usages: Sequence[EngineUsage | None]) -> Usage:
        """OpenAI's ``usage`` over every choice."""
        return total_usage(self.prompts, usages)

    def info(self, usages: Sequence[EngineUsage | None]) -> GenerationInfo:
        """thinkstruct's ``thinkstruct`` extension object."""
        return generation_info(
            self.grammar, self.compile_s, usages, max_reasoning_tokens=self.max_reasoning_tokens
        )


def sampling_of(body: SamplingFields) -> Sampling:
    """The sampling fields of a chat or text completions request."""
    return Sampling(
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        seed=body.seed,
        stop=body.stop_sequences(),
        logprobs=body.requested_logprobs,
        logit_bias=body.logit_bias_pairs(),
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        repetition_penalty=body.repetition_penalty,
        min_p=body.min_p,
    )


async def start_generation(state: ServerState, spec: GenerationSpec) -> Started:
    """Check, render, compile and submit a request (see the module docstring).

    Raises:
        APIError: whatever refuses the request, before anything is generated, its
            ``param`` and message in the API's own field names.
    """
    try:
        return await _start(state, spec)
    except APIError as e:
        raise renamed(e, spec.names) from None


async def _start(state: ServerState, spec: GenerationSpec) -> Started:
    settings = state.settings
    engine = state.require_engine()
    state.check_model(spec.model)
    source = spec.source
    chat = isinstance(source, ChatSource)
    check_request_limits(
        spec.n,
        spec.sampling.stop,
        settings,
        prompts=1 if chat else len(source.prompts),  # type: ignore[union-attr]
    )
    requested = spec.tools.constraint(
        spec.constraint,
        backend=spec.backend,
        max_whitespace=engine.compiler.config.json_format.max_whitespace,
    )
    plan = EffortPlan(chat_template_kwargs=None, share=None)
    if isinstance(source, ChatSource):
        plan = effort_plan(
            spec.effort,
            engine.model.family,
            thinking_kwargs(engine.model, source.chat_template_kwargs),
            param="reasoning_effort",
        )
        source = dataclasses.replace(source, chat_template_kwargs=plan.chat_template_kwargs)
        prompts = [
            await run_in_threadpool(
                functools.partial(
                    chat_prompt,
                    engine.model,
                    source,
                    constrained=requested is not None,
                    tools=spec.tools.tools,
                )
            )
        ]
        prompt_param = "messages"
    else:
        prompts = await run_in_threadpool(_encode_all, engine, source)
        prompt_param = "prompt"
    reasoning = prompts[0].reasoning
    budgets = [_max_tokens(engine, state, spec, plan, p, prompt_param=prompt_param) for p in prompts]
    pending = start_compile(engine, requested)
    budget: int | None = None
    requests = []
    for prompt, (max_tokens, base) in zip(prompts, budgets, strict=True):
        asked = spec.max_reasoning_tokens
        if asked is None:
            asked = effort_budget(
                plan, base=base, tokenizer=engine.tokenizer, end_tag=engine.model.family.think_end
            )
        budget = thinking_budget(
            engine,
            requested=asked,
            reasoning=reasoning,
            max_tokens=max_tokens,
            share=settings.reasoning_share,
        )
        chat_prompt_ = prompt.chat
        requests += [
            (prompt, r)
            for r in engine_requests(
                prompt,
                [sampling_params(spec.sampling, max_tokens=max_tokens, choice=c) for c in range(spec.n)],
                pending=pending,
                reasoning=reasoning,
                reasoning_parser=functools.partial(
                    chat_prompt_.reasoning_parser, stream_reasoning=True, calls_end_thought=requested is None
                )
                if chat_prompt_ is not None and spec.separate_reasoning
                else None,
                max_reasoning_tokens=budget,
                tool_calls=spec.tools.reading(spec.constraint),
                count_allowed_tokens=spec.count_allowed_tokens,
            )
        ]
    submitted, grammar, compile_s = await submit_compiling(
        engine, requests, pending, retry_after_s=settings.retry_after_s, metrics=state.metrics
    )
    return Started(
        submitted=submitted,
        prompts=prompts,
        grammar=grammar,
        compile_s=compile_s,
        reasoning=reasoning,
        max_reasoning_tokens=budget,
        model=state.model_name or spec.model,
        split=spec.separate_reasoning,
    )


def _max_tokens(
    engine: Engine,
    state: ServerState,
    spec: GenerationSpec,
    plan: EffortPlan,
    prompt: Prompt,
    *,
    prompt_param: str,
) -> tuple[int, int]:
    """``max_tokens`` for ``prompt`` and the tokens an effort's share is of."""
    settings = state.settings
    check_prompt_length(len(prompt.ids), settings, param=prompt_param)
    context = engine.model.context_length
    if spec.max_tokens is None:
        room = room_left(len(prompt.ids), context=context, prompt_param=prompt_param)
        chosen = effort_max_tokens(plan, room=room, default=settings.default_max_tokens)
        if chosen is not None:
            return chosen, room
    max_tokens = max_new_tokens(
        spec.max_tokens,
        prompt_tokens=len(prompt.ids),
        context=context,
        default=settings.default_max_tokens,
        param="max_tokens",
        prompt_param=prompt_param,
    )
    return max_tokens, max_tokens


def _encode_all(engine: Engine, source: TextSource) -> list[Prompt]:
    return [completion_prompt(engine.model, p, suffix=source.suffix) for p in source.prompts]


_HEAD = re.compile(r"[A-Za-z_]+")


def renamed(error: APIError, names: Mapping[str, str]) -> APIError:
    """``error`` with its ``param`` (and the field's name in its message) in an API's own
    names: with ``{"max_tokens": "max_output_tokens"}``, ``max_tokens`` becomes
    ``max_output_tokens``; ``messages[2].content`` with ``{"messages": "input"}``,
    ``input[2].content``."""
    if not names or error.param is None:
        return error
    head = _HEAD.match(error.param)
    if head is None or head.group() not in names:
        return error
    old = head.group()
    param = names[old] + error.param[head.end() :]
    if error.param in error.message:
        error.message = error.message.replace(error.param, param)
    else:
        error.message = re.sub(rf"\b{re.escape(old)}\b", names[old], error.message)
    error.param = param
    return error
