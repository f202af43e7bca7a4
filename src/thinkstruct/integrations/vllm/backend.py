"""thinkstruct as a vLLM structured-output backend: :class:`ThinkstructBackend`.

vLLM's ``StructuredOutputManager`` compiles a request's grammar on its thread pool while
the request waits (others go on), fills each step's bitmask rows and advances the grammar
with the tokens taken; this backend does the compiling with thinkstruct's service
(:mod:`.service`: ``auto``, strict mode, the deadline, killable workers, the cache) and
hands vLLM a :class:`ThinkstructGrammar` per request. It is built by the manager through
:mod:`.seam`, which also hands it the whole request (:meth:`ThinkstructBackend.grammar_for`):
the prompt's reasoning state, ``max_tokens`` and ``thinking_token_budget`` decide whether
and for how long the request thinks before its answer.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any

import torch
from vllm.logger import init_logger
from vllm.v1.structured_output.backend_types import StructuredOutputBackend, StructuredOutputGrammar

from thinkstruct.grammar.runtime.bitmask import allocate_bitmask
from thinkstruct.grammar.runtime.end_tag import end_tag_matcher
from thinkstruct.grammar.runtime.matcher import GrammarMatcher
from thinkstruct.integrations.vllm.grammar import RequestGrammar
from thinkstruct.integrations.vllm.reasoning import PREFIX
from thinkstruct.integrations.vllm.service import PluginCompiler, constraint_of, plugin_compiler
from thinkstruct.integrations.vllm.thought_bounds import ThoughtBounds
from thinkstruct.parsers import ReasoningFamily, get_reasoning_family

logger = init_logger(__name__)

#: The value of ``--structured-outputs-config.backend`` that selects this backend.
BACKEND_NAME = "thinkstruct"


class ThinkstructGrammar(RequestGrammar, StructuredOutputGrammar):
    """vLLM's per-request grammar over :class:`~.grammar.RequestGrammar`."""


def reasoning_family(vllm_config: Any) -> ReasoningFamily | None:
    """The thinkstruct family of the server's ``--reasoning-parser``, when it is one of
    thinkstruct's (``thinkstruct-<family>``); ``None`` otherwise."""
    name = vllm_config.structured_outputs_config.reasoning_parser or ""
    if not name.startswith(PREFIX):
        return None
    return get_reasoning_family(name[len(PREFIX) :])


@dataclass(eq=False)
class ThinkstructBackend(StructuredOutputBackend):
    """The engine's backend (one per engine process, built on the first structured request)."""

    def __post_init__(self) -> None:
        model = self.vllm_config.model_config
        self.service: PluginCompiler = plugin_compiler(str(model.tokenizer), self.vocab_size)
        self.family = reasoning_family(self.vllm_config)
        tokenizer = self.service.tokenizer
        if self.family is not None:
            self._end_tag_tokens = len(end_tag_matcher(tokenizer, self.family.think_end).closing_ids(0))
            self._banned = tokenizer.single_ids(self.family.banned_while_thinking)
        # xgrammar compiles in a worker process; start it now rather than on the first
        # request that needs it (a cold worker start is seconds of that request's deadline).
        threading.Thread(target=self._warm_up, name="thinkstruct-warm-up", daemon=True).start()
        logger.info(
            "thinkstruct backend: strict=%s, compile deadline %.0f s, cache %d bytes, reasoning family %s",
            self.service.settings.strict,
            self.service.settings.compile_timeout_s,
            self.service.settings.cache_bytes,
            self.family.name if self.family else None,
        )

    def _warm_up(self) -> None:
        try:
            self.service.compiler.warm_up(("xgrammar",))
        except Exception as error:  # noqa: BLE001  # the first compile starts it instead
            logger.warning("thinkstruct: the xgrammar compile worker did not start ahead: %s", error)

    def compile_grammar(
        self, request_type: Any, grammar_spec: str, stop_token_ids: Any = None
    ) -> ThinkstructGrammar:
        compiled = self.service.compile(constraint_of(request_type.name, grammar_spec))
        return ThinkstructGrammar(compiled, compiled.matcher)

    def grammar_for(self, request: Any) -> ThinkstructGrammar:
        """The grammar of one of vLLM's requests (its structured-output key, reasoning
        state, token limits)."""
        structured = request.structured_output_request
        kind, spec = structured.structured_output_key
        compiled = self.service.compile(constraint_of(kind.name, spec))
        family = self.family
        if family is None or not self._thinks(request, family):
            return ThinkstructGrammar(compiled, compiled.matcher, request_id=request.request_id)
        budget = self._budget(request.sampling_params)

        def matcher() -> GrammarMatcher:
            return compiled.matcher(
                reasoning=True,
                max_reasoning_tokens=budget,
                banned_ids_while_thinking=self._banned,
                end_tag=family.think_end,
            )

        return ThinkstructGrammar(compiled, matcher, request_id=request.request_id)

    def _thinks(self, request: Any, family: ReasoningFamily) -> bool:
        """Whether the output starts in a thought: as vLLM's API server decided with this
        family's parser (``reasoning_ended``), else read off the prompt."""
        ended = request.structured_output_request.reasoning_ended
        if ended is not None:
            return not ended
        kwargs = (request.structured_output_request.reasoning_parser_kwargs or {}).get("chat_template_kwargs")
        tokenizer = self.service.tokenizer
        bounds = ThoughtBounds(family, tokenizer.decode, enabled=family.enabled(kwargs))
        return not bounds.has_ended(request.prompt_token_ids or [])

    def _budget(self, params: Any) -> int | None:
        """Thinking tokens before the end tag is forced: the request's
        ``thinking_token_budget``, else the plugin's share of ``max_tokens`` less the tag."""
        own = getattr(params, "thinking_token_budget", None)
        if own is not None:
            return int(own)
        if params.max_tokens is None:
            return None
        share = self.service.settings.reasoning_share
        return max(1, math.floor(share * int(params.max_tokens)) - self._end_tag_tokens)

    def allocate_token_bitmask(self, max_num_seqs: int) -> torch.Tensor:
        return allocate_bitmask(max_num_seqs, self.vocab_size)

    def destroy(self) -> None:
        """The compile service lives as long as the process (the API server's validation
        shares it); nothing to release per backend."""


__all__ = ["BACKEND_NAME", "ThinkstructBackend", "ThinkstructGrammar", "reasoning_family"]
