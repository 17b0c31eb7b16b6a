"""The per-minute history of the admin's charts: a real burst worker's counts land in
``TaskHistory`` (one row per model, queue and minute, matching the rows' outcomes),
two writers adding to the same minutes concurrently lose nothing, old rows are pruned,
and the charts and the dashboard read it."""

from __future__ import annotations

import threading
from datetime import UTC, timedelta

import pytest
from django.db import connection, connections, models
from django.db.models import Sum
from django.urls import reverse

from django_taskclaim.backends.history import (
    KEEP_DAYS,
    history_sql,
    is_cut,
    queue_length,
    stored_queue,
)
from django_taskclaim.db import db_now
from django_taskclaim.models import TaskHistory
from django_taskclaim.ops.history import done_in_windows, recent_queues, uses_history
from django_taskclaim.recovery.prune import prune_history, prune_models
from django_taskclaim.worker.history import History
from tests.support.flowapp.models import Errand
from tests.support.testapp.models import Document
from tests.support.worker_procs import WorkerProc, stop_all


@pytest.fixture
def procs(transactional_db):
    started: list[WorkerProc] = []
    yield started
    stop_all(started)


def minute_now():
    return db_now().astimezone(UTC).replace(second=0, microsecond=0)


def test_a_burst_worker_writes_its_outcomes_per_minute(procs):
    Document.objects.bulk_create([Document(title=f"ok{i}") for i in range(30)])
    Document.objects.bulk_create(
        [Document(title=f"bad{i}", payload={"fail": "no"}) for i in range(4)]
    )
    w = WorkerProc("testapp.Document", "--burst", "--concurrency", "2", "--batch", "5")
    procs.append(w)
    assert w.wait(90) == 0, w.stderr()
    assert Document.objects.done().count() == 30
    assert Document.objects.failed().count() == 4
    rows = list(TaskHistory.objects.filter(model="testapp.Document"))
    assert rows, "the worker wrote no history"
    assert sum(r.done for r in rows) == 30
    assert sum(r.failed for r in rows) == 4
    assert {r.queue for r in rows} == {""}  # Document has no queues
    # Every minute is one the rows finished in (database clock), give or take the edge.
    finished = {
        m.astimezone(UTC).replace(second=0, microsecond=0)
        for m in Document.objects.values_list("finished_at", flat=True)
    }
    near = finished | {m + timedelta(minutes=1) for m in finished}
    near |= {m - timedelta(minutes=1) for m in finished}
    assert {r.minute.astimezone(UTC) for r in rows} <= near


def test_a_worker_with_queues_writes_one_row_per_queue(procs):
    Errand.objects.bulk_create([Errand(queue_name=q) for q in ["a"] * 5 + ["b"] * 3])
    w = WorkerProc("flowapp.Errand", "--burst")
    procs.append(w)
    assert w.wait(90) == 0, w.stderr()
    got = dict(
        TaskHistory.objects.filter(model="flowapp.Errand")
        .values("queue")
        .annotate(n=Sum("done"))
        .values_list("queue", "n")
    )
    assert got == {"a": 5, "b": 3}


LONG_QUEUE = "q" * 300  # longer than the history's queue column (255)


@pytest.mark.slow
def test_a_queue_name_longer_than_the_history_column_loses_no_counts(procs):
    """One row whose queue name the history's column cannot hold: every completion of
    the worker is still counted, that queue's under its cut name (the same on write and
    read), the other queue's under its own."""
    Errand.objects.bulk_create([Errand(queue_name="a") for _ in range(19)])
    Errand.objects.create(queue_name=LONG_QUEUE)
    w = WorkerProc("flowapp.Errand", "--burst")
    procs.append(w)
    assert w.wait(90) == 0, w.stderr()
    assert Errand.objects.done().count() == 20, (
        list(Errand.objects.exclude(queue_name="a").values("status", "last_error")),
        w.stderr()[-3000:],
    )
    got = dict(
        TaskHistory.objects.filter(model="flowapp.Errand")
        .values("queue")
        .annotate(n=Sum("done"))
        .values_list("queue", "n")
    )
    cut = stored_queue(LONG_QUEUE)
    assert got == {"a": 19, cut: 1}
    assert len(cut) == queue_length() == 255
    assert cut.startswith("q" * 200)
    assert cut != stored_queue("q" * 299 + "r")  # two long names stay apart
    assert is_cut(cut)
    assert not is_cut("a")
    assert recent_queues("flowapp.Errand", using="default") == {"a"}  # no queue named so


