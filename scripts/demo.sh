#!/usr/bin/env bash
# The example project in one command (README: "make demo").
#
#   scripts/demo.sh            set up everything, seed documents, drain them with workers
#   scripts/demo.sh serve      the admin at http://127.0.0.1:${PORT:-8000}/admin/ + one worker
#   scripts/demo.sh racelab    manage.py taskclaim_racelab (every claim technique raced)
#   scripts/demo.sh stop       stop the embedded PostgreSQL
#
# On a fresh machine it creates the virtual environment (scripts/bootstrap.sh), and with no
# DATABASE_URL the project starts an embedded PostgreSQL under example_project/var/pg.
# A second run reuses all of it; the server keeps running between runs (the demo prints
# where; `make clean-db` or `scripts/demo.sh stop` stops it). Shorter run:
# DEMO_DOCS=200 scripts/demo.sh
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
venv=${DEMO_VENV:-${VENV:-$here/.venv}}
case $venv in /*) ;; *) venv=$here/$venv ;; esac
mode=${1:-run}
shift || true

# bootstrap.sh says on stderr what it installs (the first run takes a minute or two).
# The lines that matter only to the tests (MariaDB's client headers, Spin) are left out.
BOOTSTRAP_FOR=demo "$here/scripts/bootstrap.sh" "$venv" >/dev/null
py="$venv/bin/python"
manage=("$py" "$here/example_project/manage.py")
export PYTHONUNBUFFERED=1

# Without DATABASE_URL (environment or example_project/.env) the project runs an embedded
# PostgreSQL; say so before it starts, and what it does to the machine when run as root.
pg_dir=${EMBEDDED_PG_DIR:-$here/example_project/var/pg}
case $pg_dir in /*) ;; *) pg_dir=$here/$pg_dir ;; esac
uses_embedded() {
  [ -z "${DATABASE_URL:-}" ] && ! grep -qsE '^[[:space:]]*DATABASE_URL[[:space:]]*=[[:space:]]*[^[:space:]]' "$here/example_project/.env"
}
if [ "$mode" != stop ] && uses_embedded; then
  if [ "$(id -u)" = 0 ]; then
    if id embedded_postgres >/dev/null 2>&1; then
      echo "demo: running as root; PostgreSQL refuses to run as root, so the embedded server runs as the system user 'embedded_postgres' (it exists already)"
    else
      echo "demo: running as root; PostgreSQL refuses to run as root, so the embedded-postgres package now creates a system user, 'embedded_postgres' (useradd), to run the server as"
    fi
    echo "      it also opens the directories above $pg_dir and the PostgreSQL binaries to other users (chmod go+rx) so that user can reach them; run the demo as an ordinary user to avoid both"
  fi
  if [ ! -f "$pg_dir/postmaster.pid" ]; then
    if [ -f "$pg_dir/PG_VERSION" ]; then
      echo "demo: starting the embedded PostgreSQL in $pg_dir"
    else
      echo "demo: creating and starting an embedded PostgreSQL in $pg_dir (initdb: a few seconds)"
    fi
  fi
fi

case $mode in
  run)
    exec "${manage[@]}" demo "$@"
    ;;
  serve)
    "${manage[@]}" demo --setup-only
    "${manage[@]}" worker --concurrency "${DEMO_CONCURRENCY:-2}" >>"$here/example_project/var/serve-worker.log" 2>&1 &
    worker=$!
    trap 'kill -TERM "$worker" 2>/dev/null; wait "$worker" 2>/dev/null || true' EXIT
    echo "a worker runs in the background (log: example_project/var/serve-worker.log)"
    echo "admin: http://127.0.0.1:${PORT:-8000}/admin/   (Ctrl-C stops the server and the worker)"
    "${manage[@]}" runserver --noreload "127.0.0.1:${PORT:-8000}" "$@"
    ;;
  racelab)
    "${manage[@]}" migrate --noinput taskclaim_racelab >/dev/null
    exec "${manage[@]}" taskclaim_racelab "$@"
    ;;
  stop)
    "$py" -W ignore -c "import sys; sys.path.insert(0, sys.argv[1]); from django_taskclaim import embedded; embedded.stop(sys.argv[2])" "$here" "$pg_dir"
    echo "demo: stopped the embedded PostgreSQL of $pg_dir (if it ran)"
    ;;
  *)
    echo "usage: scripts/demo.sh [run|serve|racelab|stop] [options]" >&2
    exit 2
    ;;
esac
