"""History out of the hot table: finished rows moved to an archive model.

The move copies every column exactly, leaves every row that is not old and finished,
and under concurrent claims, completions and requeues no row is ever lost, in both
tables, or archived in a state other than the one it finished in.
"""

from __future__ import annotations

import random
import threading
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections, models
from django.db.models import F
from django.test.utils import isolate_apps

from django_taskclaim.config.claim_meta import is_archive
from django_taskclaim.config.discovery import claimable_models, resolve_model
from django_taskclaim.db import DbNow
from django_taskclaim.exceptions import ConfigurationError, NotClaimableError
from django_taskclaim.models import ClaimableModel
from django_taskclaim.recovery.archive import archive_finished, archive_of, archive_problems
from tests.support.archiveapp.models import Receipt, ReceiptArchive, Report, ReportArchive, Shelf

OLD = timedelta(days=10)


def _age(qs, by: timedelta = OLD) -> None:
    qs.update(finished_at=DbNow() - by)


def _columns(model) -> dict[str, str]:
    return {
        f.column: f.get_internal_type()
        for f in model._meta.concrete_fields
        if not isinstance(f, models.GeneratedField)
    }


# -- the archive model -----------------------------------------------------------------


def test_archive_of_has_every_column_and_no_index_or_constraint():
    hot, cold = _columns(Report), _columns(ReportArchive)
    assert set(cold) == set(hot)
    assert cold["id"] == "BigIntegerField"  # the hot ids, not new ones
    assert "report_title" in cold
    assert ReportArchive._meta.indexes == []
    assert ReportArchive._meta.constraints == []
    shelf = ReportArchive._meta.get_field("shelf")
    assert shelf.db_constraint is False
    assert shelf.remote_field.on_delete is models.DO_NOTHING
    assert not any(f.unique for f in ReportArchive._meta.fields if not f.primary_key)
    # The generated column is derived: left out of the archive.
    assert "shouted" not in _columns(ReceiptArchive)
    assert ReceiptArchive._meta.db_table == "archiveapp_receipt_history"
    assert ReceiptArchive._meta.pk.column == "receipt code"


def test_an_archive_is_never_claimed():
    assert is_archive(ReportArchive)
    assert is_archive(ReceiptArchive)
    assert not is_archive(Report)
    assert ReportArchive not in list(claimable_models())
    assert Report in list(claimable_models())
    with pytest.raises(NotClaimableError):
        resolve_model("archiveapp.ReportArchive")


def test_checks_refuse_an_archive_that_cannot_take_the_rows(monkeypatch):
    from django_taskclaim.checks.core import check_models

    with isolate_apps("tests.support.archiveapp") as registry:
        # Labels resolve, and claimable models are found, in the isolated registry.
        for module in ("options", "discovery", "claim_meta"):
            monkeypatch.setattr(f"django_taskclaim.config.{module}.apps", registry)

        class Ticket(ClaimableModel):
            note = models.CharField(max_length=10)

            class Meta(ClaimableModel.Meta):
                app_label = "archiveapp"

            class ClaimMeta:
                archive = "archiveapp.TicketHistory"

            def process(self) -> None:
                pass

        class TicketHistory(models.Model):  # no "note", no claim fields
            id = models.BigIntegerField(primary_key=True)

            class Meta:
                app_label = "archiveapp"

        class Pinned(ClaimableModel):
            class Meta(ClaimableModel.Meta):
                app_label = "archiveapp"

            class ClaimMeta:
                archive = "archiveapp.PinnedArchive"

            def process(self) -> None:
                pass

        archive_of(Pinned)

        class Pin(models.Model):
            pinned = models.ForeignKey(Pinned, on_delete=models.CASCADE)

            class Meta:
                app_label = "archiveapp"

        class Lost(ClaimableModel):
            class Meta(ClaimableModel.Meta):
                app_label = "archiveapp"

            class ClaimMeta:
                archive = "archiveapp.Nowhere"

        class Itself(ClaimableModel):
            class Meta(ClaimableModel.Meta):
                app_label = "archiveapp"

            class ClaimMeta:
                archive = "archiveapp.Itself"

        problems = " | ".join(archive_problems(Ticket))
        assert "TicketHistory has no column(s) status, version, locked_until" in problems
        assert problems.endswith("note; build it with archive_of(Ticket) or add them")
        assert "archiveapp.Pin point(s) at it" in " ".join(archive_problems(Pinned))
        with pytest.raises(ConfigurationError, match="not an installed model"):
            archive_problems(Lost)
        with pytest.raises(ConfigurationError, match="names the model itself"):
            archive_problems(Itself)
        found = check_models()
        e040 = {m.obj: m.msg for m in found if m.id == "taskclaim.E040"}
        assert set(e040) == {Ticket, Pinned, Lost, Itself}
        assert is_archive(TicketHistory)
        with pytest.raises(ConfigurationError, match="TicketHistory has no column"):
            archive_finished(Ticket, older_than=OLD)


