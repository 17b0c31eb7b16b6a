"""Pause / resume: the API's semantics, and its enforcement in every claim path (every
strategy, ``claim(n)``, ``claim_next()``, keyed claims) on the database under test."""

from __future__ import annotations

import logging

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from django_taskclaim import (
    ConfigurationError,
    NotClaimableError,
    is_paused,
    pause,
    paused,
    resume,
)
from django_taskclaim.claim import STRATEGIES
from django_taskclaim.claim.scope import pauses_read_in_claim
from django_taskclaim.exceptions import StrategyNotSupportedError
from django_taskclaim.flow.pause import backlog
from django_taskclaim.models import QueuePause
from tests.support.flowapp.models import Errand, ErrandRun, KeyedErrand
from tests.support.helpers import claim_queries, wait_for
from tests.support.testapp.models import Document

pytestmark = pytest.mark.django_db(transaction=True)

ALL = ["skip_locked", "cas", "advisory", "serializable", "hold"]


def claim(qs, n=10, strategy="auto"):
    if strategy == "hold":
        with transaction.atomic():
            return qs.claim(n, strategy="hold")
    return qs.claim(n, strategy=strategy)


def supported(strategy, model=Errand):
    if not STRATEGIES[strategy].supported("default"):
        pytest.skip(f"{strategy} not supported on {connection.vendor}")
    if strategy == "hold" and model is KeyedErrand:
        pytest.skip("hold is refused for a model with a concurrency key")


def make(model, **per_queue):
    """Rows in each queue (keyed: each its own customer, so no key holds another back)."""
    customer = 0
    for queue, n in per_queue.items():
        for _ in range(n):
            customer += 1
            kwargs = {"customer_id": customer} if model is KeyedErrand else {}
            model.objects.create(queue_name=queue, **kwargs)


# -- the API ------------------------------------------------------------------------------


def test_pause_is_idempotent_and_resume_says_whether_it_was_paused():
    first = pause(Errand, "a", by="ops", reason="deploy")
    again = pause("flowapp.Errand", "a", by="someone else", reason="other")
    assert (again.pk, again.paused_at, again.paused_by, again.reason) == (
        first.pk,
        first.paused_at,
        "ops",
        "deploy",
    )
    assert first.paused_at is not None
    assert first.paused_at.tzinfo is not None
    assert QueuePause.objects.count() == 1
    assert resume(Errand, "a", by="ops") is True
    assert resume(Errand, "a", by="ops") is False
    assert paused() == []


def test_whole_model_and_one_queue_are_separate_pauses():
    pause(Errand, "a")
    assert is_paused(Errand, "a")
    assert not is_paused(Errand, "b")
    assert not is_paused(Errand)
    pause(Errand)
    assert is_paused(Errand)
    assert is_paused(Errand, "b")
    assert is_paused("flowapp.Errand", "a")
    assert [(p.model, p.queue) for p in paused(Errand)] == [
        ("flowapp.Errand", ""),
        ("flowapp.Errand", "a"),
    ]
    pause(Document)
    assert [p.model for p in paused()] == ["flowapp.Errand", "flowapp.Errand", "testapp.Document"]
    assert resume(Errand) is True  # the whole-model pause only: queue "a" stays paused
    assert not is_paused(Errand, "b")
    assert is_paused(Errand, "a")
    assert [str(p) for p in paused(Errand)] == ["flowapp.Errand queue=a"]


def test_backlog_counts_the_ready_rows_a_pause_keeps_waiting():
    make(Errand, a=3, b=2)
    Errand.objects.filter(queue_name="b").update(status="done")
    assert backlog(pause(Errand, "a")) == 3
    assert backlog(pause(Errand, "b")) == 0
    assert backlog(pause(Errand)) == 3
    stale = QueuePause.objects.create(model="gone.Model")
    assert backlog(stale) is None


@pytest.mark.parametrize(
    ("call", "error", "says"),
    [
        (lambda: pause(ErrandRun), NotClaimableError, "flowapp.ErrandRun is not claimable"),
        (lambda: pause("flowapp.ErrandRun"), NotClaimableError, "is not claimable"),
        (lambda: pause("nope.Nope"), ConfigurationError, "no model 'nope.Nope' is installed"),
        (lambda: pause("Errand"), ConfigurationError, "is not a model label"),
        (lambda: pause(42), ConfigurationError, "must be a model class or"),
        (lambda: pause(Document, "a"), ConfigurationError, "has no queue_name field"),
        (lambda: resume(Document, "a"), ConfigurationError, "has no queue_name field"),
        (lambda: is_paused(Document, "a"), ConfigurationError, "has no queue_name field"),
        (lambda: pause(Errand, ""), ConfigurationError, "queue must be a non-empty string"),
        (lambda: pause(Errand, 3), ConfigurationError, "queue must be a non-empty string"),
        (lambda: pause(Errand, by="x" * 256), ConfigurationError, "by must be a string"),
        (lambda: pause(Errand, reason=None), ConfigurationError, "reason must be a string"),
    ],
)
def test_bad_input_is_one_clear_error(call, error, says):
    with pytest.raises(error, match=says):
        call()
    assert QueuePause.objects.count() == 0


