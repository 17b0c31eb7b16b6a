# The two commands of the README:
#   make demo   — the example project: embedded PostgreSQL, workers draining real tasks
#   make test   — the whole test-suite (SQLite, PostgreSQL, MariaDB when reachable) + linters
SHELL := /bin/bash
VENV ?= .venv

.PHONY: venv test test-fast lint demo serve bench racelab clean-db

venv:
	@scripts/bootstrap.sh $(VENV) >/dev/null

test: venv
	@scripts/test.sh

test-fast: venv
	@TASKCLAIM_FAST=1 scripts/test.sh

lint: venv
	@$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check django_taskclaim tests && $(VENV)/bin/mypy

demo: venv
	@scripts/demo.sh

serve: venv
	@scripts/demo.sh serve

bench: venv
	@$(VENV)/bin/python benchmarks/run.py $(ARGS)

racelab: venv
	@scripts/demo.sh racelab

clean-db:
	@$(VENV)/bin/python -c "from django_taskclaim import embedded; embedded.stop('var/embedded-pg'); embedded.stop('example_project/var/pg')" || true