# -- moving rows -------------------------------------------------------------------------


def _seed() -> dict[str, list]:
    shelf = Shelf.objects.create(name="s")
    rows: dict[str, list] = {}
    for state in ("ready", "processing", "done", "failed", "cancelled"):
        rows[state] = [
            Report.objects.create(
                title=f"{state} {i} ünïcode", status=state, shelf=shelf, payload={"i": i}
            )
            for i in range(3)
        ]
    for state in ("done", "failed", "cancelled"):
        Report.objects.filter(status=state).update(attempts=2, version=F("version") + 5)
        _age(Report.objects.filter(pk__in=[r.pk for r in rows[state][:2]]))
        Report.objects.filter(pk=rows[state][2].pk).update(finished_at=DbNow())
    return rows


@pytest.mark.django_db(transaction=True)
def test_moves_old_finished_rows_with_every_value_and_keeps_the_rest():
    rows = _seed()
    before = {r["id"]: r for r in Report.objects.values()}
    assert archive_finished(Report, older_than=timedelta(days=7), dry_run=True) == 4
    assert ReportArchive.objects.count() == 0

    assert archive_finished(Report, older_than=timedelta(days=7), batch_size=3) == 4

    moved = {r.pk for s in ("done", "cancelled") for r in rows[s][:2]}
    assert set(ReportArchive.objects.values_list("pk", flat=True)) == moved
    assert not Report.objects.filter(pk__in=moved).exists()
    assert Report.objects.count() == 15 - 4  # ready, processing, failed, and the recent
    for row in ReportArchive.objects.values():
        assert row == before[row["id"]]  # title (renamed column), JSON, FK id, version …
    # Nothing left to move: a second run moves nothing; failed ones need asking.
    assert archive_finished(Report, older_than=timedelta(days=7)) == 0
    assert archive_finished(Report, older_than=timedelta(days=7), states=["failed"]) == 2
    # The archive keeps its rows when what they pointed at goes (no FK constraint).
    Shelf.objects.all().delete()
    assert ReportArchive.objects.count() == 6


@pytest.mark.django_db(transaction=True)
def test_text_keys_and_quoted_columns_move():
    codes = ["a b", "ключ", "x'y", 'q"z', "last"]
    for code in codes:
        Receipt.objects.create(code=code, status="done")
    _age(Receipt.objects.exclude(code="last"))
    assert archive_finished(Receipt, older_than=timedelta(days=1), batch_size=2) == 4
    assert sorted(ReceiptArchive.objects.values_list("pk", flat=True)) == sorted(codes[:4])
    assert list(Receipt.objects.values_list("pk", "shouted")) == [("last", "LAST")]


@pytest.mark.django_db(transaction=True)
def test_bad_arguments_are_configuration_errors():
    from tests.support.testapp.models import Document

    with pytest.raises(ConfigurationError, match=r"declares no ClaimMeta\.archive"):
        archive_finished(Document, older_than=OLD)
    with pytest.raises(ConfigurationError, match="can only archive finished states"):
        archive_finished(Report, older_than=OLD, states=["processing"])
    with pytest.raises(ConfigurationError, match="batch_size"):
        archive_finished(Report, older_than=OLD, batch_size=0)


@pytest.mark.django_db(transaction=True)
def test_prune_command_moves_rows_of_a_model_with_an_archive():
    _seed()
    out = StringIO()
    call_command(
        "taskclaim_prune", "archiveapp.Report", "--older-than", "7d", "--dry-run", stdout=out
    )
    assert "archiveapp.Report: would move 4 row(s) to archiveapp.ReportArchive" in out.getvalue()
    assert "total: would prune 4 row(s)" in out.getvalue()
    out = StringIO()
    call_command("taskclaim_prune", "archiveapp.Report", "--older-than", "7d", stdout=out)
    assert "archiveapp.Report: moved 4 row(s) to archiveapp.ReportArchive" in out.getvalue()
    assert ReportArchive.objects.count() == 4
    with pytest.raises(CommandError, match="is an archive of finished rows"):
        call_command("taskclaim_prune", "archiveapp.ReportArchive", "--older-than", "7d")


