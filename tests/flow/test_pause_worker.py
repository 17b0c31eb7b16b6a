"""A worker's reaction to pauses: it idles (no busy loop) while everything it serves is
paused, and on PostgreSQL the pause and the resume reach it at once through
``LISTEN/NOTIFY``, long before its next poll."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
from django.conf import settings

from django_taskclaim import pause, resume
from django_taskclaim.db import db_now
from tests.support.flowapp.models import Errand
from tests.support.helpers import wait_for
from tests.support.worker_procs import WorkerProc, stop_all

pytestmark = pytest.mark.django_db(transaction=True)

TICKS = os.sysconf("SC_CLK_TCK")


@pytest.fixture
def procs(transactional_db):
    started: list[WorkerProc] = []
    yield started
    stop_all(started)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def wait_db_seconds(seconds: float) -> None:
    """Until the database clock has moved ``seconds`` on (a span to observe, not a
    synchronisation)."""
    start = db_now()
    wait_for(
        lambda: db_now() >= start + timedelta(seconds=seconds),
        timeout=60,
        what=f"{seconds}s on the database clock",
    )


def done() -> bool:
    return not Errand.objects.exclude(status="done").exists()


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc")
def test_a_worker_whose_models_are_all_paused_idles_then_drains_on_resume(procs):
    Errand.objects.bulk_create([Errand(queue_name=q) for q in ("a", "b") for _ in range(5)])
    pause(Errand, by="test")
    w = WorkerProc("flowapp.Errand", "--poll", "0.1")
    procs.append(w)
    w.wait_started(timeout=60)
    before = cpu_seconds(w.pid)
    wait_db_seconds(3.0)
    used = cpu_seconds(w.pid) - before
    assert Errand.objects.filter(status="ready").count() == 10
    assert used < 0.3, f"a worker with everything paused used {used:.2f}s CPU in 3s"
    resume(Errand, by="test")
    wait_for(done, timeout=60, what="the backlog drained after the resume")
    assert w.stop() == 0


@pytest.mark.slow
@pytest.mark.skipif(settings.DB_VENDOR != "postgresql", reason="LISTEN/NOTIFY is PostgreSQL's")
def test_on_postgresql_pause_and_resume_reach_a_listening_worker_before_its_next_poll(procs):
    """Poll interval 60 s: only the notifications can make the worker see the changes
    within the test's deadlines."""
    slow = {"TASKCLAIM_POLL_INTERVAL": 60.0}
    Errand.objects.bulk_create([Errand(queue_name="a") for _ in range(3)])
    pause(Errand, "a")
    w = WorkerProc("flowapp.Errand", "--poll", "60", settings=slow)
    procs.append(w)
    w.wait_started(timeout=60)
    wait_for(lambda: "wakeup=listen" in w.stdout(), timeout=10, what="a listening worker")
    resume(Errand, "a")
    wait_for(done, timeout=20, what="the resume notification waking the worker")

    pause(Errand, "a")
    Errand.objects.create(queue_name="b")  # notified: the worker claims again at once
    wait_for(done, timeout=20, what="queue b's row claimed at once")
    Errand.objects.create(queue_name="a")  # notified too, but its queue is paused
    wait_db_seconds(2.0)
    assert Errand.objects.filter(queue_name="a", status="ready").count() == 1
    assert w.stop() == 0


@pytest.mark.slow
def test_forked_worker_processes_honour_a_pause_and_its_resume(procs):
    """``--processes 2``: each forked child keeps its own snapshot of the pauses."""
    Errand.objects.bulk_create([Errand(queue_name=q) for q in ("a", "b") for _ in range(6)])
    pause(Errand, "a", by="test")
    w = WorkerProc("flowapp.Errand", "--processes", "2", "--poll", "0.2")
    procs.append(w)
    w.wait_started(timeout=60)
    wait_for(
        lambda: not Errand.objects.filter(queue_name="b").exclude(status="done").exists(),
        timeout=60,
        what="queue b drained",
    )
    wait_db_seconds(1.5)
    assert Errand.objects.filter(queue_name="a", status="ready").count() == 6
    resume(Errand, "a", by="test")
    wait_for(done, timeout=60, what="queue a drained after the resume")
    assert w.stop() == 0
