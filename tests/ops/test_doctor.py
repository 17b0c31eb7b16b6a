"""``manage.py taskclaim_doctor`` and ``diagnose()`` on the real database: each check is
made to fail (an index dropped, a plan that skips an index, a lease nobody reaped, a
failed row, a silent worker, a heartbeat too slow, a skewed clock, a pooler, old finished
rows, a database that does not answer) and its finding names a fix that works."""

from __future__ import annotations

import json
import shutil
import subprocess
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, models
from django.test import override_settings
from django.utils import timezone

from django_taskclaim.backends import Statement, for_vendor
from django_taskclaim.db import DbNow
from django_taskclaim.models import WorkerProcess
from django_taskclaim.ops.doctor import Finding, Thresholds, diagnose, exit_code
from django_taskclaim.ops.doctor import database as doctor_database
from django_taskclaim.ops.doctor.findings import guarded
from tests.support import pgbouncer
from tests.support.helpers import PYTHON, ROOT, child_env
from tests.support.testapp.models import Document, UUIDTask
from tests.support.worker_procs import run_command

DOC = "testapp.Document"
FIELDS = {"id", "severity", "model", "database", "title", "detail", "fix"}


def one(findings: list[Finding], check_id: str, model: str | None = DOC) -> Finding:
    matches = [f for f in findings if f.id == check_id and f.model == model]
    assert len(matches) == 1, findings
    return matches[0]


def run_doctor(*args: str) -> tuple[int, str]:
    """The command's exit code (0 when it returns) and its output."""
    out = StringIO()
    try:
        call_command("taskclaim_doctor", *args, stdout=out)
    except SystemExit as exc:
        return int(str(exc.code)), out.getvalue()
    return 0, out.getvalue()


def make(status: str, *, finished: timedelta | None = None, title: str = "") -> Document:
    doc = Document.objects.create(title=title or status)
    fields: dict = {"status": status}
    if finished is not None:
        fields["finished_at"] = DbNow() - finished
    Document.objects.filter(pk=doc.pk).update(**fields)
    return doc


def declared(name: str) -> models.Index:
    return next(i for i in Document._meta.indexes if i.name == name)


# -- a healthy queue, the report, the exit codes ------------------------------------


@pytest.mark.django_db
def test_a_healthy_queue_has_no_error_and_warns_only_without_partial_indexes(vendor):
    Document.objects.create(title="fresh")
    found = diagnose([Document])
    assert [f for f in found if f.severity == "error"] == []
    warned = {f.id for f in found if f.severity == "warning"}
    # MySQL / MariaDB cannot make the claim index partial: said, with its fix.
    assert warned == ({"TC-D010"} if vendor == "mysql" else set())
    ids = {f.id for f in found}
    assert {"TC-D001", "TC-D002", "TC-D004", "TC-D005", "TC-D006", "TC-D010", "TC-D012"} <= ids
    assert "TC-D013" in ids
    assert {"TC-D020", "TC-D021", "TC-D022", "TC-D023", "TC-D030"} <= ids
    if vendor == "postgresql":
        assert one(found, "TC-D003", None).title.startswith("no pooler detected")
    if vendor != "mysql":
        assert one(found, "TC-D010").title == (
            "the claim index testapp_document_claim is in the database"
        )
        assert one(found, "TC-D011").severity == "ok"
    assert one(found, "TC-D001", None).title.startswith("database 'default' answers (")


@pytest.mark.django_db
def test_json_has_every_finding_and_the_exit_code_follows_the_worst_severity(vendor):
    code, out = run_doctor(DOC, "--json")
    data = json.loads(out)
    assert data["exit"] == code == (1 if vendor == "mysql" else 0)
    assert all(set(f) == FIELDS for f in data["findings"])
    assert {f["model"] for f in data["findings"]} == {None, DOC}
    make("failed")
    code, out = run_doctor(DOC, "--json")
    assert code == json.loads(out)["exit"] == 1
    code, out = run_doctor(DOC, "--json", "--fail-on", "error")
    assert code == json.loads(out)["exit"] == 0
    with override_settings(TASKCLAIM_HEARTBEAT_INTERVAL=15):
        code, out = run_doctor(DOC, "--json", "--fail-on", "error")
    assert code == json.loads(out)["exit"] == 2


