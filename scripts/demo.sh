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
# A second run reuses all of it. Shorter run: DEMO_DOCS=200 scripts/demo.sh
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
venv=${DEMO_VENV:-${VENV:-$here/.venv}}
case $venv in /*) ;; *) venv=$here/$venv ;; esac
mode=${1:-run}
shift || true

"$here/scripts/bootstrap.sh" "$venv" >/dev/null
py="$venv/bin/python"
manage=("$py" "$here/example_project/manage.py")
export PYTHONUNBUFFERED=1

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
    exec "${manage[@]}" taskclaim_racelab "$@"
    ;;
  stop)
    exec "$py" -W ignore -c "import sys; sys.path.insert(0, '$here'); from django_taskclaim import embedded; embedded.stop('${EMBEDDED_PG_DIR:-$here/example_project/var/pg}')"
    ;;
  *)
    echo "usage: scripts/demo.sh [run|serve|racelab|stop] [options]" >&2
    exit 2
    ;;
esac
