"""Fixtures of the server tests: real servers, each engine built once per session.

The tiny random-weight DeepSeek-V4 model (native ``<think>`` tokens, gibberish text, fast)
serves the protocol tests; the embedded SmolLM2 the tests where the answers' quality
matters. Tests talk to the servers with the official ``openai`` client and with httpx.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from server_harness import ManualClock, RunningServer, serving, start_engine, stop_engine

from thinkstruct.server import ServerSettings

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "engine"))  # tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_dir: Path) -> Iterator[Any]:
    from thinkstruct.engine import load_model

    # int8 weights on the compiled kernels, as `thinkstruct serve` loads it: a row gets the
    # same numbers in any batch (float32's small-batch kernels do not), which the seed tests
    # rely on, and a token costs a third of bfloat16's here.
    engine = start_engine(
        load_model(tiny_model_dir, quantize="int8-weights", progress=False), max_batch=8, max_queue=64
    )
    yield engine
    stop_engine(engine)


@pytest.fixture(scope="session")
def tiny_server(tiny_engine: Any) -> Iterator[RunningServer]:
    """The tiny model behind a server with small limits (so the limits can be hit)."""
    settings = ServerSettings(max_body_bytes=1 << 20, max_prompt_tokens=2000, max_n=4, default_max_tokens=16)
    with serving(tiny_engine, settings) as server:
        yield server


#: Compile timeout (seconds) of ``short_timeout_server``: short, so hostile and slow
#: constraints are answered quickly, and above what the valid constraints of its tests
#: take on a loaded 2-core machine (llguidance on a thread: milliseconds; xgrammar,
#: compiled in a worker and loaded here: up to about 3 s).
SHORT_COMPILE_TIMEOUT_S = 5.0
#: Its failure memory, in seconds of its :class:`ManualClock` (which only a test moves).
SHORT_FAILURE_TTL_S = 2.0


@pytest.fixture(scope="session")
def short_timeout_server(tiny_model_dir: Path) -> Iterator[RunningServer]:
    """The tiny model behind a server whose compiler gives up after
    :data:`SHORT_COMPILE_TIMEOUT_S` (the hostile-constraint and isolation tests), with
    the default 8 MiB body limit, so large constraints reach the compiler's own limits.
    Its failure memory runs on a :class:`ManualClock` (``compiler.clock``)."""
    from thinkstruct.engine import Engine, EngineConfig, load_model
    from thinkstruct.grammar.service.compiler import CompilerConfig, GrammarCompiler

    # int8 weights on the compiled kernels: a row's numbers are the same in any batch, so a
    # seeded answer is the same whatever else the server is doing.
    model = load_model(tiny_model_dir, quantize="int8-weights", progress=False)
    compiler = GrammarCompiler(
        model.tokenizer,
        CompilerConfig(timeout_s=SHORT_COMPILE_TIMEOUT_S, failure_ttl_s=SHORT_FAILURE_TTL_S),
        clock=ManualClock(),
    )
    engine = Engine(model, config=EngineConfig(max_batch=8, max_queue=64), compiler=compiler)
    engine.start()
    # outlines is left cold: auto tries it last, and no hostile case gets that far (one
    # that does starts its worker then, and times out meanwhile).
    compiler.warm_up(("llguidance", "xgrammar"), timeout_s=120.0)
    try:
        with serving(engine, ServerSettings(default_max_tokens=8)) as server:
            yield server
    finally:
        stop_engine(engine)


@pytest.fixture(scope="session")
def smol_engine() -> Iterator[Any]:
    from thinkstruct.engine import load_model

    # int8 weights, as serve loads a model without GGUF blocks (the embedded one it runs on
    # its GGUF's blocks; tests/server/test_gguf_serve.py serves that).
    engine = start_engine(
        load_model(None, quantize="int8-weights", progress=False), max_batch=8, max_queue=64
    )
    yield engine
    stop_engine(engine)


@pytest.fixture(scope="session")
def smol_server(smol_engine: Any) -> Iterator[RunningServer]:
    with serving(smol_engine, ServerSettings(default_max_tokens=64)) as server:
        yield server


@pytest.fixture(scope="session")
def smol(smol_server: RunningServer) -> openai.OpenAI:
    return smol_server.openai()


@pytest.fixture(scope="session")
def tiny(tiny_server: RunningServer) -> openai.OpenAI:
    return tiny_server.openai()