@pytest.mark.django_db
def test_the_text_report_is_one_line_per_finding_with_the_fix_under_a_warning():
    make("failed")
    code, out = run_doctor(DOC)
    assert code == 1
    lines = out.splitlines()
    (at,) = [i for i, line in enumerate(lines) if " TC-D022 " in line]
    assert lines[at].split()[:3] == ["warning", "TC-D022", DOC]
    assert lines[at].endswith("1 failed row(s)")
    assert lines[at + 1].split()[0] == "detail:"
    assert lines[at + 2].split()[0] == "fix:"
    assert "Document.objects.failed().requeue()" in lines[at + 2]
    ok_lines = [line for line in lines if line.startswith("ok ")]
    assert ok_lines
    assert all(" TC-D0" in line for line in ok_lines)
    assert lines[-1].endswith(f"error(s); exit {code}")


@pytest.mark.django_db
def test_without_labels_every_claimable_model_is_examined():
    """Every claimable model, but PeriodicRun where no periodic function is used."""
    from django_taskclaim.periodic.reported import reported_models

    _, out = run_doctor("--json")
    examined = {f["model"] for f in json.loads(out)["findings"]}
    assert {m._meta.label for m in reported_models()} <= examined


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("nope.Model",), "no model 'nope.Model' is installed"),
        (("notalabel",), "is not a model label"),
        (("testapp.Ledger",), "testapp.Ledger is not claimable"),
        (("--database", "other"), "unknown database alias 'other'"),
        (("--fail-on", "never"), "invalid choice"),
    ],
)
def test_a_wrong_label_or_alias_is_a_one_line_error(args, message):
    with pytest.raises(CommandError, match=message) as failed:
        call_command("taskclaim_doctor", *args, stdout=StringIO())
    assert "\n" not in str(failed.value)


# -- indexes and plans -----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_claim_index_dropped_from_the_database_is_found(vendor):
    Document.objects.create(title="a")
    index = declared("testapp_document_claim")
    with connection.schema_editor() as editor:
        editor.remove_index(Document, index)
    try:
        found = diagnose([Document])
        missing = one(found, "TC-D010")
        assert missing.severity == "warning"  # 1 row: below the row threshold
        assert missing.title == (
            "the claim index testapp_document_claim is declared but not in the database"
        )
        assert missing.fix.startswith("python manage.py migrate testapp;")
        assert [f for f in found if f.id == "TC-D011"] == []  # no index to read
        big = one(diagnose([Document], limits=Thresholds(plan_min_rows=1)), "TC-D010")
        assert big.severity == "error"
    finally:
        with connection.schema_editor() as editor:
            editor.add_index(Document, index)
    back = one(diagnose([Document]), "TC-D010")
    assert back.severity == ("warning" if vendor == "mysql" else "ok")


@pytest.mark.django_db(transaction=True)
def test_a_lease_index_the_planner_cannot_use_is_reported_as_not_read(vendor):
    """Introspection shows an index led by ``locked_until``; only the plan tells that
    the reap query cannot read it (a condition it does not match, or an index MariaDB /
    MySQL is told to ignore)."""
    lease = declared("testapp_document_lease")
    wrong = models.Index(
        fields=["locked_until"], condition=models.Q(status="done"), name="tc_doctor_wrong"
    )
    hidden, shown = ("IGNORED", "NOT IGNORED")
    if vendor == "mysql" and not connection.mysql_is_mariadb:
        hidden, shown = ("INVISIBLE", "VISIBLE")
    if vendor == "mysql":
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE testapp_document ALTER INDEX {lease.name} {hidden}")
    else:
        with connection.schema_editor() as editor:
            editor.remove_index(Document, lease)
            editor.add_index(Document, wrong)
    try:
        found = diagnose([Document], limits=Thresholds(plan_min_rows=0))
        small = one(diagnose([Document]), "TC-D013")
    finally:
        if vendor == "mysql":
            with connection.cursor() as cursor:
                cursor.execute(f"ALTER TABLE testapp_document ALTER INDEX {lease.name} {shown}")
        else:
            with connection.schema_editor() as editor:
                editor.remove_index(Document, wrong)
                editor.add_index(Document, lease)
    serving = "testapp_document_lease" if vendor == "mysql" else "tc_doctor_wrong"
    if vendor == "postgresql":
        # Whether a scan or the index is cheaper on an empty table depends on the
        # statistics earlier tests left (and on the server's version): take the choice
        # away from them, so that the last look sees only whether the index can serve.
        with connection.cursor() as cursor:  # until the test's transaction ends
            cursor.execute("SET LOCAL enable_seqscan = off")
    assert one(found, "TC-D012").severity == "ok"
    unread = one(found, "TC-D013")
    assert (unread.severity, unread.title) == (
        "warning",
        f"the lease query does not read {serving}",
    )
    analyze = for_vendor(connection.vendor).analyze_sql(
        connection.ops.quote_name(Document._meta.db_table)
    )
    assert f"Refresh the planner's statistics: {analyze}" in unread.fix
    # Below the row threshold a scan is the planner's right choice: no alarm.
    assert small.severity == "ok"
    assert "rightly prefers a scan" in small.title
    assert one(diagnose([Document], limits=Thresholds(plan_min_rows=0)), "TC-D013").title == (
        "the lease query reads testapp_document_lease"
    )


