"""Claim semantics on every strategy the database supports."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_taskclaim import (
    ClaimInTransactionError,
    ConfigurationError,
    NotClaimableError,
    StrategyNotSupportedError,
)
from django_taskclaim.db import DbNow
from django_taskclaim.model.queryset import ClaimQuerySet
from django_taskclaim.signals import task_claimed
from tests.support.helpers import claim_queries
from tests.support.testapp.models import Document, Job, Ledger

pytestmark = pytest.mark.django_db(transaction=True)

ALL = ["skip_locked", "cas", "advisory", "serializable", "hold"]


def claim(qs, n=1, strategy="auto", **kw):
    if strategy == "hold":
        with transaction.atomic():
            return qs.claim(n, strategy="hold", **kw)
    return qs.claim(n, strategy=strategy, **kw)


def supported(strategy):
    from django_taskclaim.claim import STRATEGIES

    if not STRATEGIES[strategy].supported("default"):
        pytest.skip(f"{strategy} not supported on {connection.vendor}")


def db_now():
    return Document.objects.annotate(now=DbNow()).values_list("now", flat=True)[:1].get()


@pytest.mark.parametrize("strategy", ALL)
def test_fifo_within_priority_and_counts(strategy):
    supported(strategy)
    Document.objects.bulk_create([Document(title=f"d{i}") for i in range(4)])
    urgent = Document.objects.create(title="urgent", priority=5)
    rows = claim(Document.objects, 3, strategy)
    assert [r.title for r in rows] == ["urgent", "d0", "d1"]
    for r in rows:
        assert r.status == "processing"
        assert (r.version, r.attempts) == (1, 1)
        assert r.locked_by
    urgent.refresh_from_db()
    assert urgent.status == "processing"
    assert Document.objects.ready().count() == 2


@pytest.mark.parametrize("strategy", ALL)
def test_composes_with_user_filters_and_respects_run_after(strategy):
    supported(strategy)
    now = timezone.now()
    Document.objects.create(title="later", kind="invoice", run_after=now + timedelta(hours=1))
    Document.objects.create(title="other", kind="report")
    Document.objects.create(title="due", kind="invoice", run_after=now - timedelta(seconds=1))
    rows = claim(Document.objects.filter(kind="invoice"), 10, strategy)
    assert [r.title for r in rows] == ["due"]
    assert claim(Document.objects.filter(kind="invoice"), 10, strategy) == []


@pytest.mark.parametrize("strategy", ALL)
def test_lease_is_on_the_database_clock(strategy):
    supported(strategy)
    Document.objects.create()
    (row,) = claim(Document.objects, 1, strategy, lease=120)
    row.refresh_from_db()
    delta = (row.locked_until - db_now()).total_seconds()
    assert 110 < delta <= 120


@pytest.mark.parametrize("strategy", ALL)
def test_integer_status_mapping(strategy):
    supported(strategy)
    Job.objects.bulk_create([Job(name="a"), Job(name="b")])
    Job.objects.create(name="done", status=Job.SUCCESS)
    rows = claim(Job.objects, 5, strategy)
    assert [r.name for r in rows] == ["a", "b"]
    assert {r.status for r in rows} == {Job.PENDING}
    rows[0].complete(name="a ok")
    rows[1].fail("broken")
    assert dict(Job.objects.values_list("name", "status")) == {
        "a ok": Job.SUCCESS,
        "b": Job.FAILED,
        "done": Job.SUCCESS,
    }
    assert Job.objects.stats() == {
        "ready": 0,
        "processing": 0,
        "done": 2,
        "failed": 1,
        "expired": 0,
    }


def test_claim_next_returns_none_when_empty():
    assert Document.objects.claim_next() is None
    Document.objects.create(title="x")
    assert Document.objects.claim_next().title == "x"
    assert Document.objects.claim_next() is None


def test_claimed_signal_reports_rows():
    seen = []

    def receiver(sender, tasks, worker, using, **kw):
        seen.append((sender, [t.pk for t in tasks], worker))

    task_claimed.connect(receiver)
    try:
        d = Document.objects.create()
        Document.objects.claim(worker="w-1")
    finally:
        task_claimed.disconnect(receiver)
    assert seen == [(Document, [d.pk], "w-1")]


@pytest.mark.parametrize(
    ("n", "says"),
    [
        (0, "> 0"),
        (-1, "> 0"),
        (1.5, "a whole number"),
        ("2", "a whole number"),
        (True, "a whole number"),
        (None, "a whole number"),
        (10**9, "from 1 to 100000"),
    ],
)
def test_bad_batch_size_is_refused(n, says):
    Document.objects.create()
    with pytest.raises(ValueError, match=f"claim\\(n\\) must be {says}"):
        Document.objects.claim(n)
    assert Document.objects.ready().count() == 1


def test_unknown_and_unsupported_strategies():
    Document.objects.create()
    with pytest.raises(StrategyNotSupportedError, match="unknown claim strategy 'fast'"):
        Document.objects.claim(strategy="fast")
    if connection.vendor != "postgresql":
        with pytest.raises(StrategyNotSupportedError, match="not supported on"):
            Document.objects.claim(strategy="advisory")
    assert Document.objects.ready().count() == 1


@pytest.mark.parametrize("lease", [0, -5, "10", timedelta(seconds=-1)])
def test_bad_lease_is_refused(lease):
    Document.objects.create()
    with pytest.raises(ConfigurationError, match="lease"):
        Document.objects.claim(lease=lease)
    assert Document.objects.ready().count() == 1


def test_claim_inside_callers_atomic_is_refused():
    Document.objects.create()
    with transaction.atomic(), pytest.raises(ClaimInTransactionError, match="inside an open"):
        Document.objects.claim()
    assert Document.objects.ready().count() == 1


def test_hold_requires_callers_atomic():
    if connection.vendor != "postgresql":
        pytest.skip("hold is PostgreSQL only")
    Document.objects.create()
    with pytest.raises(ClaimInTransactionError, match=r"inside transaction\.atomic"):
        Document.objects.claim(strategy="hold")


def test_hold_rolls_back_with_the_transaction():
    if connection.vendor != "postgresql":
        pytest.skip("hold is PostgreSQL only")
    Document.objects.create()

    def die_while_holding():
        with transaction.atomic():
            (row,) = Document.objects.claim(strategy="hold")
            assert row.status == "processing"
            raise RuntimeError("worker died")

    with pytest.raises(RuntimeError):
        die_while_holding()
    assert Document.objects.ready().count() == 1


def test_model_without_mixin_is_not_claimable():
    qs = ClaimQuerySet(model=Ledger)
    with pytest.raises(NotClaimableError, match=r"testapp\.Ledger is not claimable"):
        qs.claim()


def test_bad_worker_id_is_refused():
    Document.objects.create()
    with pytest.raises(ConfigurationError, match="worker must be a string"):
        Document.objects.claim(worker="x" * 300)


def test_naive_run_after_is_refused():
    from django.utils.timezone import now

    naive = now().replace(tzinfo=None)
    with pytest.raises(ValueError, match="run_after must be timezone-aware"):
        Document.objects.create(run_after=naive)
    assert Document.objects.count() == 0


def test_async_claim():
    from asgiref.sync import async_to_sync

    async def claim_one():
        return await Document.objects.aclaim_next()

    Document.objects.create(title="a")
    row = async_to_sync(claim_one)()  # the sync part runs on this thread's connection
    assert row.title == "a"


def test_sqlite_claim_is_one_read_and_one_write():
    """The whole batch: one SELECT of candidates, one conditional UPDATE … RETURNING."""
    from django.test.utils import CaptureQueriesContext

    if connection.vendor != "sqlite":
        pytest.skip("SQLite-specific")
    Document.objects.bulk_create([Document() for _ in range(20)])
    with CaptureQueriesContext(connection) as q:
        rows = Document.objects.claim(10)
    assert len(rows) == 10
    verbs = [s["sql"].split()[0] for s in claim_queries(q)]
    assert [v for v in verbs if v in ("SELECT", "UPDATE")] == ["SELECT", "UPDATE"]


@pytest.mark.parametrize("strategy", ALL)
def test_reused_claim_sql_never_leaks_between_filtered_and_plain_claims(strategy):
    """The SQL of unfiltered claims is compiled once and reused; a filtered claim after
    (or before) one never picks it up, and rows come back fully loaded each time."""
    supported(strategy)
    Document.objects.bulk_create(
        [Document(title=f"p{i}", kind="report", payload={"n": i}) for i in range(4)]
    )
    Document.objects.create(title="inv", kind="invoice", payload={"n": 99})
    assert [r.title for r in claim(Document.objects.filter(kind="invoice"), 2, strategy)] == ["inv"]
    first = claim(Document.objects, 2, strategy)
    assert [r.title for r in first] == ["p0", "p1"]
    assert claim(Document.objects.filter(kind="invoice"), 2, strategy) == []
    again = claim(Document.objects.all(), 2, strategy)
    assert [r.title for r in again] == ["p2", "p3"]
    row = again[0]
    assert row.payload == {"n": 2}  # JSON decoded as the ORM would
    assert row.created_at.tzinfo is not None
    assert row._state.adding is False
    assert row._state.db == "default"
    row.complete(result="ok")  # a normal, fenced instance
    assert Document.objects.get(pk=row.pk).result == "ok"


@pytest.mark.parametrize("strategy", ALL)
@pytest.mark.parametrize("shape", ["only", "defer"])
def test_only_and_defer_querysets_claim_fully_loaded_rows(strategy, shape):
    """A claim from ``.only()`` / ``.defer()`` returns rows with every field loaded: no
    lazy read after the claim could see another holder's state."""
    from django.test.utils import CaptureQueriesContext

    supported(strategy)
    Document.objects.bulk_create([Document(title=f"o{i}", payload={"n": i}) for i in range(3)])
    qs = Document.objects.only("title") if shape == "only" else Document.objects.defer("payload")
    rows = claim(qs, 2, strategy)
    assert len(rows) == 2
    with CaptureQueriesContext(connection) as q:
        seen = [(r.status, r.version, r.attempts, r.payload, bool(r.locked_by)) for r in rows]
    assert q.captured_queries == []
    assert seen == [("processing", 1, 1, {"n": 0}, True), ("processing", 1, 1, {"n": 1}, True)]
    rows[0].complete()
    assert Document.objects.get(pk=rows[0].pk).status == "done"


