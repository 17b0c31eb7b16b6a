"""NO EARLY RE-RUN under real faults, with real worker processes and real signals.

A task never starts again while an earlier attempt's lease is valid, unless its holder is
proven dead (its supervisor saw it exit). Registry silence — a paused process, a starved
heartbeat thread, a worker whose heartbeat interval is longer than the silence threshold —
is never taken as death. Each test records every attempt in the ledger (``attempt:`` rows,
stamped by the database clock) and checks the invariant over it.
"""

from __future__ import annotations

import os
import signal
from datetime import timedelta

import pytest
from django.utils import timezone

from django_taskclaim.db import DbNow
from django_taskclaim.models import WorkerProcess
from tests.support.helpers import wait_for
from tests.support.testapp.models import Document, Ledger
from tests.support.worker_handlers import ATTEMPT
from tests.support.worker_procs import WorkerProc, stop_all

pytestmark = pytest.mark.django_db(transaction=True)

HOSTILE = "tests.support.worker_handlers.process_hostile"
FAST = {"TASKCLAIM_REAP_INTERVAL": 0.3, "TASKCLAIM_RETRY_BACKOFF": 0.05}


@pytest.fixture
def procs(transactional_db):
    started: list[WorkerProc] = []
    yield started
    stop_all(started)


def start(procs, *args, **kwargs) -> WorkerProc:
    kwargs.setdefault("claim_meta", {"handler": HOSTILE})
    w = WorkerProc("testapp.Document", *args, **kwargs)
    procs.append(w)
    return w


def attempts(pk) -> list[Ledger]:
    return list(Ledger.objects.filter(task_id=pk, worker__startswith=ATTEMPT).order_by("at"))


def holder_of(pk) -> str:
    return attempts(pk)[0].worker.removeprefix(ATTEMPT)


def recovered_by_a_reap_pass(procs_alive: str) -> Document:
    """A row a ghost held with a lapsed lease: once it is done, a reap pass ran."""
    ghost = Document.objects.create(
        title="ghost's lapsed row",
        status="processing",
        locked_by="ghost",
        attempts=1,
        locked_until=timezone.now() - timedelta(hours=1),  # lapsed on any clock
    )
    wait_for(
        lambda: Document.objects.done().filter(pk=ghost.pk).exists(),
        timeout=30,
        what=f"{procs_alive} to reap and run the ghost's lapsed row",
    )
    return ghost


@pytest.mark.slow
def test_heartbeat_slower_than_the_silence_threshold_never_reruns(procs):
    """Finding 1: a healthy worker whose registry looks silent (heartbeat every 2 s,
    silence shown after 1 s) keeps its task; the sibling never starts it again."""
    task = Document.objects.create(title="long", payload={"sleep": 8})
    settings = {**FAST, "TASKCLAIM_WORKER_SILENT_AFTER": 1}
    first = start(procs, "--lease", "6", settings=settings)
    wait_for(lambda: attempts(task.pk), timeout=30, what="the long task to start")
    second = start(procs, "--lease", "6", settings=settings)
    second.wait_started()
    wait_for(
        lambda: Document.objects.done().filter(pk=task.pk).exists(),
        timeout=60,
        what="the long task to finish, its lease kept alive by heartbeats",
    )
    assert len(attempts(task.pk)) == 1
    assert Document.objects.get(pk=task.pk).attempts == 1
    assert first.alive()
    assert second.alive()


@pytest.mark.slow
def test_a_paused_worker_keeps_its_valid_lease(procs):
    """Finding 2: SIGSTOP (a GC pause, VM steal) silences a worker; its sibling reaps
    meanwhile but never takes the row whose lease is valid. After SIGCONT the first
    holder finishes: one attempt, one completion."""
    task = Document.objects.create(title="paused", payload={"sleep": 2})
    settings = {**FAST, "TASKCLAIM_WORKER_SILENT_AFTER": 1}
    paused = start(procs, "--lease", "60", settings=settings)
    wait_for(lambda: attempts(task.pk), timeout=30, what="the task to start")
    holder = holder_of(task.pk)
    paused.signal(signal.SIGSTOP)
    try:
        sibling = start(procs, "--lease", "60", settings=settings)
        sibling.wait_started()
        wait_for(
            lambda: WorkerProcess.objects.filter(
                worker_id=holder, last_seen__lt=DbNow() - timedelta(seconds=3)
            ).exists(),
            timeout=30,
            what="the paused worker to look silent for 3 s",
        )
        recovered_by_a_reap_pass("the sibling")
        row = Document.objects.get(pk=task.pk)
        assert (row.status, row.locked_by) == ("processing", holder)
        assert len(attempts(task.pk)) == 1
    finally:
        paused.signal(signal.SIGCONT)
    wait_for(
        lambda: Document.objects.done().filter(pk=task.pk).exists(),
        timeout=30,
        what="the resumed holder to finish its task",
    )
    assert len(attempts(task.pk)) == 1
    assert paused.alive()
    assert sibling.alive()


