# The two commands a newcomer needs: `make demo` and `make test`.
# Each creates .venv on first use and installs what it needs into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint typecheck bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

## Warm the example workload into a local cache, then time a fresh training process on it.
demo: $(STAMP)
	$(BIN)/compilecache demo

## The whole suite, as CI runs it.
test: $(STAMP)
	$(BIN)/python -m pytest

## Only the fast tests (no real JAX, no emulator, no subprocesses).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m 'not slow'

lint: $(STAMP)
	$(BIN)/ruff check operator tests bench examples
	$(BIN)/ruff format --check operator tests bench examples

typecheck: $(STAMP)
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/coldwarm.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache demo-cache
