"""llama.cpp's side of a benchmark: a worker (:func:`alone.worker_main`) run by a Python
that has ``llama_cpp`` installed (llama-cpp-python; never a dependency of thinkstruct).

The job: ``{"model": GGUF path, "threads": N, "max_tokens": N, "warmup": [ids],
"workloads": {name: [[ids, schema or null], ...]}}``. Each prompt (token ids, already
rendered with the chat template) is generated greedily up to ``max_tokens`` or EOS, a
schema through llama.cpp's JSON-schema grammar (built once per schema, before timing).
Successive prompts share their common prefix's KV cache, as llama.cpp's server does.
The result: ``{"workloads": {name: {"tokens": generated, "seconds": wall, prompt
processing included}}, "threads": N}``.

    /tmp/llv/bin/python benchmarks/llama_cpp_worker.py < job.json
"""

from __future__ import annotations

import json
import time
from typing import Any

from alone import worker_main


def run(job: dict[str, Any]) -> dict[str, Any]:
    from llama_cpp import Llama, LlamaGrammar

    llm = Llama(model_path=job["model"], n_ctx=2048, n_threads=job["threads"], n_batch=512, verbose=False)
    grammars: dict[str, Any] = {}

    def generate(ids: list[int], schema: dict[str, Any] | None) -> int:
        grammar = None
        if schema is not None:
            key = json.dumps(schema, sort_keys=True)
            if key not in grammars:
                grammars[key] = LlamaGrammar.from_json_schema(key, verbose=False)
            grammar = grammars[key]
        out = 0
        for token in llm.generate(ids, temp=0.0, top_k=1, grammar=grammar, reset=True):
            if token == llm.token_eos() or out >= job["max_tokens"]:
                break
            out += 1
        return out

    schemas = {json.dumps(s, sort_keys=True): s for items in job["workloads"].values() for _, s in items if s}
    for schema in [None, *schemas.values()]:  # warm-up, and every grammar built before timing
        generate(job["warmup"], schema)
    results = {}
    for name, items in job["workloads"].items():
        tokens, seconds = 0, 0.0
        for ids, schema in items:
            start = time.perf_counter()
            tokens += generate(ids, schema)
            seconds += time.perf_counter() - start
        results[name] = {"tokens": tokens, "seconds": seconds}
    return {"workloads": results, "threads": job["threads"]}


if __name__ == "__main__":
    worker_main(run)
