"""Test helpers: waiting on conditions with deadlines, subprocess environments, a
throwaway embedded PostgreSQL server."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


def wait_for(
    condition: Callable[[], Any],
    *,
    timeout: float = 30.0,
    interval: float = 0.02,
    what: str = "condition",
) -> Any:
    """Poll ``condition`` until it returns a truthy value or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def claim_queries(captured: Any) -> list[dict[str, Any]]:
    """The queries a ``CaptureQueriesContext`` saw, without the read of the paused queues
    a claim makes at most once per poll interval per process (docs/pause.md): what a
    round-trip count of the claim itself looks at."""
    queries = getattr(captured, "captured_queries", captured)
    return [q for q in queries if "taskclaim_queuepause" not in q["sql"]]


def simulate_work(seconds: float) -> None:
    """Stand for a task body that takes ``seconds`` (a duration, not a wait for anything);
    sliced so a signal handler runs promptly."""
    deadline = time.monotonic() + float(seconds)
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(0.05, left))


def child_env(**extra: str) -> dict[str, str]:
    """Environment for a subprocess that must use the current test database."""
    env = dict(os.environ)
    env["TASKCLAIM_TEST_DB_NAME"] = str(connection.settings_dict["NAME"])
    env["DJANGO_SETTINGS_MODULE"] = "tests.support.settings"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


PYTHON = sys.executable


def embedded_database(
    name: str, db: str, start: Callable[[Path], dict[str, Any]] | None = None
) -> tuple[Path, dict[str, Any], Callable[..., list[tuple]]]:
    """Start (or reuse) the embedded PostgreSQL server of ``var/<name><suffix><worker>`` (with
    ``start``, default ``embedded.start``) and give it a new, empty database ``db``.
    Returns the data directory, the server's connection settings and
    ``sql(query, dbname=db)``, which runs one statement there (autocommit) and returns
    its rows."""
    import psycopg

    from django_taskclaim import embedded

    # One server per test run and pytest-xdist worker: two tests on one server would
    # drop and migrate the same database under each other.
    suffix = os.environ.get("TASKCLAIM_TEST_SUFFIX", "") + os.environ.get("PYTEST_XDIST_WORKER", "")
    data_dir = ROOT / "var" / f"{name}{suffix}"
    conf = (start or embedded.start)(data_dir)

    def sql(query: str, dbname: str = db) -> list[tuple]:
        with psycopg.connect(
            host=conf["HOST"], port=conf["PORT"], user="postgres", dbname=dbname, autocommit=True
        ) as conn:
            cur = conn.execute(query)
            return cur.fetchall() if cur.description else []

    sql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)", "postgres")
    sql(f"CREATE DATABASE {db}", "postgres")
    return data_dir, conf, sql


class _BusyDriverError(Exception):
    """A driver error each vendor's backend takes for a busy database: SQLite's "database
    is locked", PostgreSQL's deadlock SQLSTATE, MySQL's deadlock error number."""

    sqlstate = "40P01"


class BusyOnce:
    """A ``connection.execute_wrapper``: the first ``times`` statements starting with
    ``prefix`` fail as a busy database would (``left`` counts those still to fail), the
    rest run. For tests that a write retries a busy database and lands."""

    def __init__(self, prefix: str = "UPDATE", times: int = 1) -> None:
        self.prefix = prefix
        self.left = times

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if sql.startswith(self.prefix) and self.left:
            from django.db import OperationalError

            self.left -= 1
            raise OperationalError("database is locked") from _BusyDriverError(
                1213, "database is locked"
            )
        return execute(sql, params, many, context)
