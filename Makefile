# Two entry points for a fresh machine: `make tune` (set up, then run the main job) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

.PHONY: setup tune test test-e2e test-all test-fast lint
setup: $(VENV)/.installed

tune: $(VENV)/.installed
	$(BIN)/kernsearch tune gemm --report  # prints the path of the study's HTML report

# Three workers that take whole test files, the longest first (--dist loadfile, in the order tests/schedule.py
# gives: the classic longest-first list schedule, so a run ends on short files, not on a long one started last while
# the other workers idle: they now end within a second of each other), and on two cores the third runs while the
# others wait on subprocesses and servers (171 % -> 191 % of CPU at -n 3). Every test but the e2e lane (real Prefect and
# PostgreSQL servers, racing tune processes, the full sizes of sweeps make test runs smaller; see
# benchmarks/test_suite_time.txt for its time on an idle 2-core machine with a cold compile cache, issue 42).
test: $(VENV)/.installed
	$(BIN)/python -m pytest -q -n 3 --dist loadfile --no-loadscope-reorder --durations=30 -m "not e2e"

# The long end-to-end checks alone (each starts its own servers: minutes).
test-e2e: $(VENV)/.installed
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=30 -m e2e

# Every test, both lanes in one session (CI: .ci/run).
test-all: $(VENV)/.installed
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=30

# The developers' lane (< 2 min on an idle 2-core machine): unit tests, two workers, no slow/GPU tests.
test-fast: $(VENV)/.installed
	$(BIN)/python -m pytest -q -m "not slow and not gpu" -n 2 --dist loadfile --no-loadscope-reorder

# Static checks, run by CI before the tests: ruff on the repository, mypy --strict on search/ (pyproject.toml),
# radon's complexity (boolean operands and comprehensions counted) at most 15 a function (tools/complexity.py).
lint: $(VENV)/.installed
	$(BIN)/python -m ruff check .
	$(BIN)/python -m mypy
	$(BIN)/python tools/complexity.py