@pytest.mark.django_db
def test_postgresql_plans_that_skip_the_indexes_are_warned_of_from_the_row_threshold(vendor):
    if vendor != "postgresql":
        pytest.skip("the planner switches are PostgreSQL's")
    Document.objects.create(title="a")
    with connection.cursor() as cursor:  # until the test's transaction ends
        for switch in ("enable_indexscan", "enable_bitmapscan", "enable_indexonlyscan"):
            cursor.execute(f"SET LOCAL {switch} = off")
    small = one(diagnose([Document]), "TC-D011")
    assert small.severity == "ok"
    assert "rightly prefers a scan" in small.title
    found = diagnose([Document], limits=Thresholds(plan_min_rows=1))
    claim, lease = one(found, "TC-D011"), one(found, "TC-D013")
    assert (claim.severity, lease.severity) == ("warning", "warning")
    assert "Seq Scan on testapp_document" in claim.detail
    assert 'ANALYZE "testapp_document"' in claim.fix
    assert "ClaimMeta.ordering ['-priority', 'created_at']" in claim.fix


# -- queue health ----------------------------------------------------------------------


@pytest.mark.django_db
@override_settings(TASKCLAIM_REAP_INTERVAL=3600)
def test_rows_processing_long_past_their_lease_say_to_run_the_reaper():
    stuck, recent = make("ready", title="stuck"), make("ready", title="recent")
    Document.objects.filter(pk=recent.pk).update(
        status="processing", locked_by="w", locked_until=DbNow() - timedelta(seconds=5)
    )
    fresh = one(diagnose([Document]), "TC-D021")
    assert fresh.severity == "ok"
    assert fresh.title.startswith("1 lease(s) ended less than 2h 00m ago")
    Document.objects.filter(pk=stuck.pk).update(
        status="processing", locked_by="w", locked_until=DbNow() - timedelta(days=1)
    )
    found = one(diagnose([Document]), "TC-D021")
    assert found.severity == "warning"
    assert found.title == ("1 row(s) still processing more than 2h 00m after their lease ended")
    assert "2 expired lease(s) in all" in found.detail
    assert found.fix.startswith("Run python manage.py reaper testapp.Document now")
    call_command("taskclaim_reap", DOC, stdout=StringIO())  # the fix
    assert one(diagnose([Document]), "TC-D021").title == "no row is processing past its lease"


@pytest.mark.django_db
def test_failed_rows_are_counted_with_the_way_to_retry_them():
    make("failed", finished=timedelta(0))
    found = one(diagnose([Document]), "TC-D022")
    assert (found.severity, found.title) == ("warning", "1 failed row(s)")
    assert "Document.objects.failed().requeue()" in found.fix
    assert "Retry selected failed tasks" in found.fix
    Document.objects.failed().requeue()
    assert one(diagnose([Document]), "TC-D022").severity == "ok"


@pytest.mark.django_db
def test_a_long_wait_of_the_oldest_ready_row_is_warned_of():
    make("ready")
    assert one(diagnose([Document]), "TC-D020").severity == "ok"
    Document.objects.update(created_at=DbNow() - timedelta(hours=2))
    found = one(diagnose([Document]), "TC-D020")
    assert found.severity == "warning"
    assert found.title.startswith("the oldest due ready row has waited 2h ")
    assert "0 live worker(s) serve testapp.Document" in found.detail
    assert "python manage.py worker testapp.Document" in found.fix


