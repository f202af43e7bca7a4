"""thinkstruct check: the schema lint tool, run as users run it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from thinkstruct.cli import main

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_every_backend_compiles_the_example_and_accepts_the_answer(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["check", str(EXAMPLES / "person.schema.json"), str(EXAMPLES / "person.json")])
    out = capsys.readouterr().out
    assert code == 0
    for backend in ("xgrammar", "llguidance", "outlines"):
        assert f"{backend}: compiles in " in out
    assert "auto (strict): compiles with llguidance in " in out
    assert "checked" not in out  # the grammar enforces all of it
    assert out.count("person.json: accepted") == 4


def test_auto_lists_checked_keywords_and_applies_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    schema = tmp_path / "tags.schema.json"
    schema.write_text(
        json.dumps({"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}})
    )
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text('{"tags":[1,2]}')
    bad.write_text('{"tags":[1,1]}')
    assert main(["check", str(schema), str(good), str(bad), "--backend", "auto"]) == 1
    out = capsys.readouterr().out
    assert "checked as values close: uniqueItems at /properties/tags/uniqueItems on /tags" in out
    assert "good.json: accepted" in out
    assert "bad.json: fails a check at character 11: uniqueItems at /tags" in out


def test_rejection_names_the_character(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    answer = tmp_path / "answer.json"
    prefix = '{"name": "Ada", "age": '
    answer.write_text(prefix + '"36"}')
    code = main(["check", str(EXAMPLES / "person.schema.json"), str(answer), "--backend", "llguidance"])
    out = capsys.readouterr().out
    assert code == 1
    assert f"rejected at character {len(prefix)}" in out  # the quote, not the space
    assert "⟨here⟩" in out


def test_unfinished_answer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    answer = tmp_path / "answer.json"
    answer.write_text('{"name": "Ada"')
    assert main(["check", str(EXAMPLES / "person.schema.json"), str(answer), "--backend", "xgrammar"]) == 1
    assert "ends before it is complete" in capsys.readouterr().out


def test_invalid_schema_is_reported_with_its_pointer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    schema = tmp_path / "bad.schema.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"a": {"type": "strnig"}}}))
    assert main(["check", str(schema), "--backend", "llguidance"]) == 1
    out = capsys.readouterr().out
    assert "/properties/a/type" in out and "unknown type" in out


def test_backend_that_cannot_compile_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    schema = tmp_path / "unique.schema.json"
    schema.write_text(json.dumps({"type": "array", "uniqueItems": True}))
    assert main(["check", str(schema), "--backend", "llguidance"]) == 1
    assert "llguidance: does not compile" in capsys.readouterr().out


def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(EXAMPLES / "person.schema.json"), "--backend", "nope"]) == 2
    assert main(["check", str(tmp_path / "missing.json")]) == 2
    assert "error:" in capsys.readouterr().err


def test_console_script_runs() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "thinkstruct.cli",
            "check",
            str(EXAMPLES / "person.schema.json"),
            str(EXAMPLES / "person_bad.json"),
            "--backend",
            "llguidance",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1
    assert "rejected at character" in result.stdout


def test_engine_sizes_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    for flag in ("--max-batch", "--prefill-chunk", "--max-queue"):
        with pytest.raises(SystemExit) as exit_info:
            main(["serve", flag, "0"])
        assert exit_info.value.code == 2
        assert flag in capsys.readouterr().err


def test_memory_budgets_reach_the_engine_and_the_compiler(capsys: pytest.CaptureFixture[str]) -> None:
    """``--kv-cache-bytes`` bounds the running requests, ``--prefix-cache-bytes`` the
    prefix cache (0 keeps none), ``--grammar-cache-bytes`` the compiled grammars; a KV
    budget of 0 (which once turned the prefix cache off) is refused naming the flag that
    does that now."""
    from thinkstruct.cli.parsing import build_parser, engine_spec

    args = build_parser("t").parse_args(
        ["serve", "--kv-cache-bytes", "512M", "--prefix-cache-bytes", "0", "--grammar-cache-bytes", "64M"]
    )
    spec = engine_spec(args)
    assert (spec.engine.kv_cache_bytes, spec.engine.prefix_cache_bytes) == (512 << 20, 0)
    assert spec.compiler.cache_bytes == 64 << 20
    defaults = engine_spec(build_parser("t").parse_args(["serve"]))
    assert (defaults.engine.kv_cache_bytes, defaults.engine.prefix_cache_bytes) == (2 << 30, 1 << 30)
    assert defaults.compiler.cache_bytes == 2 << 30
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--kv-cache-bytes", "0"])
    assert exit_info.value.code == 2
    assert "--prefix-cache-bytes" in capsys.readouterr().err


def test_the_kv_cache_dtype_reaches_the_engine(capsys: pytest.CaptureFixture[str]) -> None:
    from thinkstruct.cli.parsing import build_parser, engine_spec

    parse = build_parser("t").parse_args
    assert engine_spec(parse(["serve", "--kv-cache-dtype", "float32"])).engine.kv_cache_dtype == "float32"
    assert engine_spec(parse(["serve"])).engine.kv_cache_dtype is None  # float16 on the kernels
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--kv-cache-dtype", "bfloat16"])
    assert exit_info.value.code == 2
    assert "--kv-cache-dtype" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags, quantize",
    [
        ((), "auto"),
        (("--quantize", "none"), None),
        (("--quantize", "int8"), "int8"),
        (("--quantize", "gguf"), "gguf"),
    ],
)
def test_models_load_quantized_as_the_model_suits_unless_told_otherwise(
    monkeypatch, tmp_path, flags, quantize
) -> None:
    """serve and generate let the loader choose by default (a GGUF's own blocks, or int8
    weights: :func:`default_quantize`); ``--quantize none`` keeps ``--dtype``'s weights."""
    from thinkstruct.engine import assembly

    seen: dict[str, object] = {}

    def load_model(path, **kwargs):
        seen.update(kwargs)
        raise ValueError("stop here: the model is not needed")

    monkeypatch.setattr(assembly, "load_model", load_model)
    schema = tmp_path / "schema.json"
    schema.write_text('{"type": "boolean"}')
    with pytest.raises(ValueError, match="stop here"):
        main(["generate", "--schema", str(schema), *flags, "hello"])
    assert seen["quantize"] == quantize and seen["dtype"] == "bfloat16"


