#!/usr/bin/env bash
# Mutation testing of the safety core with mutmut (docs/testing.md, "Mutation testing").
#
#   scripts/mutants.sh                      every module of the table below
#   scripts/mutants.sh FILE...              these safety-core files (django_taskclaim/...)
#   scripts/mutants.sh --changed BASE       the safety-core files changed since the git ref BASE
#                                           (none changed: prints so and exits 0)
#
# Each module is mutated in its own copy of the tree, var/mutants/<module>/ (the working tree
# is never written to), against its own short list of test files on SQLite, one test process
# at a time (--max-children 1). mutmut first runs that list once to learn which tests reach
# which function, then runs only those tests against each mutant.
#
# Exit code: 0 when every module reaches MUTANTS_MIN_KILLED percent of its mutants killed
# (default 90), counting as killed the mutants that docs/testing.md lists as equivalent (a
# table row "| `<mutant name>` | <why> |" of its "Mutation testing" section); 1 otherwise.
# The other survivors are printed with their diff (`mutmut show`). mutmut numbers a
# function's mutants in order, so an edit to a function can renumber its listed ones.
#
# Variables: VENV (default .venv), MUTANTS_MIN_KILLED (default 90), MUTANTS_KEEP=1 keeps
# var/mutants/<module>/ for `cd var/mutants/<module> && ../../../.venv/bin/mutmut browse`,
# MUTANTS_DB (default sqlite, or the module's own in DB_OF below; postgres or mariadb reach
# the branches SQLite does not take),
# MUTANTS_BEFORE=1 leaves out the tests/*/test_mutants_*.py files (the figures before them),
# MUTANTS_INSTALL=1 installs the `mutants` dependency group into VENV when mutmut is missing
# (only once a module is to run: `--changed` with nothing changed installs nothing).
#
# MUTANTS_BUDGET=SECONDS (default 0: none) bounds the whole run, from the script's start
# (the install included): when it runs out, the module running is stopped, the ones after
# it are not started, and the script reports how many mutants were run and killed. A
# module cut short is not judged (no failure for want of time); a module that finished
# below the threshold still fails the run (CI: .ci/run).
set -uo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${VENV:-.venv}
PY=$ROOT/$VENV/bin/python
MIN_KILLED=${MUTANTS_MIN_KILLED:-90}
EQUIVALENT=$ROOT/docs/testing.md
BUDGET=${MUTANTS_BUDGET:-0}

# module → the test files that kill its mutants (seconds each on SQLite). mutmut stops a
# mutant's run at its first failing test (-x): the fast tests/*/test_mutants_*.py first.
declare -A TESTS=(
  [django_taskclaim/rules.py]="tests/recovery/test_reaper.py tests/recovery/test_overdue.py tests/settle/test_fence_effects.py tests/recovery/test_mutants_rules.py"
  [django_taskclaim/settle/transitions.py]="tests/settle/test_lifecycle.py tests/settle/test_fence_effects.py tests/settle/test_mutants_transitions.py"
  [django_taskclaim/settle/batch.py]="tests/settle/test_lifecycle.py tests/settle/test_fence_effects.py tests/settle/test_mutants_batch.py"
  [django_taskclaim/recovery/reap.py]="tests/recovery/test_reaper.py tests/recovery/test_overdue.py tests/settle/test_fence_effects.py tests/recovery/test_mutants_reap.py"
  [django_taskclaim/recovery/overdue.py]="tests/recovery/test_overdue.py tests/recovery/test_mutants_overdue.py"
  [django_taskclaim/settle/leases.py]="tests/settle/test_fence_effects.py tests/settle/test_lifecycle.py tests/claim/test_odd_keys.py tests/settle/test_mutants_leases.py"
  [django_taskclaim/worker/ledger.py]="tests/worker/test_worker_pieces.py tests/worker/test_mutants_ledger.py"
  [django_taskclaim/claim/skip_locked.py]="tests/claim/test_mutants_skip_locked.py tests/claim/test_claim.py"
  [django_taskclaim/claim/cas.py]="tests/claim/test_mutants_cas.py tests/claim/test_claim.py"
  [django_taskclaim/claim/statements.py]="tests/claim/test_mutants_statements.py tests/claim/test_prepared.py"
  [django_taskclaim/claim/base.py]="tests/claim/test_mutants_base.py tests/claim/test_claim.py"
  [django_taskclaim/locks/lease.py]="tests/locks/test_mutants_lease.py tests/locks/test_locks_lease.py"
  [django_taskclaim/settle/outcome.py]="tests/settle/test_mutants_outcome.py tests/settle/test_lifecycle.py"
)
# The database a module is mutated on when MUTANTS_DB is not set (default sqlite):
# leases.py's heartbeat renewal takes its SELECT … FOR UPDATE SKIP LOCKED branch only
# where the database has it (PostgreSQL, MariaDB); on SQLite a third of its mutants are
# never reached. claim/skip_locked.py: SQLite has no SKIP LOCKED, so none of its claims run
# there (its tests run the MariaDB way on PostgreSQL too); claim/statements.py runs the
# one-statement claims (UPDATE … RETURNING) of PostgreSQL only.
declare -A DB_OF=(
  [django_taskclaim/settle/leases.py]=postgres
  [django_taskclaim/claim/skip_locked.py]=postgres
  [django_taskclaim/claim/statements.py]=postgres
)
ORDER=(
  django_taskclaim/rules.py
  django_taskclaim/settle/transitions.py
  django_taskclaim/settle/batch.py
  django_taskclaim/recovery/reap.py
  django_taskclaim/recovery/overdue.py
  django_taskclaim/settle/leases.py
  django_taskclaim/worker/ledger.py
  django_taskclaim/claim/skip_locked.py
  django_taskclaim/claim/statements.py
  django_taskclaim/claim/cas.py
  django_taskclaim/claim/base.py
  django_taskclaim/locks/lease.py
  django_taskclaim/settle/outcome.py
)

