"""Worker behaviour with real worker subprocesses, real signals and the real database."""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta

import pytest
from django.conf import settings

from django_taskclaim.db import DbNow
from django_taskclaim.models import WorkerProcess
from django_taskclaim.wakeup.notify import connect_signals, notify
from tests.support.helpers import wait_for
from tests.support.testapp.models import Document, Ledger
from tests.support.worker_handlers import ATTEMPT
from tests.support.worker_procs import ATOMIC, WorkerProc, stop_all

pytestmark = pytest.mark.django_db(transaction=True)

FAST = {"TASKCLAIM_REAP_INTERVAL": 0.3, "TASKCLAIM_RETRY_BACKOFF": 0.05}


@pytest.fixture
def procs(transactional_db):
    started: list[WorkerProc] = []
    yield started
    stop_all(started)


def start(procs, *args, **kwargs) -> WorkerProc:
    w = WorkerProc(*args, **kwargs)
    procs.append(w)
    return w


def attempts_started() -> int:
    return Ledger.objects.filter(worker__startswith=ATTEMPT).count()


def effects(pk: int) -> list[Ledger]:
    return list(Ledger.objects.filter(task_id=pk).exclude(worker__startswith=ATTEMPT))


@pytest.mark.slow
def test_burst_drains_and_exits_zero(procs):
    Document.objects.bulk_create([Document(title=f"b{i}") for i in range(40)])
    w = start(procs, "testapp.Document", "--burst", "--concurrency", "2", "--batch", "5")
    assert w.wait(60) == 0, w.stderr()
    assert Document.objects.done().count() == 40
    assert "models=testapp.Document" in w.stdout()
    assert f"vendor={settings.DB_VENDOR}" in w.stdout()
    assert "PASSWORD" not in w.stdout().upper()
    row = WorkerProcess.objects.get()
    assert row.stopped_at is not None
    assert row.processed == 40
    assert row.in_flight == 0


@pytest.mark.slow
@pytest.mark.skipif(
    settings.DB_VENDOR != "postgresql",
    reason="finished_at is the UPDATE's statement timestamp only on PostgreSQL",
)
@pytest.mark.parametrize(("window", "batched"), [("10", True), ("0", False)])
def test_completions_are_written_together_within_the_ack_window(procs, window, batched):
    """Tasks returning no result fields are acknowledged in one fenced UPDATE per batch:
    every row it completes shares that statement's timestamp. Window 0: one per task."""
    Document.objects.bulk_create([Document(title=f"a{i}") for i in range(20)])
    w = start(
        procs,
        "testapp.Document",
        "--burst",
        "--batch",
        "20",
        "--ack-window",
        window,
        claim_meta={"handler": "tests.support.worker_handlers.process_quietly"},
    )
    assert w.wait(60) == 0, w.stderr()
    assert Document.objects.done().count() == 20
    stamps = set(Document.objects.values_list("finished_at", flat=True))
    assert len(stamps) == (1 if batched else 20)
    assert f"ack-window={window}s" in w.stdout()


