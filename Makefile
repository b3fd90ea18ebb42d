# gpulease: `make server` runs the platform, `make test` sets up and runs every check.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# pytest-xdist workers for `make test`: the suite waits on servers, runners and browsers for
# much of its time, so two workers finish it sooner even on two cores (0: one process)
TEST_WORKERS ?= 2

.PHONY: server test setup setup-dev system-deps postgres lint typecheck pytest bench clean

# ---- the main job: the server with its web console on embedded defaults --------------------
server: setup
	scripts/system-deps.sh server
	$(BIN)/gpulease server

setup: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e .
	touch $@

# ---- the tests -------------------------------------------------------------------------------
test: setup-dev system-deps postgres lint typecheck pytest

setup-dev: $(VENV)/.installed-dev
$(VENV)/.installed-dev: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(VENV)/.installed $@

system-deps:
	scripts/system-deps.sh

postgres:
	scripts/ensure-postgres.sh

lint:
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples

typecheck:
	$(BIN)/mypy

pytest:
	$(BIN)/pytest -n $(TEST_WORKERS)

bench: setup-dev  # every benchmark; the table of figures goes to bench-report.md
	$(BIN)/python benchmarks/report.py --out bench-report.md

clean:
	rm -rf $(VENV) .cache test-artifacts .pytest_cache .mypy_cache .ruff_cache