def test_pause_and_resume_log_who_and_when(caplog):
    caplog.set_level(logging.INFO, logger="django_taskclaim.flow.pause")
    row = pause(Errand, "a", by="alice", reason="slow API")
    pause(Errand, "a", by="alice")  # nothing changed: nothing logged
    resume(Errand, "a", by="bob")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("queue paused model=flowapp.Errand queue='a' by='alice' at=")
    assert row.paused_at.isoformat() in lines[0]
    assert "reason='slow API'" in lines[0]
    assert lines[1].startswith("queue resumed model=flowapp.Errand queue='a' by='bob' at=")


def test_a_queue_name_reason_or_name_with_a_newline_is_logged_on_one_line(caplog):
    caplog.set_level(logging.DEBUG, logger="django_taskclaim")
    forged = "a\nINFO django_taskclaim queue resumed model=flowapp.Errand queue=*"
    pause(Errand, forged, by="mallory\r\nroot", reason="slow\nAPI\x1b[2J")
    resume(Errand, forged, by="mallory\nroot")
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("django_taskclaim")]
    assert len(lines) == 2, lines
    for line in lines:
        assert line.isprintable(), line  # no newline, carriage return or escape
    assert "queue='a\\nINFO django_taskclaim" in lines[0]
    assert "by='mallory\\r\\nroot'" in lines[0]


def test_a_pause_inside_a_rolled_back_transaction_pauses_nothing():
    make(Errand, a=1)

    def pause_then_fail():
        with transaction.atomic():
            pause(Errand, "a")
            raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError):
        pause_then_fail()
    assert not is_paused(Errand, "a")
    assert len(Errand.objects.claim(5)) == 1


# -- enforcement --------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ALL)
@pytest.mark.parametrize("model", [Errand, KeyedErrand], ids=["plain", "keyed"])
def test_a_paused_queue_is_not_claimed_by_any_strategy(model, strategy):
    supported(strategy, model)
    make(model, a=3, b=2)
    pause(model, "a")
    first = claim(model.objects, 10, strategy)
    assert sorted(r.queue_name for r in first) == ["b", "b"]
    assert claim(model.objects, 10, strategy) == []  # the rest is paused: nothing, no error
    assert claim(model.objects.filter(queue_name="a"), 10, strategy) == []
    resume(model, "a")
    again = claim(model.objects, 10, strategy)
    assert sorted(r.queue_name for r in again) == ["a", "a", "a"]


@pytest.mark.parametrize("strategy", ALL)
def test_a_paused_model_is_not_claimed_and_costs_no_query(strategy):
    supported(strategy)
    make(Errand, a=2, b=2)
    pause(Errand)
    assert claim(Errand.objects, 1, strategy) == []  # reads the pauses once
    with CaptureQueriesContext(connection) as queries:
        assert claim(Errand.objects, 10, strategy) == []
        assert Errand.objects.claim_next() is None
    # (hold's BEGIN / COMMIT are the caller's transaction.atomic(), not the claim's)
    ends = ("BEGIN", "BEGIN IMMEDIATE", "COMMIT")
    sent = [q["sql"] for q in queries.captured_queries if q["sql"] not in ends]
    if pauses_read_in_claim("default"):  # SQLite: the pauses, read in each claim's transaction
        assert len(sent) == 2, sent
        assert all("taskclaim_queuepause" in q for q in sent), sent
    else:
        assert sent == []
    resume(Errand)
    assert len(claim(Errand.objects, 10, strategy)) == 4


def test_claim_next_and_claim_n_skip_paused_rows_of_a_model_without_queues():
    Document.objects.create(title="x")
    pause(Document)
    assert Document.objects.claim_next() is None
    assert Document.objects.claim(5) == []
    resume(Document)
    assert Document.objects.claim_next() is not None


def test_a_pause_made_elsewhere_is_seen_once_the_snapshot_expires(settings):
    """Another process's pause (written here without telling this process) is seen by
    the claims within TASKCLAIM_POLL_INTERVAL: the snapshot is read again at that age."""
    settings.TASKCLAIM_POLL_INTERVAL = 0.2
    Errand.objects.bulk_create([Errand(queue_name="a") for _ in range(200)])
    assert len(Errand.objects.claim(1)) == 1  # snapshot read: nothing paused
    QueuePause.objects.create(model="flowapp.Errand", queue="a")  # as another process would
    wait_for(lambda: Errand.objects.claim(1) == [], timeout=30, what="the pause seen")
    assert Errand.objects.filter(status="ready").exists()
    QueuePause.objects.all().delete()
    wait_for(lambda: Errand.objects.claim(1), timeout=30, what="the resume seen")


