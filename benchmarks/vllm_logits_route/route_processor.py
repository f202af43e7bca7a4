"""The route not taken, kept to measure it: thinkstruct's grammars as a vLLM *logits
processor* (``--logits-processors route_processor:GrammarLogitsProcessor``), the public
extension point the plugin could have used instead of a structured-output backend.

A request names its schema in ``vllm_xargs`` (``{"thinkstruct_json": "<schema>"}``): vLLM's
own structured-output fields would go to vLLM's backends first. The processor compiles when
the request joins the batch (``update_state`` runs on the engine's step, so the batch waits
for the compile), follows each row's output tokens and masks its logits before sampling.
``benchmarks/vllm_routes.py`` starts vLLM with it and measures it against the backend route.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor

from thinkstruct.grammar.constraint import Constraint
from thinkstruct.grammar.runtime.bitmask import allocate_bitmask, apply_bitmask_inplace
from thinkstruct.integrations.vllm.grammar import RequestGrammar
from thinkstruct.integrations.vllm.service import plugin_compiler

KEY = "thinkstruct_json"


class GrammarLogitsProcessor(LogitsProcessor):  # type: ignore[misc]
    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        model = vllm_config.model_config
        self.vocab_size = model.get_vocab_size()
        self.service = plugin_compiler(str(model.tokenizer), self.vocab_size)
        # batch index -> (grammar, the row's live output ids, how many were fed)
        self.rows: dict[int, tuple[RequestGrammar, list[int], list[int]]] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is not None:
            for index in batch_update.removed:
                self.rows.pop(index, None)
            for index, params, _prompt, output_ids in batch_update.added:
                spec = (params.extra_args or {}).get(KEY) if params is not None else None
                self.rows.pop(index, None)
                if spec:
                    compiled = self.service.compile(Constraint.json_schema(spec))
                    self.rows[index] = (RequestGrammar(compiled, compiled.matcher), output_ids, [0])
            for a, b, direction in batch_update.moved:
                row_a, row_b = self.rows.pop(a, None), self.rows.pop(b, None)
                if row_a is not None:
                    self.rows[b] = row_a
                if row_b is not None and direction.name == "SWAP":
                    self.rows[a] = row_b
        for grammar, output_ids, fed in self.rows.values():
            new = output_ids[fed[0] :]
            if new:
                grammar.accept_tokens("", new)
                fed[0] += len(new)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        indices = sorted(i for i in self.rows if i < logits.shape[0])
        bitmask = allocate_bitmask(len(indices), self.vocab_size)
        for k, index in enumerate(indices):
            grammar = self.rows[index][0]
            if not grammar.is_terminated():
                grammar.fill_bitmask(bitmask, k)
        apply_bitmask_inplace(logits, bitmask, indices=indices)
        return logits
