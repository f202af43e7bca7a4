"""``import thinkstruct`` makes the engine's idle OpenMP threads sleep, not spin: it sets
``OMP_WAIT_POLICY`` before torch loads libgomp (which reads it once), and keeps a value
an operator already set."""

from __future__ import annotations

import os
import subprocess
import sys


def _policy_in_a_fresh_process(env: dict[str, str]) -> str:
    code = "import sys, thinkstruct, os; assert 'torch' in sys.modules; print(os.environ['OMP_WAIT_POLICY'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_import_sets_the_passive_policy() -> None:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    assert _policy_in_a_fresh_process(env) == "PASSIVE"


def test_an_operators_policy_is_kept() -> None:
    assert _policy_in_a_fresh_process({**os.environ, "OMP_WAIT_POLICY": "ACTIVE"}) == "ACTIVE"