@pytest.mark.django_db(transaction=True)
def test_a_row_the_database_refuses_loses_only_its_own_counts(caplog):
    """A flush with one row the database refuses for what it holds (here a model label
    longer than its column) writes the others and drops that one, once, with a warning:
    it is not kept to fail every later flush, nor does it take the others with it."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite stores a text of any length: no row is refused")
    history = History()
    for _ in range(5):
        history.count(Document(title="x"), "done")
    for _ in range(3):
        history.count(Errand(queue_name="b"), "failed")
    history._add("x." + "M" * 300, "", 0, 2)  # a model label the column cannot hold
    with caplog.at_level("WARNING", logger="django_taskclaim.worker"):
        assert history.flush("default") == 8
    assert history.pending() == 0
    got = {(r.model, r.queue, r.done, r.failed) for r in TaskHistory.objects.all()}
    assert got == {("testapp.Document", "", 5, 0), ("flowapp.Errand", "b", 0, 3)}
    (warning,) = [r.getMessage() for r in caplog.records if "history" in r.getMessage()]
    assert warning.startswith("history counts dropped model=x.MMMM")
    assert "attempts=2 " in warning
    history.count(Document(title="y"), "done")
    assert history.flush("default") == 1  # the next flush is a plain one


@pytest.mark.django_db(transaction=True)
def test_two_writers_adding_to_the_same_minutes_lose_nothing():
    """Two threads, each its own connection, add to the same (model, queue, minute) keys
    at once, in opposite orders, many times: every count is there."""
    minute = minute_now()
    keys = [("x.Model", q, minute - timedelta(minutes=k)) for q in ("a", "b") for k in range(5)]
    rounds = 20
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def writer(order: list) -> None:
        try:
            barrier.wait(30)
            for _ in range(rounds):
                History.write([(m, q, t, 1, 2) for m, q, t in order], "default")
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [
        threading.Thread(target=writer, args=(keys,)),
        threading.Thread(target=writer, args=(list(reversed(keys)),)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    rows = TaskHistory.objects.filter(model="x.Model")
    assert rows.count() == len(keys)
    assert {(r.done, r.failed) for r in rows} == {(2 * rounds, 4 * rounds)}


@pytest.mark.django_db
def test_flush_files_counts_under_the_database_minute_and_keeps_them_on_failure():
    history = History()
    task = Errand(queue_name="mail")
    for _ in range(3):
        history.count(task, "done")
    history.count(task, "failed")
    history.count(task, "ready")  # a retry: not a finished attempt
    history.count_written([Errand(queue_name="mail"), task], lost=[task])
    history.count_written([task], lost=None)  # nothing was written
    assert history.pending() == 5
    before = minute_now()
    assert history.flush("default") == 5
    assert history.pending() == 0
    (row,) = TaskHistory.objects.filter(model="flowapp.Errand")
    assert (row.queue, row.done, row.failed) == ("mail", 4, 1)
    assert before <= row.minute.astimezone(UTC) <= minute_now()
    assert history.flush("default") == 0  # nothing new: no write
    assert done_in_windows("flowapp.Errand", (5, 60), db_now(), using="default") == {5: 4, 60: 4}


@pytest.mark.django_db
def test_old_history_is_pruned_after_seven_days():
    now = minute_now()
    TaskHistory.objects.create(model="x.M", minute=now - timedelta(days=KEEP_DAYS, minutes=5))
    TaskHistory.objects.create(model="x.M", minute=now - timedelta(days=KEEP_DAYS - 1))
    TaskHistory.objects.create(model="x.M", minute=now)
    assert prune_history("default") == 1
    assert TaskHistory.objects.count() == 2
    TaskHistory.objects.create(model="x.M", minute=now - timedelta(days=30))
    result = prune_models([Document], older_than=timedelta(days=365))
    assert result.history == 1
    assert TaskHistory.objects.count() == 2


@pytest.mark.django_db
def test_the_dashboard_reads_the_history_once_a_worker_wrote_it(admin_client):
    docs = Document.objects.bulk_create([Document(title=f"d{i}") for i in range(3)])
    Document.objects.filter(pk__in=[d.pk for d in docs]).update(status="done", finished_at=db_now())
    url = reverse("admin:taskclaim_dashboard")
    row = {r["label"]: r for r in admin_client.get(url).context["taskclaim_rows"]}
    doc = row["testapp.Document"]
    assert (doc["done_5"], doc["done_source"]) == (3, "rows")  # no history yet: the rows
    assert not uses_history(Document)
    now = minute_now()
    History.write(
        [
            ("testapp.Document", "", now, 7, 1),
            ("testapp.Document", "", now - timedelta(minutes=10), 5, 0),
            ("testapp.Document", "", now - timedelta(minutes=90), 100, 0),
        ],
        "default",
    )
    resp = admin_client.get(url)
    doc = {r["label"]: r for r in resp.context["taskclaim_rows"]}["testapp.Document"]
    assert (doc["done_5"], doc["done_60"], doc["done_source"]) == (7, 12, "history")
    # Small table: every state is counted exactly.
    assert {c["state"]: c["count"] for c in doc["cells"]}["done"] == 3
    assert not any(c["estimated"] for c in doc["cells"])
    html = resp.content.decode()
    section = html.split('data-model="testapp.Document" data-source="')[1][:7]
    assert section == "history"
    assert 'data-window="hour" data-done="12" data-failed="1"' in html
    assert 'data-window="day" data-done="112" data-failed="1"' in html


@pytest.mark.skipif(connection.vendor != "postgresql", reason="planner estimates: PostgreSQL")
@pytest.mark.django_db
def test_a_large_table_shows_estimates_for_finished_states(admin_client, settings):
    from django_taskclaim.ops import figures

    Document.objects.bulk_create([Document(title=f"d{i}") for i in range(30)])
    Document.objects.filter(pk__lte=Document.objects.order_by("pk")[19].pk).update(status="done")
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {Document._meta.db_table}")
    old, figures.EXACT_UP_TO = figures.EXACT_UP_TO, 10
    try:
        stats = figures.model_stats(Document, fast=True)
    finally:
        figures.EXACT_UP_TO = old
    assert stats.counts["ready"] == 10  # exact: its index
    # waiting: exactly 0 for a model no row of which ever waited (one index probe)
    assert sorted(stats.estimated) == ["cancelled", "done", "failed"]
    assert stats.counts["waiting"] == 0
    assert stats.counts["done"] == pytest.approx(20, abs=2)
    assert figures.model_stats(Document).counts["done"] == 20  # without fast: exact
    assert history_sql(connection) is not None


@pytest.mark.skipif(connection.vendor != "postgresql", reason="planner estimates: PostgreSQL")
@pytest.mark.django_db
def test_the_changelist_summary_of_a_large_table_scans_no_finished_row(admin_client, monkeypatch):
    """The changelist's per-state summary follows the dashboard's rule on a large table:
    ``ready`` / ``processing`` exact through their indexes, the finished states the
    planner's estimates shown with "≈"; no GROUP BY over every row (a scan of the table,
    100-250 ms at 1 M rows)."""
    from django.test.utils import CaptureQueriesContext

    from django_taskclaim.ops import figures

    docs = Document.objects.bulk_create([Document(title=f"d{i}") for i in range(30)])
    Document.objects.filter(pk__in=[d.pk for d in docs[:20]]).update(status="done")
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {Document._meta.db_table}")
    monkeypatch.setattr(figures, "EXACT_UP_TO", 10)
    # the workers' history exists: the charts read it, not the rows
    TaskHistory.objects.create(model="testapp.Document", queue="", minute=db_now(), done=20)
    with CaptureQueriesContext(connection) as queries:
        resp = admin_client.get(reverse("admin:testapp_document_changelist"))
    items = {i["state"]: i for i in resp.context["taskclaim_summary"]["items"]}
    assert (items["ready"]["count"], items["ready"]["estimated"]) == (10, False)
    assert items["done"]["estimated"]
    assert items["done"]["count"] == pytest.approx(20, abs=2)
    assert f"{items['done']['label']} ≈{items['done']['count']}" in resp.content.decode()
    grouped = [
        q["sql"]
        for q in queries.captured_queries
        if "GROUP BY" in q["sql"] and f'FROM "{Document._meta.db_table}"' in q["sql"]
    ]
    assert grouped == []


@pytest.mark.skipif(connection.vendor != "postgresql", reason="planner estimates: PostgreSQL")
@pytest.mark.django_db
def test_a_large_table_counts_failed_rows_exactly_where_an_index_serves_them(
    admin_client, monkeypatch
):
    """The dashboard's failed count matches the changelist's on a large table once the
    model has the partial index over its failed rows that docs/observability.md
    suggests: an exact count through that index, not the planner's estimate."""
    from django_taskclaim.ops import figures

    docs = Document.objects.bulk_create([Document(title=f"d{i}") for i in range(30)])
    Document.objects.filter(pk__in=[d.pk for d in docs[:20]]).update(status="done")
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {Document._meta.db_table}")
    # failed since the statistics were taken: their estimate says none
    Document.objects.filter(pk__in=[d.pk for d in docs[20:24]]).update(status="failed")
    index = models.Index(fields=["id"], condition=models.Q(status="failed"), name="doc_failed_t")
    with connection.schema_editor() as editor:
        editor.add_index(Document, index)
    monkeypatch.setattr(Document._meta, "indexes", [*Document._meta.indexes, index])
    monkeypatch.setattr(figures, "EXACT_UP_TO", 10)
    rows = admin_client.get(reverse("admin:taskclaim_dashboard")).context["taskclaim_rows"]
    cells = {c["state"]: c for c in {r["label"]: r for r in rows}["testapp.Document"]["cells"]}
    assert (cells["failed"]["count"], cells["failed"]["estimated"]) == (4, False)
    assert cells["done"]["estimated"]  # no index over the done rows: still estimated
    assert (cells["ready"]["count"], cells["ready"]["estimated"]) == (6, False)