def start_quiet_until_started(procs, slow, *args) -> WorkerProc:
    """A worker whose handler logs each attempt and returns no result fields; returns
    once it has started ``slow`` (so every task enqueued before it has run)."""
    w = start(
        procs,
        "testapp.Document",
        "--no-reap",
        *args,
        claim_meta={"handler": "tests.support.worker_handlers.process_logged_quietly"},
    )
    try:
        wait_for(
            lambda: Ledger.objects.filter(task_id=slow.pk).exists(),
            timeout=60,
            what="the slow task to start after the quick ones",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{w.stderr()}") from None
    return w


@pytest.mark.slow
def test_buffered_completions_are_written_before_a_graceful_exit(procs):
    """Completions held in the ack window are flushed when the worker stops on SIGTERM."""
    quick = Document.objects.bulk_create([Document(title=f"q{i}") for i in range(10)])
    slow = Document.objects.create(title="slow", payload={"sleep": 3})
    w = start_quiet_until_started(procs, slow, "--ack-window", "60", "--grace", "60")
    assert attempts_started() == 11
    # the quick ones ran, but their completions wait in the window
    assert Document.objects.processing().filter(pk__in=[d.pk for d in quick]).count() == 10
    w.signal(signal.SIGTERM)
    assert w.wait(60) == 0, w.stderr()
    assert Document.objects.done().count() == 11
    assert set(Document.objects.values_list("attempts", flat=True)) == {1}


def test_ack_window_bounds_the_wait_even_while_a_long_task_runs(procs):
    """A completion buffered before a long task is written when its window ends, not
    after the long task: the heartbeat thread flushes it."""
    quick = Document.objects.create(title="quick")
    slow = Document.objects.create(title="slow", payload={"sleep": 30})
    start_quiet_until_started(procs, slow, "--ack-window", "0.2")
    wait_for(
        lambda: Document.objects.done().filter(pk=quick.pk).exists(),
        timeout=10,
        what="the quick task's completion while the slow one runs",
    )
    assert Document.objects.processing().filter(pk=slow.pk).exists()


@pytest.mark.slow
def test_max_tasks_stops_after_that_many(procs):
    Document.objects.bulk_create([Document(title=f"m{i}") for i in range(12)])
    w = start(procs, "testapp.Document", "--max-tasks", "5", "--batch", "3", "--concurrency", "2")
    assert w.wait(60) == 0, w.stderr()
    assert Document.objects.done().count() == 5
    assert Document.objects.ready().count() == 7


@pytest.mark.slow
def test_sigterm_finishes_running_and_releases_unstarted_at_once(procs):
    Document.objects.bulk_create([Document(title=f"t{i}", payload={"sleep": 4}) for i in range(6)])
    w = start(
        procs,
        "testapp.Document",
        "--concurrency",
        "2",
        "--batch",
        "3",
        "--grace",
        "30",
        "--no-reap",
        claim_meta={"handler": ATOMIC},
    )
    wait_for(lambda: attempts_started() == 2, timeout=30, what="two tasks running")
    assert Document.objects.processing().count() == 6  # 2 running + 4 claimed, unstarted
    w.signal(signal.SIGTERM)
    wait_for(lambda: Document.objects.ready().count() == 4, timeout=3, what="unstarted released")
    # Released while the two running tasks are still running.
    assert Document.objects.processing().count() == 2
    released = Document.objects.ready()
    assert all(d.attempts == 0 and d.locked_until is None for d in released)
    assert w.wait(30) == 0, w.stderr()
    assert Document.objects.done().count() == 2
    assert Document.objects.ready().count() == 4
    assert attempts_started() == 2


def test_grace_period_over_requeues_running_and_exits_3(procs):
    doc = Document.objects.create(title="slow", payload={"sleep": 60})
    w = start(
        procs, "testapp.Document", "--grace", "0.5", "--no-reap", claim_meta={"handler": ATOMIC}
    )
    wait_for(lambda: attempts_started() == 1, timeout=30, what="task running")
    t0 = time.monotonic()
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 3, w.stderr()
    assert time.monotonic() - t0 < 10
    doc.refresh_from_db()
    assert doc.status == "ready"
    assert "grace" in doc.last_error
    assert effects(doc.pk) == []


def test_second_signal_exits_at_once(procs):
    doc = Document.objects.create(title="slow", payload={"sleep": 60})
    w = start(
        procs, "testapp.Document", "--grace", "60", "--no-reap", claim_meta={"handler": ATOMIC}
    )
    wait_for(lambda: attempts_started() == 1, timeout=30, what="task running")
    w.signal(signal.SIGTERM)
    wait_for(lambda: "stopping" in w.stderr(), timeout=10, what="first signal handled")
    w.signal(signal.SIGTERM)
    assert w.wait(10) == 4
    doc.refresh_from_db()
    assert doc.status == "processing"  # left to its lease / the reaper
    assert "Traceback" not in w.stderr()


@pytest.mark.slow
def test_long_tasks_complete_once_thanks_to_heartbeats(procs):
    lease = 1.5
    docs = Document.objects.bulk_create(
        [Document(title=f"long{i}", payload={"sleep": 4 * lease}) for i in range(3)]
    )
    a = start(
        procs,
        "testapp.Document",
        "--concurrency",
        "3",
        "--lease",
        str(lease),
        settings=FAST,
        claim_meta={"handler": ATOMIC},
    )
    wait_for(lambda: attempts_started() == 3, timeout=30, what="three long tasks running")
    # A second worker that reaps every 0.3 s would take any lease that lapsed.
    start(
        procs,
        "testapp.Document",
        "--lease",
        str(lease),
        settings=FAST,
        claim_meta={"handler": ATOMIC},
    )
    wait_for(lambda: Document.objects.done().count() == 3, timeout=60, what="long tasks done")
    for d in docs:
        d.refresh_from_db()
        assert d.attempts == 1
        assert d.locked_by == a.stdout().split("id=")[1].split()[0]
        assert len(effects(d.pk)) == 1
    assert attempts_started() == 3
    assert "claim lost" not in a.stderr()


@pytest.mark.slow
def test_zombie_worker_writes_nothing_after_its_claim_is_taken(procs):
    lease = 1.0
    doc = Document.objects.create(title="z", payload={"sleep": 2, "ledger": True})
    zombie = start(
        procs, "testapp.Document", "--lease", str(lease), "--worker-id", "zombie", "--no-reap"
    )
    wait_for(
        lambda: Document.objects.filter(pk=doc.pk, locked_by="zombie").exists(),
        timeout=30,
        what="zombie holds the task",
    )
    zombie.signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        start(
            procs,
            "testapp.Document",
            "--lease",
            str(lease),
            "--worker-id",
            "rescuer",
            settings=FAST,
        )
        wait_for(
            lambda: Document.objects.done().filter(pk=doc.pk).exists(),
            timeout=60,
            what="rescuer completes the task",
        )
        wait_for(
            lambda: time.monotonic() - stopped_at >= 3 * lease,
            timeout=10,
            what="three leases of SIGSTOP",
        )
    finally:
        zombie.signal(signal.SIGCONT)
    doc.refresh_from_db()
    done_version, done_result = doc.version, doc.result
    assert [e.worker for e in effects(doc.pk)] == ["rescuer"]
    # The zombie wakes up: its heartbeat and its task's writes are fenced.
    wait_for(lambda: "claim lost" in zombie.stderr(), timeout=30, what="zombie notices")
    assert zombie.stop() == 0
    doc.refresh_from_db()
    assert doc.status == "done"
    assert doc.version == done_version
    assert doc.result == done_result
    assert [e.worker for e in effects(doc.pk)] == ["rescuer"]


@pytest.mark.slow
def test_poison_task_fails_after_max_attempts_while_others_flow(procs):
    poison = Document.objects.create(title="poison", payload={"kill": True})
    Document.objects.bulk_create([Document(title=f"ok{i}") for i in range(30)])
    sup = start(
        procs,
        "testapp.Document",
        "--processes",
        "2",
        # The supervisor gives a dead child's rows back itself: no lease needs to lapse.
        # A 1 s lease would let a loaded machine delay a healthy child's renewal past
        # the supervisor's kill time (its lease would lapse: the kill is right) and the
        # stop would then not be clean.
        "--lease",
        "5",
        settings=FAST,
        claim_meta={"max_attempts": 3},
    )
    wait_for(
        lambda: Document.objects.failed().filter(pk=poison.pk).exists(),
        timeout=90,
        what="poison task failed",
    )
    wait_for(lambda: Document.objects.done().count() == 30, timeout=60, what="others done")
    poison.refresh_from_db()
    assert poison.attempts == 3
    # The supervisor settles a dead process's rows before it writes the "died" line.
    assert sup.stderr_count("worker process died", 3) == 3
    assert sup.alive()
    assert sup.stop() == 0


def test_a_silent_holders_valid_lease_is_never_taken_by_a_worker(procs):
    """NO EARLY RE-RUN: registry silence is not proof of death. The worker's reap pass
    recovers the ghost's expired row but leaves the one whose lease is still valid."""
    valid = Document.objects.create(title="valid lease")
    lapsed = Document.objects.create(title="lapsed lease")
    WorkerProcess.objects.create(worker_id="ghost", hostname="gone", pid=1)
    WorkerProcess.objects.filter(worker_id="ghost").update(last_seen=DbNow() - timedelta(hours=1))
    held = Document.objects.claim(1, lease=3600, worker="ghost")[0]
    assert held.pk == valid.pk
    assert Document.objects.claim(1, lease=0.05, worker="ghost")[0].pk == lapsed.pk
    wait_for(lambda: Document.objects.expired().exists(), timeout=10, what="short lease lapses")
    start(
        procs,
        "testapp.Document",
        settings={**FAST, "TASKCLAIM_WORKER_SILENT_AFTER": 1},
        claim_meta={"handler": "tests.support.worker_handlers.process_logged_quietly"},
    )
    wait_for(
        lambda: Document.objects.done().filter(pk=lapsed.pk).exists(),
        timeout=30,
        what="the lapsed row recovered and run (a reap pass happened)",
    )
    row = Document.objects.get(pk=valid.pk)
    assert (row.status, row.locked_by, row.version) == ("processing", "ghost", held.version)
    assert Ledger.objects.filter(task_id=lapsed.pk).exists()  # attempts are logged
    assert not Ledger.objects.filter(task_id=valid.pk).exists()


def test_supervisor_forwards_sigterm(procs):
    sup = start(procs, "testapp.Document", "--processes", "2", "--worker-id", "sup")
    wait_for(
        lambda: WorkerProcess.objects.filter(stopped_at__isnull=True).count() == 2,
        timeout=30,
        what="two registered children",
    )
    assert set(WorkerProcess.objects.values_list("worker_id", flat=True)) == {"sup-0", "sup-1"}
    assert sup.stop() == 0
    assert WorkerProcess.objects.filter(stopped_at__isnull=True).count() == 0


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc for CPU times")
def test_idle_worker_uses_next_to_no_cpu(procs):
    w = start(procs, "testapp.Document", "--concurrency", "4")
    w.wait_started()
    wait_for(lambda: WorkerProcess.objects.exists(), timeout=30, what="registered")

    def cpu() -> float:
        with open(f"/proc/{w.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    before, t0 = cpu(), time.monotonic()
    wait_for(lambda: time.monotonic() - t0 >= 5, timeout=10, what="5 s of idling")
    used = cpu() - before
    assert used / (time.monotonic() - t0) < 0.03, f"idle worker used {used:.2f}s CPU in 5 s"


@pytest.mark.skipif(settings.DB_VENDOR != "postgresql", reason="LISTEN/NOTIFY is PostgreSQL's")
def test_listen_notify_wakes_an_idle_worker_at_once(procs):
    connect_signals()
    w = start(procs, "testapp.Document", "--poll", "60", "-v", "2", claim_meta={"handler": ATOMIC})
    wait_for(lambda: "listening channel=" in w.stderr(), timeout=30, what="listener up")
    WorkerProcess.objects.get()  # registered, idle, next poll in about a minute
    latencies = []
    for i in range(5):
        doc = Document.objects.create(title=f"n{i}")
        wait_for(
            lambda pk=doc.pk: Document.objects.done().filter(pk=pk).exists(),
            timeout=10,
            what="notified task done",
        )
        doc.refresh_from_db()
        start_at = Ledger.objects.get(task_id=doc.pk, worker__startswith=ATTEMPT).at
        latencies.append((start_at - doc.created_at).total_seconds())
    # Bulk inserts send no post_save: notify() is the documented call.
    Document.objects.bulk_create([Document(title=f"bulk{i}") for i in range(3)])
    assert notify(Document) is True
    wait_for(lambda: Document.objects.done().count() == 8, timeout=10, what="bulk rows done")
    latencies.sort()
    print(f"enqueue->start latency with LISTEN/NOTIFY: p50={latencies[2] * 1000:.1f} ms")
    assert latencies[2] < 2.0


@pytest.mark.slow
def test_claimed_but_unstarted_rows_are_heartbeated_too(procs):
    lease = 1.0
    docs = Document.objects.bulk_create(
        [Document(title=f"q{i}", payload={"sleep": 0.8 * lease}) for i in range(4)]
    )
    # One thread claims all four at once: the last one starts ~2.4 leases after its claim.
    start(procs, "testapp.Document", "--batch", "4", "--lease", str(lease), "--no-reap",
          claim_meta={"handler": ATOMIC})  # fmt: skip
    wait_for(lambda: Document.objects.processing().count() == 4, timeout=30, what="batch claim")
    # A second worker reaps every 0.3 s: any lapsed lease would be taken back and re-run.
    start(procs, "testapp.Document", "--lease", str(lease), settings=FAST,
          claim_meta={"handler": ATOMIC})  # fmt: skip
    wait_for(lambda: Document.objects.done().count() == 4, timeout=30, what="batch done")
    for d in docs:
        d.refresh_from_db()
        assert d.attempts == 1
    assert attempts_started() == 4


@pytest.mark.slow
def test_row_taken_back_before_it_started_is_skipped(procs):
    first = Document.objects.create(title="long", payload={"sleep": 3})
    taken = Document.objects.create(title="taken")
    w = start(procs, "testapp.Document", "--batch", "2", "--lease", "1.5", "--no-reap",
              claim_meta={"handler": ATOMIC})  # fmt: skip
    wait_for(lambda: attempts_started() == 1, timeout=30, what="first task running")
    assert Document.objects.processing().count() == 2
    assert Document.objects.filter(pk=taken.pk).release() == 1  # e.g. an admin action
    wait_for(lambda: "claim lost before start" in w.stderr(), timeout=10, what="lost mark")
    assert f"task=testapp.Document:{taken.pk}" in w.stderr()
    wait_for(lambda: Document.objects.done().count() == 2, timeout=30, what="both done")
    # The taken row ran once: after it was claimed again, never under the lost claim.
    runs = Ledger.objects.filter(task_id=taken.pk, worker__startswith=ATTEMPT)
    assert runs.count() == 1
    assert runs.get().token > 1
    assert len(effects(first.pk)) == 1


@pytest.mark.slow
def test_burst_says_what_is_left_and_until_empty_waits_for_scheduled_retries(procs):
    """--burst exits once nothing is claimable *now* and says what is left (a retry
    scheduled ahead); --burst --until-empty also waits for it."""
    doc = Document.objects.create(title="retried", payload={"retry": 4})
    w = start(procs, "testapp.Document", "--burst", claim_meta={"max_attempts": 2})
    assert w.wait(60) == 0, w.stderr()
    assert "burst finished; left: testapp.Document: ready=1 processing=0 failed=0" in w.stdout()
    assert "(next due in" in w.stdout()
    assert Document.objects.get(pk=doc.pk).status == "ready"
    w2 = start(
        procs, "testapp.Document", "--burst", "--until-empty", claim_meta={"max_attempts": 2}
    )
    assert w2.wait(60) == 0, w2.stderr()
    assert Document.objects.get(pk=doc.pk).status == "failed"  # attempt 2 retried: budget spent
    assert "left: testapp.Document: ready=0 processing=0 failed=1" in w2.stdout()
