# agent-outbox: every target sets itself up; a fresh machine needs only Python 3.11+.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# pip puts uv into the venv, and uv installs the project: it resolves and installs several times
# faster than pip and compiles the bytecode on every core, where pip compiled on one
# (docs/testing.md). A fresh machine still needs only Python.
INSTALL := $(BIN)/uv pip install -q --python $(BIN)/python --compile-bytecode
PYTEST := $(BIN)/pytest -p no:cacheprovider
# Test processes (pytest-xdist), each with a private PostgreSQL server in memory. The tests
# mostly wait (for relays, HTTP servers, timeouts), so more processes than cores is fastest
# (docs/testing.md, "How this project's suite runs"). TEST_WORKERS=0: in this process.
# worksteal: a process that runs out of tests takes pending ones from a busy one, where the
# default hands out blocks at the end and one process ran on alone for a minute.
TEST_WORKERS ?= 6

.DEFAULT_GOAL := help
.PHONY: help setup setup-bench demo test lint bench soak clean

help: ## List the targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-11s %s\n", $$1, $$2}'

setup: $(STAMP) ## Create .venv and install the project with its dev extras.

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit("agent-outbox needs Python 3.11+; run: make PYTHON=python3.11 ..." if sys.version_info < (3, 11) else 0)'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip uv
	$(INSTALL) -e '.[dev]'
	@touch $@

setup-bench: setup ## setup, plus the bench extra (PgQueuer, asyncpg, matplotlib, psutil).
	$(INSTALL) -e '.[dev,bench]'

demo: setup ## Run the demo on the embedded PostgreSQL (or OUTBOX_DATABASE_URL).
	$(BIN)/outbox demo $(ARGS)

# A run starts about 200 Python processes (workers, relays, CLI calls, fixture servers): with
# PYTHONDONTWRITEBYTECODE set in the environment each one compiled this checkout's modules
# again, and each worker rewrote the asserts of every test module (about 4 s of CPU a
# worker). The caches go to __pycache__/ (ignored by git). On a fresh clone the workers still
# all compiled and rewrote at once, each for itself: one collection in one process first
# (once a venv) writes the caches they then read.
COLLECTED := $(VENV)/.collected
test: $(COLLECTED) ## Run the test suite (bounded chaos tests; no soak).
	PYTHONDONTWRITEBYTECODE= $(PYTEST) -m "not soak" -n $(TEST_WORKERS) --dist worksteal $(ARGS)

$(COLLECTED): $(STAMP)
	PYTHONDONTWRITEBYTECODE= $(PYTEST) -m "not soak" --collect-only -q > /dev/null
	@touch $@

# mypy and import-linter read the package as the wheel installs it: one `outbox` with relay/,
# server/, commands/ and sql/ inside (docs/how-it-works.md, "What the wheel installs"). Neither
# follows the editable install's mapping, so they read a tree of hard links made in .venv/;
# mypy's messages name the checkout's files.
TREE := $(VENV)/tree

lint: setup ## ruff, ruff format --check, mypy strict, import-linter layer contracts.
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@rm -rf $(TREE) && mkdir -p $(TREE) && cp -al outbox demo $(TREE)/ && \
		for d in relay server commands sql; do cp -al $$d $(TREE)/outbox/$$d; done
	@bash -o pipefail -c '$(BIN)/mypy | sed -E "s#^$(TREE)/outbox/(relay|server|commands|sql)/#\1/#; s#^$(TREE)/##"'
	cd $(TREE) && ../bin/lint-imports ../../pyproject.toml

bench: setup-bench ## Throughput and latency beside a raw SKIP LOCKED baseline (prints a table).
	$(BIN)/python -m bench $(ARGS)

soak: setup-bench ## The long chaos/soak tests; the soak's soak.md and soak.png go to bench/results/soak.
	OUTBOX_SOAK_DIR=$${OUTBOX_SOAK_DIR:-bench/results/soak} $(PYTEST) -m soak $(ARGS)

clean: ## Stop the embedded PostgreSQL and remove .venv and .outbox.
	-$(BIN)/outbox db stop
	rm -rf $(VENV) .outbox