@pytest.mark.parametrize("command", [[], ["check"], ["serve"], ["generate"]])
def test_every_commands_help_prints(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """``--help`` of each command (argparse formats help strings with %: a bare one broke it)."""
    with pytest.raises(SystemExit) as exited:
        main([*command, "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: thinkstruct")
    if command == ["generate"]:
        assert "a thought of 50% of --max-tokens" in " ".join(out.split())


def test_the_step_latency_target_reaches_the_engine(capsys: pytest.CaptureFixture[str]) -> None:
    """``--step-latency-target-ms`` sets the engine's target in seconds (default the
    engine's), 0 keeps a fixed batch of ``--max-batch``; a negative one is refused naming
    the flag."""
    from thinkstruct.cli.parsing import build_parser, engine_spec
    from thinkstruct.engine.core.config import EngineConfig

    parser = build_parser("t")
    assert engine_spec(parser.parse_args(["serve"])).engine.step_latency_target_s == pytest.approx(
        EngineConfig().step_latency_target_s
    )
    spec = engine_spec(parser.parse_args(["serve", "--step-latency-target-ms", "40", "--max-batch", "32"]))
    assert spec.engine.step_latency_target_s == pytest.approx(0.04)
    assert spec.engine.max_batch == 32
    assert (
        engine_spec(
            parser.parse_args(["serve", "--step-latency-target-ms", "0"])
        ).engine.step_latency_target_s
        is None
    )
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--step-latency-target-ms", "-5"])
    assert exit_info.value.code == 2
    assert "--step-latency-target-ms" in capsys.readouterr().err


def test_compile_workers_reach_the_compiler(capsys: pytest.CaptureFixture[str]) -> None:
    """``--compile-workers`` sets the compile processes per backend (0: threads only);
    a negative count is refused naming the flag."""
    from thinkstruct.cli.parsing import build_parser, engine_spec

    parser = build_parser("t")
    assert engine_spec(parser.parse_args(["serve"])).compiler.worker_processes == 1
    assert engine_spec(parser.parse_args(["serve", "--compile-workers", "0"])).compiler.worker_processes == 0
    assert (
        engine_spec(parser.parse_args(["generate", "--compile-workers", "2", "hi"])).compiler.worker_processes
        == 2
    )
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--compile-workers", "-1"])
    assert exit_info.value.code == 2
    assert "--compile-workers" in capsys.readouterr().err
