# runwire: `make run` shows a run streaming; `make test` installs and passes every test.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_WORKERS ?= 2
START_TIMEOUT ?=
CLUSTER ?=
STACK_OPTIONS := $(if $(START_TIMEOUT),--start-timeout $(START_TIMEOUT)) $(if $(CLUSTER),--cluster $(CLUSTER))

.PHONY: install run up down logs status browser bench-peers test test-soak security fuzz lint typecheck unit integration chaos schemas schema docs bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[server,dev]'
	touch $(STAMP)

install: $(STAMP)

## Start the local stack, stream a demo run, keep everything up until Ctrl-C.
run: $(STAMP)
	$(BIN)/python -m runwire.infra.stack run $(STACK_OPTIONS)

## Start the local stack in the background; returns once every service answers its
## health request (at most START_TIMEOUT seconds, 60 by default); writes .runwire/env.
## CLUSTER=3: on a JetStream cluster of three nats-servers, two replicas of every service.
up: $(STAMP)
	$(BIN)/python -m runwire.infra.stack up $(STACK_OPTIONS)

## Stop every process `make up` or `make run` started.
down:
	@if [ -x $(BIN)/python ]; then $(BIN)/python -m runwire.infra.stack down; fi

## Follow the services' logs.
logs: $(STAMP)
	$(BIN)/python -m runwire.infra.stack logs

status: $(STAMP)
	$(BIN)/python -m runwire.infra.stack status

## ruff, then the house's measures: module sizes, repeated blocks, import circles, the
## README's length (infra/lint.py says which limits fail the step), and whether
## services/runtime/schema.sql is what the migrations make (infra/schema.py).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m runwire.infra.lint
	$(BIN)/python -m runwire.infra.schema --check

## mypy over the `runwire` namespace, seen through a tree of links in .typecheck/ (mypy
## cannot follow the folder mapping of pyproject.toml by itself).
typecheck: $(STAMP)
	@rm -rf .typecheck && mkdir -p .typecheck/runwire
	@for entry in services/*; do ln -s ../../$$entry .typecheck/runwire/; done
	@ln -s ../../contracts ../../infra .typecheck/runwire/
	$(BIN)/mypy

## Chromium for the console's browser tests: Debian's package, installed when missing.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
		echo "Installing Chromium (Debian's chromium) for the browser tests ..."; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
		|| { echo "cannot install Chromium: install Debian's chromium package, then make test again"; exit 1; }; }

## Lint, types, then every test (unit, integration, chaos) in parallel.
test: lint typecheck browser
	$(BIN)/pytest -n $(PYTEST_WORKERS) -q -p no:cacheprovider

unit: $(STAMP)
	$(BIN)/pytest -q -m unit

integration: $(STAMP)
	$(BIN)/pytest -n $(PYTEST_WORKERS) -q -m integration

chaos: $(STAMP)
	$(BIN)/pytest -n $(PYTEST_WORKERS) -q -m chaos

## The attacks alone: as a tenant, an outsider and a stolen service identity.
security: $(STAMP)
	$(BIN)/pytest -n $(PYTEST_WORKERS) -q -m security

## 500 runs while executors are killed at random; prints recoveries and their times.
test-soak: $(STAMP)
	$(BIN)/pytest -q -s -m soak

## 10,000 random bodies on every command subject (make test tries 300, the same each
## time): every reply documented, nothing created by a refused submit, nothing stopped.
fuzz: $(STAMP)
	RUNWIRE_FUZZ_EXAMPLES=$(or $(FUZZ_EXAMPLES),10000) $(BIN)/pytest -q -p no:cacheprovider tests/integration/test_command_fuzz.py

## Write the JSON Schema of every wire model to contracts/schema/.
schemas: $(STAMP)
	$(BIN)/python -m runwire.contracts.schemas

## Write services/runtime/schema.sql: the schema the migrations and sql/functions/ make of
## an empty database (pg_dump of a fresh one); make lint fails when it is not current.
schema: $(STAMP)
	$(BIN)/python -m runwire.infra.schema

## Write the AsyncAPI document of the services' FastStream applications to docs/asyncapi.json and
## docs/asyncapi.html, and check it with the official AsyncAPI parser (npm, into docs/validate/);
## then the generated parts of docs/configuration.md (settings) and docs/cli.md (the parser).
docs: $(STAMP)
	$(BIN)/python -m runwire.asyncapi
	$(BIN)/python -m runwire.infra.docs

## Benchmarks (issue 7) in their own virtualenv with the peers (DBOS, pgqueuer):
## quick by default, `make bench BENCH_FULL=1` for larger N. Writes bench/results/.
BENCH_VENV := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed
BENCH_FULL ?=

$(BENCH_STAMP): pyproject.toml
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install --quiet --upgrade pip
	$(BENCH_VENV)/bin/pip install --quiet -e '.[server]' matplotlib psutil
	# A peer that does not install is reported as not measured in the table.
	$(BENCH_VENV)/bin/pip install --quiet dbos || echo "bench: dbos did not install"
	$(BENCH_VENV)/bin/pip install --quiet pgqueuer || echo "bench: pgqueuer did not install"
	$(BENCH_VENV)/bin/pip install --quiet redis || echo "bench: the redis client did not install"
	touch $(BENCH_STAMP)

## The streaming peer: Debian's redis-server (the bench reports it not measured without).
bench-peers:
	@command -v redis-server >/dev/null 2>&1 || { \
		echo "Installing Debian's redis-server for the streaming peer ..."; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null \
		|| echo "bench: redis-server did not install"; }

bench: $(BENCH_STAMP) bench-peers
	BENCH_FULL=$(BENCH_FULL) $(BENCH_VENV)/bin/python -m bench

clean: down
	rm -rf $(VENV) .runwire
