# Two entry points (see README): `make run` sets up and runs the daemon on its embedded
# default; `make test` sets up and runs the whole test suite. Both build .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH ?= torch==2.13.0
# Two pytest-xdist workers, whatever the core count: the integration tests mostly wait (on
# brokers, Redis, daemons), so two halve the suite on 2 cores, and more would make their waits
# compete for the CPU. `make test PYTEST_ARGS=...` replaces it (`PYTEST_ARGS=-p no:xdist`: one).
PYTEST_ARGS ?= -n 2

.PHONY: setup run test test-engines lint bench clean services-start services-stop services-status check-deploy

$(STAMP): pyproject.toml setup.py stats/native/_replay.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# CPU build of torch first (an unpinned torch pulls a multi-GB CUDA build); on a GPU
	# machine run `make setup TORCH=torch` (or any CUDA wheel spec) instead.
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[test,bench,classifier]"
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/kvcast run

# The integration tests use a real Redis and Kafka broker: scripts/services.sh starts what does
# not answer yet, runs pytest, stops what it started (also on failure) and keeps pytest's status.
# --durations: the 25 slowest tests go into the log, the first place to look when the suite grows.
test: $(STAMP)
	bash scripts/system_deps.sh
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	bash scripts/check_deploy.sh install
	bash scripts/services.sh run $(BIN)/pytest $(PYTEST_ARGS) --durations=25
	$(MAKE) test-engines

# The adapters against the engines' released wheels, each in a venv of its own
# (scripts/engine_venv.sh); KVCAST_ENGINE_TESTS names the engine that venv must have.
ENGINE_PYTEST = -m pytest -p no:cacheprovider --confcutdir=tests/engines tests/engines
test-engines:
	bash scripts/engine_venv.sh vllm .venv-vllm
	KVCAST_ENGINE_TESTS=vllm .venv-vllm/bin/python $(ENGINE_PYTEST)
	bash scripts/engine_venv.sh sglang .venv-sglang
	KVCAST_ENGINE_TESTS=sglang .venv-sglang/bin/python $(ENGINE_PYTEST)

# The deploy/ checks alone (tests/deploy; promtool, kubectl, ... installed first when missing).
check-deploy: $(STAMP)
	bash scripts/check_deploy.sh

services-start services-stop services-status: $(STAMP)
	bash scripts/services.sh $(@:services-%=%)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: $(STAMP)
	$(BIN)/kvcast bench

clean:
	bash scripts/services.sh stop
	rm -rf .services $(VENV) .venv-vllm .venv-sglang .pytest_cache .ruff_cache .hypothesis