@pytest.mark.django_db
@override_settings(TASKCLAIM_WORKER_SILENT_AFTER=3600)
def test_a_silent_worker_is_named_with_the_command_that_frees_its_rows():
    WorkerProcess.objects.create(worker_id="host:1", hostname="host", pid=1)
    WorkerProcess.objects.create(worker_id="host:2", hostname="host", pid=2)
    WorkerProcess.objects.filter(worker_id="host:2").update(last_seen=DbNow() - timedelta(days=1))
    found = one(diagnose([Document]), "TC-D023", None)
    assert (found.severity, found.title) == ("warning", "1 silent worker(s): host:2")
    assert "host:2 is pid 2 on host" in found.detail
    assert "python manage.py reaper --release-worker host:2 " in found.fix
    WorkerProcess.objects.filter(worker_id="host:2").update(stopped_at=DbNow())
    assert one(diagnose([Document]), "TC-D023", None).severity == "ok"


@pytest.mark.django_db
def test_old_finished_rows_are_counted_with_the_prune_command_that_removes_them(vendor):
    for status in ("done", "done", "done", "cancelled", "failed"):
        make(status, finished=timedelta(days=10))
    make("done", finished=timedelta(0))
    limits = Thresholds(prune_min_rows=4)
    found = one(diagnose([Document], limits=limits), "TC-D030")
    assert found.severity == "warning"
    assert found.title == "4 done or cancelled row(s) finished more than 7d ago"
    assert ("size unknown" if vendor == "sqlite" else "the table takes ") in found.detail
    command = found.fix.split(" (")[0]
    assert command == "python manage.py taskclaim_prune --older-than 7d testapp.Document"
    assert one(diagnose([Document]), "TC-D030").severity == "ok"  # below 10,000 rows
    call_command(*command.split()[2:], stdout=StringIO())  # the fix, as printed
    after = one(diagnose([Document], limits=limits), "TC-D030")
    assert (after.severity, after.title) == (
        "ok",
        "0 done or cancelled row(s) finished more than 7d ago",
    )
    assert sorted(Document.objects.values_list("status", flat=True)) == ["done", "failed"]


# -- settings, clock, pooler -----------------------------------------------------------


@pytest.mark.django_db
def test_a_heartbeat_of_half_the_lease_is_an_error():
    with override_settings(TASKCLAIM_HEARTBEAT_INTERVAL=15):  # Document's lease: 30 s
        found = one(diagnose([Document]), "TC-D005")
    assert found.severity == "error"
    assert found.title.startswith("TASKCLAIM_HEARTBEAT_INTERVAL (15s) is not under half")
    assert found.fix.startswith("Lower TASKCLAIM_HEARTBEAT_INTERVAL")
    assert found.detail == "system check taskclaim.E006"
    with override_settings(TASKCLAIM_HEARTBEAT_INTERVAL=14):
        found = one(diagnose([Document]), "TC-D005")
    assert (found.severity, found.title) == ("ok", "heartbeats every 14s keep the 30s lease alive")


@pytest.mark.django_db
def test_commits_that_a_server_crash_may_forget_are_an_error(vendor):
    """A forgotten claim hands its token out twice: the doctor reads the session's
    durability as the workers' connections have it (PostgreSQL: synchronous_commit)."""
    found = one(diagnose([Document]), "TC-D006", None)
    assert found.severity == "ok"
    if vendor != "postgresql":
        return
    assert found.title == "commits are flushed to disk (on)"
    with connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit = off")
    try:
        found = one(diagnose([Document]), "TC-D006", None)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET synchronous_commit")
    assert found.severity == "error"
    assert found.title.startswith("synchronous_commit is off")
    assert "the next claim hands that token out again" in found.detail
    assert "synchronous_commit = on" in found.fix
    assert one(diagnose([Document]), "TC-D006", None).severity == "ok"


@pytest.mark.parametrize(
    ("vendor_name", "value", "severity"),
    [
        ("postgresql", "on", None),
        ("postgresql", "local", None),
        ("postgresql", "remote_apply", None),
        ("postgresql", "off", "error"),
        ("mysql", 1, None),
        ("mysql", 2, "warning"),
        ("mysql", 0, "error"),
        ("sqlite", None, None),
    ],
)
def test_what_each_vendor_calls_a_forgettable_commit(vendor_name, value, severity):
    problem = for_vendor(vendor_name).commit_durability(value)
    assert (problem[0] if problem else None) == severity


@pytest.mark.django_db
@override_settings(TASKCLAIM_LEASE=-1)
def test_an_invalid_lease_is_an_error_finding_not_a_traceback():
    found = diagnose([UUIDTask])  # its lease comes from TASKCLAIM_LEASE
    bad = one(found, "TC-D005", "testapp.UUIDTask")
    assert (bad.severity, bad.title) == ("error", "the claim options are invalid")
    assert "lease must be > 0" in bad.detail
    assert bad.fix == "Run python manage.py check --tag taskclaim and correct what it reports."
    clock = one(found, "TC-D004", None)
    assert clock.severity == "ok"
    assert "(none valid)" in clock.detail
    assert run_doctor("testapp.UUIDTask")[0] == 2


