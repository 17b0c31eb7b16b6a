"""Recovered rows drain, claimed in batches where they may share, with real worker processes.

After a mass crash (a deploy that SIGKILLs every worker) every row the fleet held comes
back *recovered* (``ready`` with the lost lease's ``locked_until``; see
:func:`django_taskclaim.claim.was_recovered`). One that a further crash would leave on
its last attempt runs alone in its process (the poison rule, guarded by the poison tests
in ``tests/guarantees/test_no_early_rerun.py`` and ``tests/worker/test_worker.py``);
rows with attempts to spare share claims and batches like fresh rows. Every recovered
row drains and is charged exactly one more attempt (given-back rows are uncharged). How
fast, against fresh rows on the same fleet, is ``benchmarks/recovery.py``'s table.
"""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.db.models import Max
from django.utils import timezone

from django_taskclaim.claim.base import RECOVERED_ATTR
from django_taskclaim.db import DbNow
from django_taskclaim.worker.ledger import Ledger
from tests.support.helpers import wait_for
from tests.support.testapp.models import Document
from tests.support.worker_procs import WorkerProc, stop_all

pytestmark = pytest.mark.django_db(transaction=True)

QUIET = {"handler": "tests.support.worker_handlers.process_quietly"}
ROWS = 300


@pytest.fixture
def procs(transactional_db):
    started: list[WorkerProc] = []
    yield started
    stop_all(started)


def db_now():
    """The database clock (the ``finished_at`` stamps are written with it)."""
    return Document.objects.annotate(t=DbNow()).values_list("t", flat=True)[:1].get()


def drain_rate(rows: list[Document], timeout: float) -> tuple[float, int]:
    """Rows/s from now (database clock) until ``rows`` are all done, or until
    ``timeout`` with the rows done by then; and how many were done."""
    began = db_now()
    pks = [r.pk for r in rows]
    done = Document.objects.done().filter(pk__in=pks)
    try:
        wait_for(lambda: done.count() == len(pks), timeout=timeout, what="the rows drained")
        end = done.aggregate(last=Max("finished_at"))["last"]
    except AssertionError:
        end = db_now()
    count = done.count()
    return count / max((end - began).total_seconds(), 1e-3), count


def make_rows(n: int, *, recovered: bool) -> list[Document]:
    """``n`` ready rows; recovered ones as the reaper leaves them after their holder was
    SIGKILLed: one attempt charged, the lost lease's end kept in ``locked_until``."""
    lapsed = timezone.now() - timedelta(seconds=5)
    return Document.objects.bulk_create(
        [
            Document(
                title=f"{'recovered' if recovered else 'fresh'} {i}",
                attempts=1 if recovered else 0,
                version=1 if recovered else 0,
                locked_until=lapsed if recovered else None,
            )
            for i in range(n)
        ]
    )


def drain_recovered_after_fresh(procs, claim_meta: dict) -> tuple[float, float, list]:
    """A 2-process fleet drains ROWS fresh rows, then ROWS recovered ones: both rates,
    and the recovered rows' attempts once done."""
    fleet = WorkerProc(
        "testapp.Document",
        "--processes",
        "2",
        "--concurrency",
        "4",
        "--batch",
        "100",
        "--no-reap",
        claim_meta={**QUIET, **claim_meta},
    )
    procs.append(fleet)
    fleet.wait_started()
    drain_rate(make_rows(40, recovered=False), timeout=60)  # warm-up: every process claimed

    fresh_rate, fresh_done = drain_rate(make_rows(ROWS, recovered=False), timeout=60)
    assert fresh_done == ROWS
    # At a quarter of the fresh rate the drain takes 4x as long: allow twice that.
    budget = max(20.0, 8 * ROWS / fresh_rate)
    recovered = make_rows(ROWS, recovered=True)
    recovered_rate, recovered_done = drain_rate(recovered, timeout=budget)
    if recovered_done == ROWS:
        assert fleet.alive()
        assert fleet.stop() == 0
    attempts = list(
        Document.objects.filter(pk__in=[r.pk for r in recovered]).values_list("attempts", flat=True)
    )
    return fresh_rate, recovered_rate, attempts


@pytest.mark.slow
def test_a_fleet_claims_recovered_rows_in_batches_and_drains_them(procs):
    """After a mass crash (default max_attempts: 5) the recovered rows, one attempt
    charged, may share: they are claimed in batches like fresh rows, every one drains,
    each charged one attempt more.

    Rows one claim statement took share its ``claimed_at`` (the database clock of that
    statement), so fewer distinct stamps than rows is a claim that took several. Their
    drain rate against the fresh rate is a benchmark (``benchmarks/recovery.py``, in
    docs/benchmarks.md): a ratio floor here failed in a CI run whose fresh phase
    (300 rows) lasted 64 ms, a window too short to time on a shared machine."""
    fresh, recovered, attempts = drain_recovered_after_fresh(procs, {})
    assert recovered > 0, f"recovered {recovered:.1f} rows/s, fresh {fresh:.1f}"
    assert len(attempts) == ROWS
    assert set(attempts) == {2}  # each ran once, charged one attempt more
    stamps = Document.objects.filter(title__startswith="recovered ").values_list(
        "claimed_at", flat=True
    )
    assert None not in set(stamps)
    assert len(set(stamps)) < ROWS // 2, "recovered rows that may share were claimed one by one"


