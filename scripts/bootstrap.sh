#!/usr/bin/env bash
# Creates (or reuses) a virtual environment with the project and its dev tools; prints
# its path on stdout (everything else goes to stderr).
#
# usage: scripts/bootstrap.sh [VENV_DIR] [EXTRA_PIP_SPEC...]
#   BOOTSTRAP_GROUP=test   install only the test dependencies (pyproject's dependency
#                          group "test"; default "tools": tests + linters + build tools)
#   BOOTSTRAP_MYSQL=no     never try mysqlclient (default: install it when the MariaDB
#                          client headers are there)
#   BOOTSTRAP_FOR=demo     the same installation, without the lines that only matter to
#                          the tests (MariaDB/mysqlclient, Spin): what `make demo` sets
#
# Idempotent: a second run re-installs only when pyproject.toml, the group, the extra
# specs or the presence of the MariaDB client headers changed.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-"$here/.venv"}
shift || true
group=${BOOTSTRAP_GROUP:-tools}
want_mysql=${BOOTSTRAP_MYSQL:-yes}
for_demo=no
if [ "${BOOTSTRAP_FOR:-}" = demo ]; then for_demo=yes; fi
say() { echo "bootstrap: $*" >&2; }
# A line about what only the test-suite needs (the demo installs the same, silently).
say_tests() { [ "$for_demo" = yes ] || say "$@"; }

# pip, quietly, minus the noise of the machine-wide find-links; keeps pip's exit status.
pipi() {
  local out rc=0
  out=$("$venv/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1) || rc=$?
  printf '%s\n' "$out" | grep -v -e '^WARNING: Location' -e '^$' >&2 || true
  return $rc
}

if [ ! -x "$venv/bin/python" ]; then
  py=$("$here/scripts/find-python.sh")
  say "creating $venv with $py"
  "$py" -m venv "$venv"
  # Dependency groups (--group) need pip >= 25.1.
  pipi --upgrade "pip>=25.1" || say "could not upgrade pip (offline?); continuing with $("$venv/bin/python" -m pip --version | cut -d' ' -f1-2)"
fi

# Not Python packages: the protocol model check (tests/guarantees/test_protocol.py) needs Spin and a C
# compiler (.ci/run installs them as root); without them it is skipped with the reason.
if ! command -v spin >/dev/null || ! command -v gcc >/dev/null; then
  say_tests "spin or gcc missing: the protocol model check will be skipped; to add it: apt-get install spin gcc"
fi

# The stamp also records whether the MariaDB headers were there: installing them later
# (apt-get install libmariadb-dev pkg-config) makes the next run add mysqlclient.
stamp="$venv/.taskclaim-installed"
headers=no
if [ "$want_mysql" = yes ] && pkg-config --exists libmariadb 2>/dev/null; then headers=yes; fi
base=$(sha256sum <"$here/pyproject.toml" | cut -c1-16)-group=$group-"$*"
want=$base-mariadb=$headers
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "$venv"
  exit 0
fi

# The project itself (editable) and the dependency group, in one resolver run.
if [ "$(cat "$stamp" 2>/dev/null || true)" = "" ]; then
  say "installing the project and its $group dependencies into $venv (pip; about a minute, more on a slow network)"
else
  say "pyproject.toml or the set-up changed: updating $venv (pip)"
fi
(cd "$here" && pipi -e . --group "$group" "$@") || { say "pip install failed (see above)"; exit 1; }
"$venv/bin/python" -c "import django_taskclaim, django" || { say "install failed: django_taskclaim is not importable"; exit 1; }

# mysqlclient, Django's MySQL/MariaDB driver, builds from source on Linux (there are no
# wheels) against the MariaDB client headers. Without them the MariaDB test passes are
# skipped with the reason; the rest of the project does not need it.
recorded=$headers
if [ "$want_mysql" = yes ]; then
  if [ "$headers" = yes ]; then
    if ! "$venv/bin/python" -c "import MySQLdb" 2>/dev/null; then
      say_tests "MariaDB client headers found: building mysqlclient"
      if ! (cd "$here" && if [ "$for_demo" = yes ]; then pipi --group mysql 2>/dev/null; else pipi --group mysql; fi); then
        say_tests "mysqlclient did not build (see above; a C compiler is needed too: apt-get install build-essential); MariaDB tests will be skipped, the next run tries again"
        recorded=failed
      fi
    fi
  elif ! "$venv/bin/python" -c "import MySQLdb" 2>/dev/null; then
    say_tests "no MariaDB client headers, so no mysqlclient (the MariaDB test passes will be skipped); to add it: apt-get install libmariadb-dev pkg-config, then run this again"
  fi
fi
echo "$base-mariadb=$recorded" >"$stamp"
echo "$venv"