def test_supervisor_releases_a_killed_childs_rows_at_once(procs):
    """Proof of death: the supervisor saw its child exit (SIGKILL), so that child's row
    is taken back at once — long before its 300 s lease — and runs again."""
    task = Document.objects.create(title="orphaned", payload={"sleep": 60})
    sup = start(procs, "--processes", "2", "--lease", "300", "--grace", "1", settings=FAST)
    wait_for(lambda: attempts(task.pk), timeout=30, what="the task to start in a child")
    holder = holder_of(task.pk)
    pid = WorkerProcess.objects.get(worker_id=holder).pid
    os.kill(pid, signal.SIGKILL)
    wait_for(
        lambda: len(attempts(task.pk)) == 2,
        timeout=30,
        what="the killed child's task to start again",
    )
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the first holder is gone: a second start is not an early re-run
    second = attempts(task.pk)[1]
    assert second.worker != ATTEMPT + holder
    row = Document.objects.get(pk=task.pk)
    assert (row.status, row.attempts) == ("processing", 2)
    assert sup.alive()


@pytest.mark.slow
def test_a_poison_task_in_a_batch_fails_alone_and_the_innocents_finish(procs):
    """A task that kills its worker is retried alone: the rows that shared its batch are
    never charged for its deaths, so they finish while it fails after max_attempts."""
    innocents = Document.objects.bulk_create([Document(title=f"i{i}") for i in range(12)])
    poison = Document.objects.create(title="poison", payload={"kill": True})
    innocents += Document.objects.bulk_create([Document(title=f"j{i}") for i in range(12)])
    sup = start(
        procs,
        "--processes",
        "1",  # one supervised process: every death is its own
        "--batch",
        "5",
        "--lease",
        "300",
        settings=FAST,
        claim_meta={"handler": HOSTILE, "max_attempts": 3},
    )
    try:
        wait_for(
            lambda: Document.objects.failed().filter(pk=poison.pk).exists(),
            timeout=90,
            what="the poison task to fail",
        )
    except AssertionError:
        rows = Document.objects.order_by("pk").values_list("pk", "status", "attempts", "locked_by")
        raise AssertionError(f"{list(rows)}\n{sup.stderr()[-4000:]}") from None
    wait_for(
        lambda: Document.objects.done().count() == len(innocents),
        timeout=60,
        what="every innocent task done",
    )
    assert len(attempts(poison.pk)) == 3
    assert Document.objects.get(pk=poison.pk).attempts == 3
    charged = Document.objects.exclude(pk=poison.pk).filter(attempts__gt=2).count()
    assert charged == 0
    # The supervisor settles a dead process's rows before it writes the "died" line.
    assert sup.stderr_count("worker process died", 3) == 3
    assert sup.alive()


@pytest.mark.slow
def test_base_exceptions_from_tasks_never_end_an_executor(procs):
    """SystemExit / KeyboardInterrupt / GeneratorExit raised by a task body are that
    task's failure; the executors live on and every row reaches a final state."""
    kinds = ["SystemExit", "KeyboardInterrupt", "GeneratorExit"]
    bad = Document.objects.bulk_create(
        [Document(title=f"b{i}", payload={"base": kinds[i % 3]}) for i in range(9)]
    )
    good = Document.objects.bulk_create([Document(title=f"g{i}") for i in range(11)])
    sup = start(
        procs,
        "--processes",
        "2",
        "--concurrency",
        "2",
        settings=FAST,
        claim_meta={"handler": HOSTILE, "max_attempts": 2},
    )
    wait_for(
        lambda: Document.objects.filter(status__in=["done", "failed"]).count() == 20,
        timeout=90,
        what="all 20 rows settled",
    )
    assert set(
        Document.objects.filter(pk__in=[d.pk for d in good]).values_list("status", flat=True)
    ) == {"done"}
    for row in Document.objects.filter(pk__in=[d.pk for d in bad]):
        assert row.status == "failed"
        assert row.attempts == 2
        assert f"the task raised {row.payload['base']}" in row.last_error
    assert "worker process died" not in sup.stderr()
    assert sup.alive()
    assert sup.stop() == 0
