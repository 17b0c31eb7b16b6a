"""A worker that cannot do its job says why in one line and exits non-zero.

At start the worker compares its models' tables and columns (and the app's own tables)
with the database and refuses a schema that does not match, naming ``migrate``; a
``--burst`` worker gives up on a database that does not answer after a bounded wait;
a running worker reports an outage at a steady cadence; the doctor reports a missing
table or column with its fix. Real worker subprocesses, a real schema change (a table or
column renamed for the test and renamed back), a database name that does not exist.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator

import pytest
from django.conf import settings
from django.db import OperationalError, connection

from django_taskclaim.models import WorkerProcess
from django_taskclaim.ops.doctor import diagnose
from django_taskclaim.worker.exits import EXIT_CONFIG, EXIT_UNAVAILABLE
from django_taskclaim.worker.preflight import schema_problems
from django_taskclaim.worker.service import WARN_EVERY, Outage
from tests.support.helpers import ROOT, wait_for
from tests.support.testapp.models import CharKeyTask, Document
from tests.support.worker_procs import WorkerProc, run_command, stop_all

pytestmark = pytest.mark.django_db(transaction=True)

MODEL = "testapp.CharKeyTask"
#: How long the --burst workers here retry a failing database (TASKCLAIM_BURST_GIVE_UP;
#: 30 s by default): short, so that giving up is seen in seconds.
BURST_WAIT = 3.0
GIVE_UP = {"TASKCLAIM_BURST_GIVE_UP": BURST_WAIT}


@pytest.fixture
def column_renamed(transactional_db) -> Iterator[str]:
    """``CharKeyTask.note`` renamed in the database (as if a migration adding it had not
    run); renamed back afterwards."""
    field = CharKeyTask._meta.get_field("note")
    gone = field.clone()
    gone.set_attributes_from_name("note")
    gone.column = "note_gone"
    gone.model = CharKeyTask
    with connection.schema_editor() as editor:
        editor.alter_field(CharKeyTask, field, gone)
    try:
        yield "note"
    finally:
        with connection.schema_editor() as editor:
            editor.alter_field(CharKeyTask, gone, field)


@pytest.fixture
def table_renamed(transactional_db) -> Iterator[str]:
    """``CharKeyTask``'s table renamed away; renamed back afterwards."""
    table = CharKeyTask._meta.db_table
    with connection.schema_editor() as editor:
        editor.alter_db_table(CharKeyTask, table, f"{table}_gone")
    try:
        yield table
    finally:
        with connection.schema_editor() as editor:
            editor.alter_db_table(CharKeyTask, f"{table}_gone", table)


def one_line_error(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize(
    "args",
    [("--burst",), (), ("--processes", "2")],
    ids=["burst", "running", "supervised"],
)
def test_a_missing_column_stops_the_worker_with_one_line_naming_migrate(column_renamed, args):
    done = run_command("taskclaim_worker", MODEL, *args, timeout=60)
    assert done.returncode == EXIT_CONFIG, done.stderr[-3000:]
    line = one_line_error(done.stderr)
    assert "column note" in line
    assert CharKeyTask._meta.db_table in line
    assert "manage.py migrate" in line
    assert "taskclaim worker" not in done.stdout  # refused before it started


def test_a_missing_table_stops_the_worker_with_one_line_naming_migrate(table_renamed):
    done = run_command("taskclaim_worker", MODEL, "--burst", timeout=60)
    assert done.returncode == EXIT_CONFIG, done.stderr[-3000:]
    line = one_line_error(done.stderr)
    assert f"table {table_renamed} is missing" in line
    assert "manage.py migrate" in line


def test_the_schema_check_costs_a_few_queries_and_finds_nothing_on_a_migrated_database(
    django_assert_max_num_queries, vendor
):
    # One for the table names, then a few per model table (PostgreSQL two, MariaDB
    # four); SQLite's introspection is a handful of PRAGMAs per table, in-process.
    with django_assert_max_num_queries(40 if vendor == "sqlite" else 9):
        assert schema_problems([Document, CharKeyTask], "default") == []


def missing_database() -> str:
    if settings.DB_VENDOR == "sqlite":
        return str(ROOT / "var" / "no-such-directory-h2" / "none.sqlite3")
    return "taskclaim_no_such_database"


@pytest.mark.skipif(
    settings.DB_VENDOR != "sqlite", reason="on a server, a missing database is named at once"
)
def test_a_burst_on_a_database_that_does_not_exist_gives_up_within_its_bound(transactional_db):
    started = time.monotonic()
    done = run_command(
        "taskclaim_worker",
        MODEL,
        "--burst",
        timeout=BURST_WAIT + 60,
        env={
            "TASKCLAIM_TEST_DB_NAME": missing_database(),
            "TASKCLAIM_T_SETTINGS": json.dumps(GIVE_UP),
        },
    )
    took = time.monotonic() - started
    assert done.returncode == EXIT_UNAVAILABLE, done.stderr[-3000:]
    assert took < BURST_WAIT + 30
    assert "Traceback" not in done.stderr
    gave_up = [line for line in done.stderr.splitlines() if "giving up" in line]
    assert len(gave_up) == 1, done.stderr[-3000:]
    assert f"{BURST_WAIT:g}s" in gave_up[0]
    assert "DATABASES['default']" in gave_up[0]


@pytest.mark.skipif(settings.DB_VENDOR == "sqlite", reason="SQLite creates a missing file")
@pytest.mark.parametrize("args", [("--burst",), (), ("--processes", "2")])
def test_a_database_that_does_not_exist_stops_the_worker_with_one_line(transactional_db, args):
    """No wait helps a database the server does not have: with or without --burst, the
    worker exits 1 at once, naming it and the fix."""
    done = run_command(
        "taskclaim_worker",
        MODEL,
        *args,
        timeout=60,
        env={
            "TASKCLAIM_TEST_DB_NAME": missing_database(),
            "TASKCLAIM_T_SETTINGS": json.dumps(GIVE_UP),
        },
    )
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if "does not exist on its server" in line]
    assert lines, done.stderr[-3000:]
    assert "taskclaim_no_such_database" in lines[0]
    assert "migrate" in lines[0]


