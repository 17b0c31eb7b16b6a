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
# MUTANTS_DB (default sqlite; postgres or mariadb reach the branches SQLite does not take),
# MUTANTS_BEFORE=1 leaves out the tests/*/test_mutants_*.py files (the figures before them).
set -uo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${VENV:-.venv}
PY=$ROOT/$VENV/bin/python
MIN_KILLED=${MUTANTS_MIN_KILLED:-90}
EQUIVALENT=$ROOT/docs/testing.md

# module → the test files that kill its mutants (seconds each on SQLite).
declare -A TESTS=(
  [django_taskclaim/rules.py]="tests/recovery/test_reaper.py tests/recovery/test_overdue.py tests/settle/test_fence_effects.py tests/recovery/test_mutants_rules.py"
  [django_taskclaim/settle/transitions.py]="tests/settle/test_lifecycle.py tests/settle/test_fence_effects.py tests/settle/test_mutants_transitions.py"
  [django_taskclaim/settle/batch.py]="tests/settle/test_lifecycle.py tests/settle/test_fence_effects.py tests/settle/test_mutants_batch.py"
  [django_taskclaim/recovery/reap.py]="tests/recovery/test_reaper.py tests/recovery/test_overdue.py tests/settle/test_fence_effects.py tests/recovery/test_mutants_reap.py"
)
ORDER=(
  django_taskclaim/rules.py
  django_taskclaim/settle/transitions.py
  django_taskclaim/settle/batch.py
  django_taskclaim/recovery/reap.py
)

if [[ ! -x $ROOT/$VENV/bin/mutmut ]]; then
  echo "mutants: no mutmut in $VENV: $VENV/bin/pip install --group mutants" >&2
  exit 2
fi

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

status=0
summary=()
for m in "${modules[@]}"; do
  name=$(basename "${m%.py}")
  [[ $m == */settle/* ]] && name=settle_$name
  [[ $m == */recovery/* ]] && name=recovery_$name
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
  echo "== $m against $tests (${MUTANTS_DB:-sqlite})"
  start=$SECONDS
  (
    cd "$work" &&
      TASKCLAIM_TEST_DB=${MUTANTS_DB:-sqlite} TASKCLAIM_TEST_SUFFIX=mut_$name \
        "$ROOT/$VENV/bin/mutmut" run --max-children 1 >"$work/run.log" 2>&1
  )
  rc=$?
  took=$((SECONDS - start))
  if ((rc != 0)); then
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
    if grep -qF "| \`$key\` |" "$EQUIVALENT"; then
      equivalent=$((equivalent + 1))
    else
      survivors+=("$key ($st)")
    fi
  done <"$work/results.txt"
  not_killed=$(grep -c '' "$work/results.txt")
  killed=$((total - not_killed))
  pct=$(((killed + equivalent) * 100 / (total > 0 ? total : 1)))
  line="$m: $total mutants, $killed killed, $equivalent equivalent, ${#survivors[@]} surviving (${pct} %) in ${took} s"
  echo "$line"
  for s in "${survivors[@]}"; do
    echo "  survived: $s"
    (cd "$work" && "$ROOT/$VENV/bin/mutmut" show "${s%% *}" 2>/dev/null | sed 's/^/    /')
  done
  summary+=("$line")
  ((pct < MIN_KILLED)) && status=1
  [[ ${MUTANTS_KEEP:-} == 1 ]] || rm -rf "$work"
done

echo
echo "== mutants (killed + equivalent must reach ${MIN_KILLED} %)"
printf '%s\n' "${summary[@]}"
exit $status