def test_cas_never_returns_a_row_taken_over_between_its_update_and_its_read(monkeypatch):
    """Compare-and-set claims with one UPDATE per row, then re-reads the rows it won. If a
    row was released and re-claimed in between, the re-read (fenced on pk, version and
    status) leaves it out: the claimer never runs a row someone else holds."""
    from django_taskclaim.claim import cas

    if connection.vendor == "sqlite":
        pytest.skip("SQLite's compare-and-set is one read and one write in one transaction")
    docs = Document.objects.bulk_create([Document(title=f"c{i}") for i in range(2)])
    original = cas.read_claimed

    def interfere(base, opts, won):
        victim = docs[0].pk
        assert victim in won
        # Another actor releases it (token bump) and a second worker claims it.
        Document.objects.filter(pk=victim).update(status="ready", version=won[victim] + 1)
        assert [r.pk for r in Document.objects.filter(pk=victim).claim(1, worker="other")] == [
            victim
        ]
        return original(base, opts, won)

    monkeypatch.setattr(cas, "read_claimed", interfere)
    rows = Document.objects.claim(2, strategy="cas", worker="me")
    assert [r.pk for r in rows] == [docs[1].pk]
    assert Document.objects.get(pk=docs[0].pk).locked_by == "other"


def test_the_strategy_names_are_the_registered_strategies():
    from django_taskclaim.claim import STRATEGIES
    from django_taskclaim.config.claim_meta import STRATEGY_NAMES

    assert ("auto", *STRATEGIES) == STRATEGY_NAMES


@pytest.mark.parametrize("strategy", ALL)
def test_a_kept_claim_statement_serves_only_claims_with_its_size_lease_and_holder(strategy):
    """A worker's claim statement is built once and kept (``statements.kept_claim``):
    claims that differ in size, lease or holder each get their own, so every row comes
    back with the lease and holder its own claim asked for."""
    supported(strategy)
    Document.objects.bulk_create([Document(title=f"k{i}") for i in range(8)])
    asks = [(1, 60, "a"), (1, 60, "a"), (1, 300, "a"), (1, 60, "b"), (2, 60, "b"), (1, 60, "a")]
    for n, lease, holder in asks:
        rows = claim(Document.objects.all(), n, strategy, lease=lease, worker=holder)
        assert len(rows) == n
        for row in rows:
            db = Document.objects.annotate(now=DbNow()).get(pk=row.pk)
            assert db.locked_by == row.locked_by == holder
            left = (db.locked_until - db.now).total_seconds()
            assert lease - 30 < left <= lease, (n, lease, holder, left)
    assert Document.objects.claimable().count() == 1
