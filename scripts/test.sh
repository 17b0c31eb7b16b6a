#!/usr/bin/env bash
# The README's test command (`make test`): lint, type-check, migrations check, then the
# suite on SQLite, PostgreSQL (local server, else embedded) and MariaDB (when reachable),
# then the core suite on Django 5.2 LTS. Prints one total line at the end.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
venv=$("$here/scripts/bootstrap.sh" "$here/.venv") || exit 1
py="$venv/bin/python"
logdir="$here/var/test-logs"; mkdir -p "$logdir"; rm -f "$logdir"/*.log
status=0
step() { printf '\n=== %s\n' "$*"; }

step "ruff, mypy, makemigrations --check"
"$venv/bin/ruff" check . || status=1
"$venv/bin/ruff" format --check --quiet django_taskclaim tests example_project benchmarks || { echo "ruff format: files need formatting (run: .venv/bin/ruff format .)"; status=1; }
"$venv/bin/mypy" || status=1
TASKCLAIM_TEST_DB=sqlite "$py" -m django makemigrations --check --dry-run --settings=tests.settings_tasks -v1 || status=1

reachable() { "$py" -c "import socket,sys; socket.create_connection(('$1', $2), 1)" 2>/dev/null; }

run_suite() {  # name, env..., then -- pytest args
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  step "pytest on $name"
  env "${envs[@]}" "$py" -m pytest "$@" 2>&1 | tee "$logdir/$name.log"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then status=1; fi
}

TASKS_TESTS=(--ds=tests.settings_tasks tests/test_tasks_backend.py tests/test_tasks_backend_worker.py)
run_suite sqlite TASKCLAIM_TEST_DB=sqlite -- -q
run_suite sqlite-tasks TASKCLAIM_TEST_DB=sqlite -- -q "${TASKS_TESTS[@]}"
run_suite postgresql TASKCLAIM_TEST_DB=postgres -- -q
run_suite postgresql-tasks TASKCLAIM_TEST_DB=postgres -- -q "${TASKS_TESTS[@]}"
if reachable 127.0.0.1 3306; then
  run_suite mariadb TASKCLAIM_TEST_DB=mariadb -- -q
  run_suite mariadb-tasks TASKCLAIM_TEST_DB=mariadb -- -q "${TASKS_TESTS[@]}"
else
  step "pytest on mariadb"
  echo "SKIPPED: MariaDB/MySQL tests — no server at 127.0.0.1:3306 (start one, or set DATABASE_URL=mysql://…)"
fi

step "core suite on Django 5.2 LTS"
dj52=$("$here/scripts/bootstrap.sh" "$here/.venv-dj52" "Django>=5.2,<5.3" "django-stubs<5.3") || status=1
if [ -n "${dj52:-}" ]; then
  "$dj52/bin/python" -c "import django; print('Django', django.get_version())"
  env TASKCLAIM_TEST_DB=postgres "$dj52/bin/python" -m pytest -q -p no:randomly \
    tests/test_claim.py tests/test_lifecycle.py tests/test_reaper.py tests/test_checks.py \
    tests/test_postgres.py 2>&1 | tee "$logdir/django52.log"
  rc=${PIPESTATUS[0]}; [ "$rc" -eq 0 ] || status=1
fi

# One total line over every pytest run above.
"$py" - "$logdir" <<'PY'
import pathlib, re, sys
tot = {"passed": 0, "failed": 0, "skipped": 0, "error": 0}
for log in sorted(pathlib.Path(sys.argv[1]).glob("*.log")):
    lines = [l for l in log.read_text(errors="replace").splitlines() if re.search(r"\d+ (passed|failed|skipped)", l)]
    if not lines:
        continue
    for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)", lines[-1]):
        tot["error" if word.startswith("error") else word] += int(n)
print()
print(f"total: {tot['passed']} passed, {tot['failed'] + tot['error']} failed, {tot['skipped']} skipped")
PY
exit $status
