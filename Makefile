# The two commands of the README:
#   make demo   — the example project: embedded PostgreSQL, workers draining real tasks
#   make test   — the whole test-suite (SQLite, PostgreSQL, MariaDB when usable, Django 5.2) + linters
SHELL := /bin/bash
VENV ?= .venv
# Where `make clean-db` looks for the example's embedded PostgreSQL (as scripts/demo.sh).
EMBEDDED_PG_DIR ?= example_project/var/pg

.PHONY: venv test test-fast lint demo serve bench bench-peers racelab clean-db dist check-fresh-states mutants

venv:
	@scripts/bootstrap.sh $(VENV) >/dev/null

test: venv
	@VENV=$(VENV) scripts/test.sh

# Inner loop: lint + SQLite + PostgreSQL without the tests marked slow (see docs/testing.md).
test-fast: venv
	@VENV=$(VENV) TASKCLAIM_FAST=1 scripts/test.sh

lint: venv
	@$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check django_taskclaim tests example_project benchmarks && $(VENV)/bin/mypy

demo:
	@VENV=$(VENV) scripts/demo.sh

serve:
	@VENV=$(VENV) scripts/demo.sh serve

bench: venv
	@$(VENV)/bin/python benchmarks/run.py $(ARGS)

# Our worker beside PgQueuer, same database, same run; the claimers sweep (PostgreSQL).
bench-peers: venv
	@$(VENV)/bin/pip install -q --group bench
	@$(VENV)/bin/python benchmarks/peers.py $(ARGS)

racelab:
	@VENV=$(VENV) scripts/demo.sh racelab

# Stops the embedded PostgreSQL servers the demo and the tests leave running.
clean-db:
	@if [ -x $(VENV)/bin/python ]; then \
	  $(VENV)/bin/python -c "import sys; from django_taskclaim import embedded; [embedded.stop(d) for d in sys.argv[1:]]" var/embedded-pg "$(EMBEDDED_PG_DIR)" \
	    && echo "stopped the embedded PostgreSQL servers of var/embedded-pg and $(EMBEDDED_PG_DIR) (if they ran)"; \
	else echo "no $(VENV): nothing was started"; fi

# sdist and wheel in dist/ (python -m build, with the hatchling of the venv: works offline).
dist: venv
	@rm -rf dist && $(VENV)/bin/python -m build --no-isolation --outdir dist . && ls -l dist

# Fresh-machine states of `make test` (see docs/testing.md); not part of `make test`.
check-fresh-states:
	@scripts/check-fresh-states.sh $(STATES)

# Mutation testing of the safety core with mutmut (docs/testing.md, "Mutation testing");
# not part of `make test`. FILES=django_taskclaim/rules.py limits it to those modules.
mutants: venv
	@$(VENV)/bin/pip install -q --group mutants
	@VENV=$(VENV) scripts/mutants.sh $(FILES)
