"""``manage.py taskclaim_reap`` / ``reaper``: --once, --dry-run, --interval, --release-worker."""

from __future__ import annotations

import io
import signal
from datetime import timedelta

import pytest
from django.core.management import call_command

from django_taskclaim.db import DbNow
from django_taskclaim.models import WorkerProcess
from tests.support.helpers import wait_for
from tests.support.testapp.models import Document
from tests.support.worker_procs import WorkerProc, stop_all

pytestmark = pytest.mark.django_db(transaction=True)


def reap(*args: str) -> str:
    out = io.StringIO()
    call_command("taskclaim_reap", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def stuck():
    """Three rows with lapsed leases (one out of attempts) and two healthy rows."""
    Document.objects.bulk_create([Document(title=f"s{i}") for i in range(5)])
    short = Document.objects.claim(3, lease=0.05, worker="crashed")
    Document.objects.filter(pk=short[0].pk).update(attempts=5)  # max_attempts reached
    Document.objects.claim(1, lease=3600, worker="healthy")
    wait_for(lambda: Document.objects.expired().count() == 3, timeout=10, what="leases lapse")
    return short


def test_dry_run_counts_and_changes_nothing(stuck):
    before = list(Document.objects.order_by("pk").values_list("status", "version"))
    out = reap("--dry-run", "testapp.Document")
    assert "dry run: nothing is changed" in out
    assert "testapp.Document: would requeue=2 would fail=1; 1 held with a valid lease" in out
    assert "total: would requeue=2 would fail=1" in out
    assert list(Document.objects.order_by("pk").values_list("status", "version")) == before


def test_once_requeues_expired_and_fails_exhausted(stuck):
    out = reap("--once")
    assert "testapp.Document: requeued=2 failed=1" in out
    assert "total: requeued=2 failed=1" in out
    stats = Document.objects.stats()
    assert stats["ready"] == 3  # 2 requeued + 1 never claimed
    assert stats["failed"] == 1
    assert stats["processing"] == 1  # the healthy lease is left alone
    assert Document.objects.get(pk=stuck[1].pk).version == stuck[1].version + 1  # fenced
    assert reap("--once").endswith("total: requeued=0 failed=0\n")


def test_silent_workers_keep_their_rows_until_an_operator_releases_them():
    """Registry silence is shown, never acted on: only --release-worker takes a valid lease."""
    Document.objects.bulk_create([Document(title="a"), Document(title="b")])
    WorkerProcess.objects.create(worker_id="ghost", hostname="h", pid=1)
    WorkerProcess.objects.filter(worker_id="ghost").update(last_seen=DbNow() - timedelta(hours=5))
    Document.objects.claim(1, lease=3600, worker="ghost")
    Document.objects.claim(1, lease=3600, worker="alive")
    assert "requeued=0" in reap("--once")
    assert Document.objects.processing().count() == 2
    out = reap("--once", "--release-worker", "ghost", "--dry-run")
    assert "testapp.Document: would requeue=1 would fail=0" in out
    assert Document.objects.processing().count() == 2
    assert "testapp.Document: requeued=1 failed=0" in reap("--once", "--release-worker", "ghost")
    assert Document.objects.processing().get().locked_by == "alive"
    back = Document.objects.ready().get()
    assert back.last_error == "released from worker ghost by an operator (taskclaim_reap)"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--release-worker", " "], "--release-worker needs a worker id"),
        (["--interval", "inf"], "--interval must be"),
        (["--interval", "nan"], "--interval must be"),
        (["--batch", "0"], "--batch must be > 0"),
        (["--batch", "x"], "--batch must be a whole number"),
        (["nope.Model"], "nope.Model"),
    ],
)
def test_bad_options_are_one_clear_line(args, message):
    from django.core.management import CommandError

    with pytest.raises(CommandError, match=message.replace(".", r"\.")):
        reap(*args)


@pytest.mark.slow
def test_interval_loops_until_sigterm(transactional_db):
    Document.objects.bulk_create([Document(title="x")])
    Document.objects.claim(1, lease=0.05, worker="crashed")
    procs = [WorkerProc("--interval", "0.2", command="reaper")]
    try:
        p = procs[0]
        wait_for(lambda: p.stdout().count("total:") >= 3, timeout=30, what="three passes")
        assert "requeued=1" in p.stdout()
        assert Document.objects.ready().count() == 1
        p.signal(signal.SIGTERM)
        assert p.wait(30) == 0
    finally:
        stop_all(procs)