@pytest.mark.django_db
def test_a_clock_offset_warns_above_a_second_and_is_an_error_above_a_tenth_of_the_lease(
    monkeypatch,
):
    assert one(diagnose([Document]), "TC-D004", None).severity == "ok"
    monkeypatch.setattr(doctor_database, "host_now", lambda: timezone.now() + timedelta(hours=1))
    found = one(diagnose([Document]), "TC-D004", None)
    assert found.severity == "error"
    assert "behind this host's" in found.title
    assert "NTP" in found.fix
    # UUIDTask's lease is TASKCLAIM_LEASE: a minute is over a second but under 360 s.
    monkeypatch.setattr(doctor_database, "host_now", lambda: timezone.now() - timedelta(minutes=1))
    with override_settings(TASKCLAIM_LEASE=3600):
        found = one(diagnose([UUIDTask]), "TC-D004", None)
    assert found.severity == "warning"
    assert "ahead of this host's" in found.title


@pytest.mark.django_db
def test_a_skewed_host_clock_is_found_by_the_command(vendor):
    if vendor == "sqlite":
        pytest.skip("SQLite's clock is the clock of the process that runs it: no offset")
    faketime = shutil.which("faketime")
    if not faketime:
        pytest.skip("faketime is not installed (apt-get install faketime)")
    proc = subprocess.run(
        [faketime, "-f", "+1h", PYTHON, "-m", "tests.support.worker_entry", "taskclaim_doctor", DOC,
         "--json"],
        env=child_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )  # fmt: skip
    data = json.loads(proc.stdout)
    assert proc.returncode == data["exit"] == 2, proc.stderr[-2000:]
    (clock,) = [f for f in data["findings"] if f["id"] == "TC-D004"]
    assert clock["severity"] == "error"
    assert "behind this host's" in clock["title"]


@pytest.mark.django_db
@override_settings(TASKCLAIM_POOLER_MODE="transaction")
def test_a_declared_transaction_pooler_warns_of_the_session_features_it_breaks(vendor):
    found = [f for f in diagnose([Document]) if f.id == "TC-D002"]
    if vendor != "postgresql":
        assert [f.severity for f in found] == ["ok"]
        return
    assert {f.detail for f in found} == {
        "system check taskclaim.W003",
        "system check taskclaim.W010",
    }
    assert {f.severity for f in found} == {"warning"}
    assert any("DISABLE_SERVER_SIDE_CURSORS" in f.fix for f in found)


@pytest.mark.django_db
def test_an_undeclared_pooler_in_front_of_postgresql_is_detected(vendor):
    if vendor != "postgresql":
        pytest.skip("pgBouncer sits in front of PostgreSQL")
    if pgbouncer.binary() is None:
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer)")
    name = str(connection.settings_dict["NAME"])
    with pgbouncer.run_pgbouncer(connection.settings_dict, {name: (name, 2)}) as port:
        proc = run_command(
            "taskclaim_doctor",
            DOC,
            "--json",
            env={"DATABASE_URL": f"postgres://postgres@127.0.0.1:{port}/postgres"},
            timeout=120,
        )
    data = json.loads(proc.stdout)
    assert proc.returncode == data["exit"] == 1, proc.stderr[-2000:]
    (proxy,) = [f for f in data["findings"] if f["id"] == "TC-D003"]
    assert proxy["severity"] == "warning"
    assert "a pooler or proxy sits between" in proxy["detail"]
    assert proxy["fix"].startswith('Set TASKCLAIM_POOLER_MODE = "transaction"')
    assert [f["id"] for f in data["findings"] if f["severity"] != "ok"] == ["TC-D003"]


@pytest.mark.slow
def test_an_unreachable_database_is_one_error_finding_not_a_traceback(vendor, tmp_path):
    url = {
        "postgresql": "postgres://postgres@127.0.0.1:1/postgres",
        "mysql": "mysql://root@127.0.0.1:1/test",
        "sqlite": f"sqlite:///{tmp_path}/no/such/dir/db.sqlite3",
    }[vendor]
    proc = run_command(
        "taskclaim_doctor",
        DOC,
        "--json",
        env={"DATABASE_URL": url, "TASKCLAIM_TEST_DB_NAME": ""},
        timeout=120,
    )
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    assert proc.returncode == data["exit"] == 2
    (down,) = [f for f in data["findings"] if f["severity"] == "error"]
    assert (down["id"], down["title"]) == ("TC-D001", "database 'default' cannot be reached")
    assert down["detail"]
    assert "\n" not in down["detail"]
    assert down["fix"].startswith("Check DATABASES['default'] (HOST, PORT, NAME")
    assert not [f for f in data["findings"] if f["id"].startswith(("TC-D01", "TC-D02", "TC-D03"))]