modules=()
if [[ ${1:-} == --changed ]]; then
  base=${2:?--changed needs a git ref}
  changed=$(git diff --name-only "$base" -- django_taskclaim) || exit 2
  for m in "${ORDER[@]}"; do
    grep -qx "$m" <<<"$changed" && modules+=("$m")
  done
  if ((${#modules[@]} == 0)); then
    echo "mutants: no safety-core file of the table changed since $base"
    exit 0
  fi
elif (($# > 0)); then
  for m in "$@"; do
    m=${m#./}
    if [[ -z ${TESTS[$m]:-} ]]; then
      echo "mutants: $m is not in the table of scripts/mutants.sh (${ORDER[*]})" >&2
      exit 2
    fi
    modules+=("$m")
  done
else
  modules=("${ORDER[@]}")
fi

if [[ ! -x $ROOT/$VENV/bin/mutmut && ${MUTANTS_INSTALL:-} == 1 ]]; then
  echo "mutants: installing the mutants dependency group into $VENV"
  "$ROOT/$VENV/bin/pip" install -q --group mutants >&2
fi
if [[ ! -x $ROOT/$VENV/bin/mutmut ]]; then
  echo "mutants: no mutmut in $VENV: $VENV/bin/pip install --group mutants" >&2
  exit 2
fi

# Seconds left of MUTANTS_BUDGET (a large number when there is none).
left() {
  if ((BUDGET > 0)); then echo $((BUDGET - SECONDS)); else echo 999999; fi
}

status=0
summary=()
stopped=0
for m in "${modules[@]}"; do
  if (($(left) <= 0)); then
    summary+=("$m: not started, the budget of ${BUDGET} s was spent")
    stopped=1
    continue
  fi
  name=$(basename "${m%.py}")
  [[ $m == */settle/* ]] && name=settle_$name
  [[ $m == */recovery/* ]] && name=recovery_$name
  [[ $m == */worker/* ]] && name=worker_$name
  [[ $m == */claim/* ]] && name=claim_$name
  [[ $m == */locks/* ]] && name=locks_$name
  work=$ROOT/var/mutants/$name
  rm -rf "$work"
  mkdir -p "$work"
  tests=${TESTS[$m]}
  if [[ ${MUTANTS_BEFORE:-} == 1 ]]; then
    tests=$(tr ' ' '\n' <<<"$tests" | grep -v '/test_mutants_' | tr '\n' ' ')
  fi
  # The tree mutmut copies: the package, the tests, and pyproject.toml with this module's
  # [tool.mutmut] (the repository's section, only_mutate and the test list replaced).
  tar -C "$ROOT" --exclude=__pycache__ --exclude='*.pyc' -cf - django_taskclaim tests \
    | tar -C "$work" -xf -
  "$PY" - "$ROOT/pyproject.toml" "$work/pyproject.toml" "$m" $tests <<'EOF'
import os
import re
import sys
import tomllib

src, dst, module, *tests = sys.argv[1:]
text = open(src, encoding="utf-8").read()
base = tomllib.loads(text).get("tool", {}).get("mutmut", {})
# drop the repository's [tool.mutmut] table; write this module's instead
text = re.sub(r"(?ms)^\[tool\.mutmut\]\n.*?(?=^\[|\Z)", "", text)
tests = [t for t in tests if os.path.exists(os.path.join(os.path.dirname(dst), t))]
conf = dict(base, only_mutate=[module], pytest_add_cli_args_test_selection=tests)
lines = ["", "[tool.mutmut]"]
for key, value in conf.items():
    if isinstance(value, list):
        value = "[" + ", ".join('"' + str(v).replace('"', '\\"') + '"' for v in value) + "]"
    elif isinstance(value, bool):
        value = "true" if value else "false"
    elif isinstance(value, str):
        value = '"' + value + '"'
    lines.append(f"{key} = {value}")
open(dst, "w", encoding="utf-8").write(text.rstrip() + "\n" + "\n".join(lines) + "\n")
EOF
  db=${MUTANTS_DB:-${DB_OF[$m]:-sqlite}}
  echo "== $m against $tests ($db)"
  start=$SECONDS
  # mutmut in a process group of its own, so that the budget can stop it with its test
  # processes; the results of the mutants it finished are in its meta file already.
  (
    cd "$work" &&
      TASKCLAIM_TEST_DB=$db TASKCLAIM_TEST_SUFFIX=mut_$name \
        exec setsid "$ROOT/$VENV/bin/mutmut" run --max-children 1 >"$work/run.log" 2>&1
  ) &
  pid=$!
  cut=0
  while kill -0 "$pid" 2>/dev/null; do
    if (($(left) <= 0)); then
      cut=1
      kill -TERM -- "-$pid" 2>/dev/null
      for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
      kill -KILL -- "-$pid" 2>/dev/null
      break
    fi
    sleep 1
  done
  wait "$pid"
  rc=$?
  took=$((SECONDS - start))
  if ((cut)); then
    stopped=1
    if [[ ! -f $work/mutants/${m}.meta ]]; then
      line="$m: stopped after ${took} s (the budget of ${BUDGET} s spent) before any mutant ran"
      echo "$line"
      summary+=("$line")
      [[ ${MUTANTS_KEEP:-} == 1 ]] || rm -rf "$work"
      continue
    fi
  elif ((rc != 0)); then
    tail -30 "$work/run.log"
    echo "mutants: mutmut run failed for $m (exit $rc; log $work/run.log)" >&2
    status=1
    summary+=("$m: mutmut failed after ${took} s")
    continue
  fi
  # One line per mutant that was not killed: "    <name>: <status>". A mutant that ran
  # past its time limit ("timeout": a loop that never ends) was caught, and counts as killed.
  (cd "$work" && "$ROOT/$VENV/bin/mutmut" results) 2>&1 | grep -E '^\s+\S+: ' \
    | grep -v ': timeout$' >"$work/results.txt"
  total=$("$PY" -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["exit_code_by_key"]))' \
    "$work/mutants/${m}.meta")
  survivors=()
  equivalent=0
  while read -r key st; do
    key=${key%:}
    [[ -z $key ]] && continue
    if ((cut)) && [[ $st == "not checked" || $st == "check was interrupted by user" || $st == suspicious ]]; then
      survivors+=("$key ($st)") # not run: left out of the figures below
      continue
    fi
    if grep -qF "| \`$key\` |" "$EQUIVALENT"; then
      equivalent=$((equivalent + 1))
    else
      survivors+=("$key ($st)")
    fi
  done <"$work/results.txt"
  not_killed=$(grep -c '' "$work/results.txt")
  if ((cut)); then
    # Not run: never started, or stopped in the middle (interrupted, or killed by a
    # signal: mutmut calls that "suspicious").
    unrun=$(grep -cE ': (not checked|check was interrupted by user|suspicious)$' "$work/results.txt")
    ran=$((total - unrun))
    killed=$((ran - (not_killed - unrun)))
    survived=0
    for s in "${survivors[@]}"; do
      [[ $s =~ \((not\ checked|check\ was\ interrupted\ by\ user|suspicious)\)$ ]] || survived=$((survived + 1))
    done
    line="$m: stopped after ${took} s (the budget of ${BUDGET} s spent): $ran of $total mutants run, $killed killed, $equivalent equivalent, $survived surviving; not judged"
    echo "$line"
    for s in "${survivors[@]}"; do
      [[ $s =~ \((not\ checked|check\ was\ interrupted\ by\ user|suspicious)\)$ ]] && continue
      echo "  survived: $s"
    done
    summary+=("$line")
    [[ ${MUTANTS_KEEP:-} == 1 ]] || rm -rf "$work"
    continue
  fi
  killed=$((total - not_killed))
  pct=$(((killed + equivalent) * 100 / (total > 0 ? total : 1)))
  line="$m: $total mutants, $killed killed, $equivalent equivalent, ${#survivors[@]} surviving (${pct} %) in ${took} s"
  echo "$line"
  for s in "${survivors[@]}"; do
    echo "  survived: $s"
    # its diff (about a second each: not once the budget is spent)
    (($(left) > 0)) || continue
    (cd "$work" && "$ROOT/$VENV/bin/mutmut" show "${s%% *}" 2>/dev/null | sed 's/^/    /')
  done
  summary+=("$line")
  ((pct < MIN_KILLED)) && status=1
  [[ ${MUTANTS_KEEP:-} == 1 ]] || rm -rf "$work"
done

echo
echo "== mutants (killed + equivalent must reach ${MIN_KILLED} %)"
printf '%s\n' "${summary[@]}"
if ((stopped)); then
  echo "mutants: the budget of ${BUDGET} s ran out; the modules cut short are not judged"
fi
exit $status