# -- under load --------------------------------------------------------------------------

ROWS = 600


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_no_row_is_lost_or_doubled_while_workers_claim_complete_and_requeue():
    """Three workers claim and complete, one operator requeues done rows, one archiver
    moves done rows as soon as they finish. At every point a row is in exactly one
    table; at the end every row is archived once, done, with the token of its last
    completion; a requeued row was never archived before it ran again."""
    Report.objects.bulk_create(Report(title=f"r{i}") for i in range(ROWS))
    all_pks = set(Report.objects.values_list("pk", flat=True))
    completions: dict[int, int] = {}  # pk -> token of the last completion
    requeued: set[int] = set()
    errors: list[BaseException] = []
    lock = threading.Lock()
    stop = threading.Event()

    def guarded(fn):
        def run() -> None:
            try:
                fn()
            except BaseException as exc:
                errors.append(exc)
                stop.set()
            finally:
                connections.close_all()

        return run

    def worker() -> None:
        idle = 0
        while not stop.is_set() and idle < 50:
            task = Report.objects.claim_next()
            if task is None:
                idle += 1
                stop.wait(0.01)
                continue
            idle = 0
            task.complete()
            with lock:
                # The highest token is the last completion: another worker may have
                # completed the row again (requeued meanwhile) before this line ran.
                completions[task.pk] = max(completions.get(task.pk, 0), task.version)

    def operator() -> None:
        rng = random.Random(7)
        for _ in range(40):
            if stop.is_set():
                return
            pks = list(Report.objects.filter(status="done").values_list("pk", flat=True)[:50])
            if pks:
                pick = rng.sample(pks, min(3, len(pks)))
                n = Report.objects.filter(pk__in=pick).requeue()
                if n:
                    with lock:
                        requeued.update(pick)
            stop.wait(0.005)

    def archiver() -> None:
        while not stop.is_set():
            archive_finished(Report, older_than=timedelta(0), batch_size=25)
            # a row in both tables, at any commit, would be seen here
            hot = set(Report.objects.values_list("pk", flat=True))
            cold = set(ReportArchive.objects.values_list("pk", flat=True))
            assert not hot & cold, f"rows in both tables: {sorted(hot & cold)[:5]}"

    threads = [threading.Thread(target=guarded(worker)) for _ in range(3)]
    threads += [
        threading.Thread(target=guarded(operator)),
        threading.Thread(target=guarded(archiver)),
    ]
    for t in threads:
        t.start()
    for t in threads[:4]:
        t.join(timeout=240)
    stop.set()
    threads[4].join(timeout=60)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    # Whatever was requeued and not yet run again runs now; then the last move.
    while (task := Report.objects.claim_next()) is not None:
        task.complete()
        completions[task.pk] = task.version
    archive_finished(Report, older_than=timedelta(0))

    assert Report.objects.count() == 0
    archived = dict(ReportArchive.objects.values_list("pk", "version"))
    assert set(archived) == all_pks  # none lost, none twice (pk is the archive's key)
    assert set(ReportArchive.objects.values_list("status", flat=True)) == {"done"}
    assert archived == completions  # the state each row last finished in
    assert requeued, "the operator requeued nothing: the race was not exercised"


@pytest.mark.django_db(transaction=True)
def test_batches_go_in_keyset_order():
    """Each batch picks past the last key the previous one moved, so it never walks the
    index entries the earlier deletions left behind (each batch slower than the last)."""
    from django.test.utils import CaptureQueriesContext

    Report.objects.bulk_create(Report(title=f"k{i}", status="done") for i in range(7))
    _age(Report.objects.all())
    keys = sorted(Report.objects.values_list("pk", flat=True))
    with CaptureQueriesContext(connection) as seen:
        assert archive_finished(Report, older_than=timedelta(days=1), batch_size=3) == 7
    picks = [q["sql"].replace("`", '"') for q in seen.captured_queries if "ORDER BY" in q["sql"]]
    assert len(picks) == 3
    assert " > " not in picks[0]
    assert f'"archiveapp_report"."id" > {keys[2]}' in picks[1]
    assert f'"archiveapp_report"."id" > {keys[5]}' in picks[2]
