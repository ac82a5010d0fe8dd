# Two entry points (see README): `make run` sets up and runs the daemon on its embedded
# default; `make test` sets up and runs the whole test suite. Both build .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup run test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[test,bench]"
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/kvcast run

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: $(STAMP)
	$(BIN)/kvcast bench

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