# -- the pieces ------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_check_that_fails_on_the_database_is_one_error_finding_and_harms_no_other():
    def broken() -> list[Finding]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT * FROM taskclaim_no_such_table")
        return []

    (found,) = guarded("TC-D010", "claim index", "default", DOC, broken)
    assert (found.severity, found.title) == ("error", "claim index: the check failed")
    assert "taskclaim_no_such_table" in found.detail
    assert "migrate" in found.fix
    assert Document.objects.count() == 0  # the transaction around the test still works


def test_a_warning_or_an_error_must_name_its_fix():
    with pytest.raises(ValueError, match="must name its fix"):
        Finding("TC-D999", "warning", "default", "t")
    with pytest.raises(ValueError, match="severity"):
        Finding("TC-D999", "fatal", "default", "t", fix="x")  # type: ignore[arg-type]
    ok = Finding("TC-D999", "ok", "default", "t")
    warning = Finding("TC-D999", "warning", "default", "t", fix="x")
    error = Finding("TC-D999", "error", "default", "t", fix="x")
    assert exit_code([]) == exit_code([ok]) == 0
    assert exit_code([ok, warning]) == 1
    assert exit_code([warning], fail_on="error") == 0
    assert exit_code([ok, warning, error]) == exit_code([error], fail_on="error") == 2


CLAIM_INDEX = "testapp_document_claim"
PLANS = {
    "postgresql": (
        [{"QUERY PLAN": "Limit"}, {"QUERY PLAN": f"  ->  Index Scan using {CLAIM_INDEX} on t"}],
        [{"QUERY PLAN": "Limit"}, {"QUERY PLAN": "  ->  Seq Scan on testapp_document"}],
    ),
    "mysql": (
        [{"table": "t", "type": "index", "key": CLAIM_INDEX, "Extra": "Using where"}],
        [{"table": "t", "type": "ALL", "key": None, "Extra": "Using filesort"}],
    ),
    "sqlite": (
        [{"id": 3, "parent": 0, "notused": 0, "detail": f"SCAN t USING INDEX {CLAIM_INDEX}"}],
        [{"id": 2, "parent": 0, "notused": 0, "detail": "SCAN testapp_document"}],
    ),
}


@pytest.mark.parametrize("name", sorted(PLANS))
def test_each_vendor_reads_its_plans_and_names_its_statements(name):
    sql = for_vendor(name)
    reads, scans = PLANS[name]
    assert sql.explains_plans
    assert sql.plan_uses_index(reads, "testapp_document_claim") is True
    assert sql.plan_uses_index(reads, "testapp_document_cl") is False  # whole names only
    assert sql.plan_uses_index(scans, "testapp_document_claim") is False
    assert "testapp_document_claim" in sql.plan_summary(reads)
    statement = sql.explain("SELECT 1 WHERE 2 = %s", (2,))
    assert statement.sql.endswith(" SELECT 1 WHERE 2 = %s")
    assert statement.params == (2,)
    size = sql.table_size("t", '"t"')
    if name == "sqlite":
        assert size is None
    else:
        assert size is not None
        assert size.sql.count("%s") == len(size.params) == 1


def test_postgresql_reads_bitmap_scans_and_quoted_names_and_others_cannot_tell():
    pg = for_vendor("postgresql")
    bitmap = [{"QUERY PLAN": "  ->  Bitmap Index Scan on testapp_document_lease"}]
    assert pg.plan_uses_index(bitmap, "testapp_document_lease") is True
    quoted = [{"QUERY PLAN": 'Index Only Scan using "Odd_Index" on t'}]
    assert pg.plan_uses_index(quoted, "Odd_Index") is True
    assert pg.explain("SELECT 1") == Statement("EXPLAIN (COSTS OFF) SELECT 1", ())
    other = for_vendor("oracle")
    assert not other.explains_plans
    assert other.plan_uses_index(PLANS["postgresql"][0], "testapp_document_claim") is None
    assert other.table_size("t", '"t"') is None
    assert other.analyze_sql('"t"') is None