@pytest.mark.slow
def test_a_burst_whose_claims_keep_failing_gives_up_after_its_bound(transactional_db):
    """A schema broken after the start (the preflight passed): every claim fails; a
    --burst worker that still has work to wait for gives up instead of retrying forever."""
    # A row another worker holds keeps --until-empty polling.
    CharKeyTask.objects.create(key="held")
    assert CharKeyTask.objects.claim(1, lease=3600, worker="elsewhere")
    procs: list[WorkerProc] = []
    try:
        w = WorkerProc(MODEL, "--burst", "--until-empty", "--poll", "0.2", settings=GIVE_UP)
        procs.append(w)
        wait_for(
            lambda: WorkerProcess.objects.filter(pid=w.pid).exists() or not w.alive(),
            timeout=60,
            what="the worker past its start checks (registered)",
        )
        assert w.alive(), w.stderr()[-3000:]
        table = CharKeyTask._meta.db_table
        with connection.schema_editor() as editor:
            editor.alter_db_table(CharKeyTask, table, f"{table}_gone")
        try:
            assert w.wait(BURST_WAIT + 60) == EXIT_UNAVAILABLE, w.stderr()[-3000:]
        finally:
            with connection.schema_editor() as editor:
                editor.alter_db_table(CharKeyTask, f"{table}_gone", table)
        assert "giving up" in w.stderr()
        assert f"failing for {BURST_WAIT:g}s" in w.stderr()
        assert "Traceback" not in w.stderr()
    finally:
        stop_all(procs)


def test_the_doctor_reports_a_missing_column_with_the_migrate_fix(column_renamed):
    found = [f for f in diagnose([CharKeyTask]) if f.id == "TC-D008"]
    assert len(found) == 1, found
    finding = found[0]
    assert finding.severity == "error"
    assert "note" in finding.title
    assert CharKeyTask._meta.db_table in finding.title
    assert "manage.py migrate" in finding.fix


def test_the_doctor_reports_a_missing_table_with_the_migrate_fix(table_renamed):
    found = [f for f in diagnose([CharKeyTask]) if f.id == "TC-D008"]
    assert [f.severity for f in found] == ["error"]
    assert table_renamed in found[0].title
    assert "manage.py migrate" in found[0].fix


def test_the_doctor_finds_the_tables_and_columns_in_place():
    found = [f for f in diagnose([CharKeyTask]) if f.id == "TC-D008"]
    assert [f.severity for f in found] == ["ok"]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_outage_is_reported_at_once_then_at_a_steady_cadence_until_it_ends(caplog):
    clock = Clock()
    outage = Outage("claim", "w1", clock=clock)
    error = OperationalError("server closed the connection unexpectedly")
    with caplog.at_level(logging.DEBUG, logger="django_taskclaim.worker"):
        outage.failed(error)
        for _ in range(int(WARN_EVERY * 3 / 5)):  # a failure every 5 s for 3 intervals
            clock.now += 5
            outage.failed(error)
        outage.ok()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 4  # the first failure, then one per WARN_EVERY
    assert all("server closed the connection" in w and "worker=w1" in w for w in warnings)
    assert f"for={WARN_EVERY * 3:.0f}s" in warnings[-1]
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any("reachable again" in m for m in infos)
    assert outage.lasted() == 0.0


def test_an_outage_is_exhausted_only_once_it_has_lasted_the_bound():
    clock = Clock()
    outage = Outage("claim", "w1", give_up_after=BURST_WAIT, clock=clock)
    assert not outage.exhausted()
    outage.failed(OperationalError("down"))
    clock.now += BURST_WAIT - 1
    assert not outage.exhausted()
    clock.now += 1
    assert outage.exhausted()
    outage.ok()
    assert not outage.exhausted()
