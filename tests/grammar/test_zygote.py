"""Compile workers forked from the process's zygote (grammar/service/zygote.py): every
worker of every pool is its child, a killed worker's replacement is forked from the same
zygote, a zygote that dies is replaced, and the last pool to close stops it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest

from polling import wait_until
from thinkstruct.grammar.constraint import Constraint
from thinkstruct.grammar.service import zygote
from thinkstruct.grammar.service.compiler import CompilerConfig, GrammarCompiler
from thinkstruct.tokenizer import Tokenizer


def _schema(name: str) -> Constraint:
    return Constraint.json_schema(
        {"type": "object", "properties": {name: {"type": "integer"}}, "required": [name]}
    )


def _parent(pid: int) -> int:
    return psutil.Process(pid).ppid()


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture(scope="module")
def compiler(tokenizer: Tokenizer) -> Iterator[GrammarCompiler]:
    """One compiler for the module's tests (each leaves it able to compile: killed workers
    and a killed zygote are replaced)."""
    with GrammarCompiler(tokenizer, CompilerConfig(worker_processes=2, inline_compile_bytes=0)) as c:
        yield c


def test_every_worker_of_every_pool_is_forked_by_one_zygote(compiler: GrammarCompiler) -> None:
    compiler.warm_up(("xgrammar", "llguidance"))
    parent = zygote.zygote_pid()
    assert parent is not None and _parent(parent) == os.getpid()
    workers = compiler.worker_pids()
    assert len(workers) == 4
    assert {_parent(pid) for pid in workers} == {parent}


def test_a_killed_worker_is_replaced_by_a_fork_that_compiles(compiler: GrammarCompiler) -> None:
    compiler.warm_up(("xgrammar",))
    parent = zygote.zygote_pid()
    for round in range(3):
        killed = compiler.worker_pids()
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        wait_until(lambda k=killed: all(_gone(pid) for pid in k), "the killed workers are gone")
        compiled = compiler.compile(_schema(f"k{round}"), backend="xgrammar")
        assert compiled.backend == "xgrammar"
        fresh = compiler.worker_pids()
        assert fresh and not set(fresh) & set(killed)
        assert {_parent(pid) for pid in fresh} == {parent}
    assert zygote.zygote_pid() == parent  # one zygote served every replacement


def test_a_dead_zygote_is_started_again_and_its_pool_carries_on(compiler: GrammarCompiler) -> None:
    compiler.warm_up(("xgrammar",))
    first = zygote.zygote_pid()
    assert first is not None
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: _gone(first), "the zygote is gone")
    for pid in compiler.worker_pids():  # its workers live on: kill them too
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not compiler.worker_pids(), "the pool saw its workers die")
    compiled = compiler.compile(_schema("again"), backend="xgrammar")
    assert compiled.backend == "xgrammar"
    second = zygote.zygote_pid()
    assert second is not None and second != first
    assert {_parent(pid) for pid in compiler.worker_pids()} == {second}


#: In a process of its own (this one may hold other pools): two compilers, the inner one
#: closed first; prints the zygote and workers at each point as JSON.
_CLOSING = """
import json, time, psutil
from thinkstruct.grammar.service import zygote
from thinkstruct.grammar.service.compiler import CompilerConfig, GrammarCompiler
from thinkstruct.grammar.constraint import Constraint
from thinkstruct.tokenizer import Tokenizer
tokenizer, config = Tokenizer.default(), CompilerConfig(inline_compile_bytes=0)
seen = {}
with GrammarCompiler(tokenizer, config) as outer:
    outer.warm_up(("xgrammar",))
    with GrammarCompiler(tokenizer, config) as inner:
        inner.warm_up(("xgrammar",))
        seen["zygote"] = zygote.zygote_pid()
        seen["inner"] = inner.worker_pids()
    seen["zygote_after_inner"] = zygote.zygote_pid()
    seen["outer_compiled"] = outer.compile(Constraint.regex("[a-z]+"), backend="xgrammar").backend
    seen["outer"] = outer.worker_pids()
seen["zygote_at_end"] = zygote.zygote_pid()
def running():
    return [p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
deadline = time.monotonic() + 30
while running() and time.monotonic() < deadline:
    time.sleep(0.05)
seen["running_at_end"] = running()
print(json.dumps(seen))
"""


def test_the_last_pool_to_close_stops_the_zygote() -> None:
    done = subprocess.run([sys.executable, "-c", _CLOSING], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["zygote"] is not None and seen["zygote_after_inner"] == seen["zygote"]
    assert seen["outer_compiled"] == "xgrammar" and seen["outer"] and seen["inner"]
    assert seen["zygote_at_end"] is None
    # Nothing the compilers started outlives them.
    assert seen["running_at_end"] == []
