#!/usr/bin/env bash
# Runs `make test` (scripts/test.sh, on a small test selection) in the states a fresh
# machine can be in, each in its own copy of the working tree with its own virtualenvs,
# and checks that every run says honestly what it did: the exit code, the skipped passes
# with their reason and fix, and a "total:" line that adds up. Not part of `make test` or
# CI (it creates four virtualenvs: about 7 minutes and 1.2 GB under $TMPDIR, removed after).
#
# usage: scripts/check-fresh-states.sh [STATE...]      (make check-fresh-states STATES="…")
#
#   no-headers  MariaDB running, its client headers hidden (pkg-config finds no libmariadb),
#               so the fresh venv has no mysqlclient: the MariaDB passes must be SKIPPED with
#               the reason and the fix, the rest pass, exit code 0
#   no-server   (root) the same copy inside `unshare -n` (a network namespace with only a
#               loopback): no PostgreSQL, no MariaDB; the embedded PostgreSQL is used
#   crash       the same copy, the SQLite pass made to crash as the MariaDB one did without
#               mysqlclient (its settings module does not import: exit code 1, no pytest
#               summary line): it must show as CRASHED, count as 1 failed, exit code 1
#   user        (root) a fresh copy owned by an ordinary user (CHECK_USER, default nobody),
#               everything present: mysqlclient is built, every pass runs, as that user
#   user-no-server  (root) that copy, as that user, inside `unshare -n`: the embedded
#               PostgreSQL runs as the user itself
#   everything  the user's copy again, as the invoking user (root when run with sudo)
#
# Default: all of them. Environment: CHECK_TESTS (pytest selection, default
# tests/claim/test_claim.py), CHECK_USER, CHECK_KEEP=1 (keep the copies), TMPDIR.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
states=("$@")
[ ${#states[@]} -gt 0 ] || states=(no-headers no-server crash user user-no-server everything)
tests=${CHECK_TESTS:-tests/claim/test_claim.py}
user=${CHECK_USER:-nobody}
root=no; [ "$(id -u)" = 0 ] && root=yes

work=$(mktemp -d "${TMPDIR:-/tmp}/taskclaim-fresh.XXXXXX")
chmod 755 "$work"
verdicts=()
failed=0
say() { printf '%s\n' "$*"; }
header() { printf '\n######## %s\n' "$*"; }

copy_tree() {  # dest: the working tree as git sees it (tracked + untracked, not ignored)
  mkdir -p "$1"
  (cd "$here" && git ls-files -z --cached --others --exclude-standard \
    | tar --null --ignore-failed-read -T - -cf - 2>/dev/null) | tar -xf - -C "$1"
}

cleanup() {
  for d in "$work"/*/; do
    [ -x "$d/.venv/bin/python" ] || continue
    for pg in "$d/var/embedded-pg" "$d/example_project/var/pg"; do
      [ -f "$pg/postmaster.pid" ] && "$d/.venv/bin/python" -c \
        "import sys; from django_taskclaim import embedded; embedded.stop(sys.argv[1])" "$pg" \
        >/dev/null 2>&1 || true
    done
  done
  if [ -n "${CHECK_KEEP:-}" ]; then say "kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

# --- running as the ordinary user -------------------------------------------------------
# Root's Python (pyenv under /root, say) may be out of the user's reach. Then it is shown
# to the user through a private mount namespace: a tmpfs over the first directory the
# user cannot enter, with the interpreter's tree bound back into it. Nothing changes on
# the machine, and the user's venv works only inside such a namespace (which is where
# every user command of this script runs).
user_home="$work/home-$user"
user_python=""
expose=()
prepare_user() {
  id "$user" >/dev/null 2>&1 || { say "no user '$user' (set CHECK_USER)"; return 1; }
  mkdir -p "$user_home" && chown "$user" "$user_home"
  if runuser -u "$user" -- env HOME="$user_home" "$here/scripts/find-python.sh" >/dev/null 2>&1; then
    return 0
  fi
  local py prefix dir blocked=""
  py=$("$here/scripts/find-python.sh") || return 1
  prefix=$("$py" -c 'import sys; print(sys.base_prefix)')
  dir=$prefix
  while [ "$dir" != / ]; do
    runuser -u "$user" -- test -x "$dir" 2>/dev/null || blocked=$dir
    dir=$(dirname "$dir")
  done
  [ -n "$blocked" ] || return 1
  say "the user '$user' cannot reach $py ($blocked is closed to it): shown to it through a private mount namespace"
  user_python=$py
  expose=("$prefix" "$blocked")
}
user_netns=no  # yes: as_user runs its command in a network namespace with only a loopback
as_user() {  # command...: run as the user, in its home, with the exposed Python if needed
  local envs=(-u XDG_RUNTIME_DIR HOME="$user_home" USER="$user" LOGNAME="$user" PATH="$PATH")
  [ -n "$user_python" ] && envs+=(PYTHON="$user_python")
  local ns=(-m) src="" blocked="" hold="$work/.expose"
  [ $user_netns = yes ] && ns+=(-n)
  if [ ${#expose[@]} -gt 0 ]; then src=${expose[0]} blocked=${expose[1]}; mkdir -p "$hold"; fi
  unshare "${ns[@]}" -- bash -c '
    set -e
    netns=$1 src=$2 blocked=$3 hold=$4 user=$5; shift 5
    [ "$netns" = no ] || ip link set lo up
    if [ -n "$src" ]; then
      mount --make-rprivate /
      mount --bind "$src" "$hold"
      mount -t tmpfs -o mode=0755 tmpfs "$blocked"
      mkdir -p "$src"
      mount --bind "$hold" "$src"
    fi
    exec runuser -u "$user" -- "$@"
  ' _ "$user_netns" "$src" "$blocked" "$hold" "$user" env "${envs[@]}" "$@"
}

# --- one run and its checks -------------------------------------------------------------
log=""
rc=0
run_test_sh() {  # state, dir, how (me|user|netns), env...
  local state=$1 dir=$2 how=$3; shift 3
  log="$work/$state.log"
  local cmd=(env "$@" TASKCLAIM_TEST_SUFFIX=fresh "$dir/scripts/test.sh")
  say "running: ${*} scripts/test.sh   (in $dir, log $log)"
  case $how in
    me) (cd "$dir" && "${cmd[@]}") >"$log" 2>&1 ;;
    user) as_user bash -c 'cd "$1" && shift && exec "$@"' _ "$dir" "${cmd[@]}" >"$log" 2>&1 ;;
    netns) unshare -n -- bash -c 'ip link set lo up && cd "$1" && shift && exec "$@"' _ "$dir" "${cmd[@]}" >"$log" 2>&1 ;;
  esac
  rc=$?
  sed -n '/^=== summary/,$p' "$log" | sed 's/^/    /'
  [ "$(grep -c '^total: ' "$log")" = 1 ] || say "    (no total line: see $log)"
}
problems=()
expect() { grep -qF -- "$1" "$log" || problems+=("missing from the output: $1"); }
expect_not() { ! grep -qF -- "$1" "$log" || problems+=("in the output but must not be: $1"); }
expect_rc() { [ "$rc" = "$1" ] || problems+=("exit code $rc, expected $1"); }
expect_failed() {  # N: the total line says N failed, at least one test passed, and it adds up
  local line; line=$(grep '^total: ' "$log" | tail -1)
  [[ $line =~ ^total:\ ([0-9]+)\ passed,\ ([0-9]+)\ failed,\ ([0-9]+)\ skipped ]] \
    || { problems+=("no total line"); return; }
  [ "${BASH_REMATCH[2]}" = "$1" ] || problems+=("total line says ${BASH_REMATCH[2]} failed, expected $1")
  [ "${BASH_REMATCH[1]}" -gt 0 ] || [ "$1" != 0 ] || problems+=("total line says 0 passed")
  # Recount from the pytest logs, independently of test.sh: their last summary lines,
  # plus one failure per pass log without one or with a failing exit code.
  local recount
  recount=$("$2" - "$3/var/test-logs" <<'PY'
import re, sys
from pathlib import Path
p = f = s = 0
rows = {r.split("\t")[0]: r.split("\t") for r in (Path(sys.argv[1]) / "results.tsv").read_text().splitlines()}
for log in Path(sys.argv[1]).glob("*.log"):
    last = [l for l in log.read_text(errors="replace").splitlines() if re.search(r"(passed|failed|skipped|errors?|no tests ran).* in [\d.]+s", l)]
    got = dict((w, int(n)) for n, w in re.findall(r"(\d+) (passed|failed|skipped|errors?)", last[-1])) if last else {}
    bad = got.get("failed", 0) + got.get("error", 0) + got.get("errors", 0)
    rc = int(rows[log.stem][2])
    if not last or (rc not in (0, 5) and not bad):
        bad += 1
    p += got.get("passed", 0); f += bad; s += got.get("skipped", 0)
print(f"total: {p} passed, {f} failed, {s} skipped")
PY
)
  [[ $line == "$recount"* ]] || problems+=("the total line does not add up: '$line' but the logs say '$recount'")
}
verdict() {  # state
  if [ ${#problems[@]} -eq 0 ]; then
    say "  -> $1: ok"
    verdicts+=("$1 ok")
  else
    for p in "${problems[@]}"; do say "  -> $1: FAIL: $p"; done
    verdicts+=("$1 FAILED")
    failed=1
  fi
  problems=()
}
skip_state() { say "  -> $1: not run: $2"; verdicts+=("$1 not run ($2)"); }

mariadb_up() { (exec 3<>/dev/tcp/127.0.0.1/3306) 2>/dev/null; }

# --- the states -------------------------------------------------------------------------
A="$work/no-headers"
B="$work/with-headers"
want() { local s; for s in "${states[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
hidden=(PKG_CONFIG_LIBDIR=/nonexistent PKG_CONFIG_PATH=)
passes_a="sqlite postgresql mariadb mariadb-tasks django52"

if want no-headers || want no-server || want crash; then
  copy_tree "$A"
fi

if want no-headers; then
  header "no-headers: MariaDB running, client headers hidden, fresh virtualenvs"
  if ! mariadb_up; then
    skip_state no-headers "no MariaDB server at 127.0.0.1:3306 to show the skip against"
  else
    run_test_sh no-headers "$A" me "${hidden[@]}" TASKCLAIM_PASSES="$passes_a" TASKCLAIM_TESTS="$tests"
    expect_rc 0
    expect "SKIPPED: mariadb — MariaDB answers at 127.0.0.1:3306, but Django's MySQL backend requires the mysqlclient driver"
    expect "Fix: apt-get install libmariadb-dev pkg-config"
    expect "SKIPPED: mariadb-tasks"
    expect "bootstrap: no MariaDB client headers, so no mysqlclient"
    expect "--- django52:"
    expect_not "ImproperlyConfigured"
    expect_failed 0 "$A/.venv/bin/python" "$A"
    "$A/.venv/bin/python" -c "import MySQLdb" 2>/dev/null && problems+=("mysqlclient is installed although the headers were hidden")
    verdict no-headers
  fi
fi

if want no-server; then
  header "no-server: no network (unshare -n), no database server, embedded PostgreSQL"
  if [ $root = no ]; then
    skip_state no-server "needs root for unshare -n"
  else
    # Set up outside (pip needs the network the first time), then test inside.
    env "${hidden[@]}" "$A/scripts/bootstrap.sh" "$A/.venv" >/dev/null 2>&1
    BOOTSTRAP_GROUP=test BOOTSTRAP_MYSQL=no "$A/scripts/bootstrap.sh" "$A/.venv-dj52" "Django>=5.2,<5.3" >/dev/null 2>&1
    run_test_sh no-server "$A" netns "${hidden[@]}" TASKCLAIM_PASSES="sqlite postgresql mariadb django52" TASKCLAIM_TESTS="$tests"
    expect_rc 0
    expect "SKIPPED: mariadb — no MariaDB/MySQL server answers at 127.0.0.1:3306"
    expect "--- postgresql:"
    expect "--- django52:"
    expect_failed 0 "$A/.venv/bin/python" "$A"
    [ -f "$A/var/embedded-pg/PG_VERSION" ] || problems+=("no embedded PostgreSQL was created in var/embedded-pg")
    verdict no-server
  fi
fi

if want crash; then
  header "crash: a pass whose pytest crashes (exit code 1, no summary line)"
  run_test_sh crash "$A" me "${hidden[@]}" TASKCLAIM_PASSES="sqlite sqlite-tasks" \
    TASKCLAIM_TESTS="--ds=tests.no_such_settings $tests"
  expect_rc 1
  expect "CRASHED"
  expect "1 pass(es) crashed, each counted as 1 failed: sqlite"
  expect_failed 1 "$A/.venv/bin/python" "$A"
  verdict crash
fi

if want user || want everything; then
  copy_tree "$B"
fi

if want user; then
  header "user: an ordinary user ($user), everything present, fresh virtualenvs"
  if [ $root = no ]; then
    skip_state user "you are already an ordinary user (uid $(id -u)): the everything state is this one"
  elif ! prepare_user; then
    skip_state user "no usable ordinary user or Python for it"
  else
    chown -R "$user" "$B"
    run_test_sh user "$B" user TASKCLAIM_PASSES="$passes_a" TASKCLAIM_TESTS="$tests"
    expect_rc 0
    expect_not "SKIPPED: mariadb"
    expect "--- mariadb:"
    expect "--- mariadb-tasks:"
    expect "--- django52:"
    expect_failed 0 "$B/.venv/bin/python" "$B"
    verdict user
  fi
fi

if want user-no-server; then
  header "user-no-server: the ordinary user ($user), no network (unshare -n), embedded PostgreSQL"
  if [ $root = no ]; then
    skip_state user-no-server "needs root for unshare -n and runuser"
  elif [ ! -x "$B/.venv/bin/python" ] || ! prepare_user; then
    skip_state user-no-server "needs the user state's virtualenvs (run it with user)"
  else
    user_netns=yes
    run_test_sh user-no-server "$B" user TASKCLAIM_PASSES="sqlite postgresql mariadb django52" TASKCLAIM_TESTS="$tests"
    user_netns=no
    expect_rc 0
    expect "SKIPPED: mariadb — no MariaDB/MySQL server answers at 127.0.0.1:3306"
    expect "--- postgresql:"
    expect "--- django52:"
    expect_failed 0 "$B/.venv/bin/python" "$B"
    [ "$(stat -c %U "$B/var/embedded-pg/PG_VERSION" 2>/dev/null)" = "$user" ] \
      || problems+=("no embedded PostgreSQL of the user's own in var/embedded-pg")
    # The server runs as the user: only the user can stop it.
    as_user "$B/.venv/bin/python" -c "import sys; from django_taskclaim import embedded; embedded.stop(sys.argv[1])" "$B/var/embedded-pg" \
      || problems+=("could not stop the user's embedded PostgreSQL")
    verdict user-no-server
  fi
fi

if want everything; then
  header "everything: servers, headers, as $(id -un)"
  run_test_sh everything "$B" me TASKCLAIM_PASSES="lint $passes_a" TASKCLAIM_TESTS="$tests"
  expect_rc 0
  expect "--- lint:"
  expect "--- mariadb:"
  expect_failed 0 "$B/.venv/bin/python" "$B"
  verdict everything
fi

header "check-fresh-states"
for v in "${verdicts[@]}"; do say "  $v"; done
exit $failed