def test_without_pauses_the_claim_sql_is_unchanged():
    make(Errand, a=4)
    Errand.objects.claim(1)  # compiled, and the pauses read
    with CaptureQueriesContext(connection) as plain:
        assert len(Errand.objects.claim(1)) == 1
    pause(Document)  # another model's pause does not change this model's claim
    Errand.objects.claim(1)  # the pauses read again (this process paused: snapshot dropped)
    with CaptureQueriesContext(connection) as again:
        assert len(Errand.objects.claim(1)) == 1
    sql = [q["sql"] for q in claim_queries(plain)]
    assert len(claim_queries(again)) == len(sql)
    assert "queuepause" not in " ".join(sql).lower()
    # SQLite reads the pauses in each claim's transaction, elsewhere from the snapshot.
    reads = len(plain.captured_queries) - len(sql), len(again.captured_queries) - len(sql)
    assert reads == ((1, 1) if pauses_read_in_claim("default") else (0, 0))


def test_hold_refusal_for_keyed_models_is_unchanged_by_pauses():
    pause(KeyedErrand, "a")
    if not STRATEGIES["hold"].supported("default"):
        pytest.skip(f"hold not supported on {connection.vendor}")
    with pytest.raises(StrategyNotSupportedError), transaction.atomic():
        KeyedErrand.objects.claim(1, strategy="hold")


def test_the_pauses_are_read_once_per_poll_interval_not_per_claim(settings):
    """The whole cost of pauses on a claim path where nothing is paused: one read of the
    pause table per TASKCLAIM_POLL_INTERVAL per process, beside unchanged claims; on
    SQLite one read inside each claim's transaction instead (the database is in the
    process: no round trip), which makes the pause exact there."""
    settings.TASKCLAIM_POLL_INTERVAL = 3600
    Errand.objects.bulk_create([Errand(queue_name="a") for _ in range(120)])
    captured = []
    for _ in range(2):
        with CaptureQueriesContext(connection) as queries:
            for _ in range(50):
                assert Errand.objects.claim_next() is not None
        captured.append(queries.captured_queries)
    reads = [[q for q in c if "taskclaim_queuepause" in q["sql"]] for c in captured]
    if pauses_read_in_claim("default"):
        assert [len(r) for r in reads] == [50, 50]
        assert len(captured[0]) == len(captured[1])
    else:
        assert [len(r) for r in reads] == [1, 0]
        assert len(captured[0]) == len(captured[1]) + 1
    assert len(claim_queries(captured[0])) == len(claim_queries(captured[1]))


@pytest.mark.parametrize("strategy", ALL)
@pytest.mark.parametrize("model", [Errand, KeyedErrand], ids=["plain", "keyed"])
def test_a_queue_scope_compiles_once_and_never_lends_its_sql_to_another_queue(model, strategy):
    """The worker's ``--queue`` scope (:func:`~django_taskclaim.claim.scope.on_queue`)
    keeps its claim SQL per queue: claims of queue ``a`` and ``b`` in turn each take only
    their own rows, a queryset derived from a scoped one (another filter) compiles its
    own, and a pause of the queue still empties the scope."""
    from django_taskclaim.claim.scope import on_queue, plain_key

    supported(strategy, model)
    make(model, a=3, b=3)
    scoped_a = on_queue(model.objects.all(), "a")
    assert plain_key(scoped_a, strategy) is not None
    assert plain_key(on_queue(model.objects.filter(pk__gt=0), "a"), strategy) is None
    narrower = scoped_a.filter(pk__in=[r.pk for r in model.objects.filter(queue_name="b")])
    assert plain_key(narrower, strategy) is None  # a clone carries no key of its own
    taken = []
    for queue in ["a", "b", "a", "b"]:
        rows = claim(on_queue(model.objects.all(), queue), 1, strategy)
        assert [r.queue_name for r in rows] == [queue]
        taken += rows
    assert claim(narrower, 10, strategy) == []  # b's rows filtered by a's scope: none
    pause(model, "a")
    assert claim(on_queue(model.objects.all(), "a"), 10, strategy) == []
    assert [r.queue_name for r in claim(on_queue(model.objects.all(), "b"), 10, strategy)] == ["b"]
    resume(model, "a")
    assert [r.queue_name for r in claim(on_queue(model.objects.all(), "a"), 10, strategy)] == ["a"]
    assert len({r.pk for r in taken}) == 4