@pytest.mark.slow
def test_recovered_rows_that_run_alone_drain_and_are_charged_once(procs):
    """With max_attempts=3 a crash would leave a recovered row one attempt: each runs
    alone in its process, and every one drains, charged one attempt more.

    How fast they drain is a benchmark, not asserted here (``benchmarks/recovery.py``,
    its "alone" column beside the fresh rate, in docs/benchmarks.md): an absolute floor
    failed on a loaded machine (57 rows/s against a floor of 60 in a CI run with nothing
    else running; a 50 ms timer per row holds them under 40)."""
    fresh, recovered, attempts = drain_recovered_after_fresh(procs, {"max_attempts": 3})
    assert recovered > 0, f"recovered {recovered:.1f} rows/s, fresh {fresh:.1f}"
    # Each ran once, charged one attempt more: the rows given back unstarted are uncharged.
    assert len(attempts) == ROWS
    assert set(attempts) == {2}


def test_a_poison_among_recovered_rows_that_share_dead_letters_no_one_else(procs):
    """A task that kills its worker every time, max_attempts=5: its batch-mates, recovered,
    share its batches while a crash leaves them two attempts, then run alone. It ends
    ``failed`` after 5 attempts; every other row finishes, none charged its last attempt."""
    innocents = Document.objects.bulk_create([Document(title=f"i{i}") for i in range(12)])
    poison = Document.objects.create(title="poison", payload={"kill": True})
    innocents += Document.objects.bulk_create([Document(title=f"j{i}") for i in range(12)])
    sup = WorkerProc(
        "testapp.Document",
        "--processes",
        "1",  # one supervised process: every death is its own
        "--batch",
        "5",
        "--lease",
        "300",
        settings={"TASKCLAIM_REAP_INTERVAL": 0.3, "TASKCLAIM_RETRY_BACKOFF": 0.05},
        claim_meta={"handler": "tests.support.worker_handlers.process_hostile", "max_attempts": 5},
    )
    procs.append(sup)
    wait_for(
        lambda: Document.objects.failed().filter(pk=poison.pk).exists(),
        timeout=120,
        what="the poison task to fail",
    )
    wait_for(
        lambda: Document.objects.done().count() == len(innocents),
        timeout=60,
        what="every innocent task done",
    )
    assert Document.objects.get(pk=poison.pk).attempts == 5
    charged = sorted(Document.objects.exclude(pk=poison.pk).values_list("attempts", flat=True))
    assert charged[-1] <= 4, charged  # no crash beside the poison took a last attempt
    # How many crashes a batch-mate shares depends on whether its completion was written
    # before the poison killed the process (a timing of the machine, 2 or 3 under load):
    # that recovered rows share batches at all is asserted over claim stamps by
    # test_a_fleet_claims_recovered_rows_in_batches_and_drains_them.
    assert charged[-1] >= 2, charged  # a batch-mate of the poison was charged its crash
    assert sup.stderr_count("worker process died", 5) == 5
    assert sup.alive()


def row(pk: int, *, recovered: bool = False) -> SimpleNamespace:
    task = SimpleNamespace(pk=pk, version=1)
    setattr(task, RECOVERED_ATTR, recovered)
    return task


def test_a_lone_rows_successor_is_claimed_as_its_outcome_is_written_and_starts_after():
    """Pure ledger logic: while a row that runs alone may still run its body nothing is
    claimed; once its body returned the next row may be claimed (its outcome write and
    that claim overlap) but nothing starts before that outcome is written."""
    ledger = Ledger(capacity=8, claim_size=4)
    alone, after = row(1, recovered=True), row(2, recovered=True)
    ledger.add_claimed([alone], alone=alone)
    assert ledger.room() == 0
    assert ledger.take("a", timeout=0) is alone
    assert ledger.room() == 0  # its body may run: nothing more is claimed
    ledger.finishing("a")
    assert ledger.room() == 4
    assert not ledger.holds_recovered()  # the claimer may keep the next one to run alone
    ledger.add_claimed([after], alone=after)
    assert ledger.take("b", timeout=0.05) is None  # its outcome is not written yet
    ledger.settled("a")
    assert ledger.take("b", timeout=0) is after


def test_recovered_rows_that_may_share_do_not_close_the_claim():
    ledger = Ledger(capacity=8, claim_size=4)
    ledger.add_claimed([row(1, recovered=True), row(2)])  # the claimer let row 1 share
    assert ledger.room() == 4  # capacity 8, two claimed: a full claim fits
    assert not ledger.holds_recovered()
    assert ledger.take("a", timeout=0).pk == 1
    assert ledger.take("b", timeout=0).pk == 2  # started beside it
