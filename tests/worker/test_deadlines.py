"""Task deadlines (``ClaimMeta.timeout``, a row's ``task_timeout``) with real worker
processes: the body is told (its cancellation flag, ``CancelledError``), the attempt
fails with ``TimeoutError`` and is retried; a body that ignores the flag gets its
``--processes`` child replaced, or (threads only) is logged at every heartbeat and never
run again while it runs.

Every body writes ``Trace`` rows on the database clock; each run is one claim token.
"""

from __future__ import annotations

import itertools
import os
import signal
from datetime import timedelta

import pytest

from tests.support.deadlineapp.models import AsyncTimedTask, TimedTask, Trace
from tests.support.helpers import wait_for
from tests.support.testapp.models import Document
from tests.support.worker_procs import WorkerProc, stop_all

pytestmark = pytest.mark.django_db(transaction=True)

FAST = {
    "TASKCLAIM_REAP_INTERVAL": 0.5,
    "TASKCLAIM_HEARTBEAT_INTERVAL": 0.5,
    "TASKCLAIM_TIMEOUT_GRACE": 1,
}
TIMEOUT_TEXT = "TimeoutError: ran past its 1s deadline"


@pytest.fixture
def procs(transactional_db):
    started: list[WorkerProc] = []
    yield started
    stop_all(started)


def start(procs, *args, **kwargs) -> WorkerProc:
    kwargs.setdefault("settings", FAST)
    w = WorkerProc(*args, **kwargs)
    procs.append(w)
    return w


def runs(task) -> list[list[Trace]]:
    """The runs of ``task``'s body (one per claim token), each its traces in order, the
    runs in the order they started (database clock)."""
    by_token: dict[int, list[Trace]] = {}
    name = f"{type(task).__name__}:{task.pk}"
    for t in Trace.objects.filter(task=name).order_by("at", "pk"):
        by_token.setdefault(t.token, []).append(t)
    return sorted(by_token.values(), key=lambda run: run[0].at)


def assert_never_two_at_once(task) -> None:
    """NO EARLY RE-RUN: each run of ``task`` starts after the last trace of the one before."""
    found = runs(task)
    for before, after in itertools.pairwise(found):
        assert after[0].at > before[-1].at, (before[-1].at, after[0].at)


def done(model, pks) -> bool:
    return model.objects.filter(pk__in=pks, status="done").count() == len(pks)


@pytest.mark.slow
def test_a_sync_body_that_honours_its_flag_fails_with_timeout_error_and_is_retried(procs):
    task = TimedTask.objects.create(payload={"modes": ["honour", "quick"]}, task_timeout=1)
    w = start(procs, "deadlineapp.TimedTask")
    wait_for(lambda: done(TimedTask, [task.pk]), timeout=60, what="the retry to finish")
    task.refresh_from_db()
    assert task.attempts == 2
    assert TIMEOUT_TEXT in task.last_error
    assert task.result == f"quick {task.pk}"
    first, second = runs(task)
    kinds = [t.kind for t in first]
    assert kinds[0] == "start"
    assert kinds[-2:] == ["flag", "end"]
    assert (first[-1].at - first[0].at).total_seconds() >= 0.9
    assert [t.kind for t in second] == ["start", "end"]
    assert_never_two_at_once(task)
    assert w.stderr_count("task ran past its deadline", 1) == 1
    assert w.stop() == 0
    assert "Traceback" not in w.stderr()


def test_claim_meta_timeout_applies_to_a_model_without_the_field(procs):
    """``ClaimMeta.timeout`` alone; with ``max_attempts = 1`` the row ends failed."""
    doc = Document.objects.create(title="slow")
    w = start(
        procs,
        "testapp.Document",
        claim_meta={
            "timeout": 0.5,
            "max_attempts": 1,
            "handler": "tests.support.deadlineapp.handlers.honour_flag",
        },
    )
    wait_for(lambda: Document.objects.failed().filter(pk=doc.pk).exists(), timeout=60,
             what="the row to fail")  # fmt: skip
    doc.refresh_from_db()
    assert doc.attempts == 1
    assert doc.last_error.startswith("gave up after 1 attempt(s)")
    assert "TimeoutError: ran past its 0.5s deadline" in doc.last_error
    assert w.stop() == 0


@pytest.mark.slow
def test_an_async_body_gets_cancelled_error_and_its_attempt_fails_with_timeout_error(procs):
    task = AsyncTimedTask.objects.create(
        payload={"modes": ["honour", "quick"]}, task_timeout=timedelta(seconds=1)
    )
    w = start(procs, "deadlineapp.AsyncTimedTask")
    wait_for(lambda: done(AsyncTimedTask, [task.pk]), timeout=60, what="the retry to finish")
    task.refresh_from_db()
    assert task.attempts == 2
    assert TIMEOUT_TEXT in task.last_error
    first, second = runs(task)
    assert [t.kind for t in first] == ["start", "cancelled"]
    assert (first[-1].at - first[0].at).total_seconds() >= 0.9
    assert [t.kind for t in second] == ["start", "end"]
    assert w.stderr_count("asked to stop (CancelledError)", 1) == 1
    assert w.stop() == 0


@pytest.mark.slow
def test_a_body_ignoring_its_flag_under_processes_gets_its_child_replaced(procs):
    """The stuck row's attempt fails with TimeoutError; the child's other rows (running
    beside it, or waiting) go back without losing an attempt; nothing is lost and no row
    runs twice at once."""
    stuck = TimedTask.objects.create(
        payload={"modes": ["ignore", "quick"], "seconds": 120}, task_timeout=1
    )
    others = [TimedTask.objects.create(payload={"modes": ["slow"], "seconds": 4}) for _ in range(4)]
    sup = start(
        procs, "deadlineapp.TimedTask", "--processes", "1", "--concurrency", "3", "--batch", "2"
    )
    pks = [stuck.pk, *(o.pk for o in others)]
    try:
        wait_for(lambda: done(TimedTask, pks), timeout=120, what="every row done")
    except AssertionError:
        rows = TimedTask.objects.order_by("pk").values_list("pk", "status", "attempts", "locked_by")
        raise AssertionError(f"{list(rows)}\n{sup.stderr()[-4000:]}") from None
    stuck.refresh_from_db()
    assert stuck.attempts == 2
    assert TIMEOUT_TEXT in stuck.last_error
    first = runs(stuck)[0]
    assert "flag" in [t.kind for t in first]  # told, and it went on
    assert "end" not in [t.kind for t in first]  # its process was killed
    for other in others:
        other.refresh_from_db()
        assert other.attempts == 1, (other.pk, other.attempts, other.last_error)
    for row in [stuck, *others]:
        assert_never_two_at_once(row)
    assert sup.stderr_count("replacing worker process", 1) == 1
    assert "task past its deadline failed" in sup.stderr()
    assert sup.alive()
    assert sup.stop() == 0
    assert "Traceback" not in sup.stderr()


@pytest.mark.slow
def test_a_body_ignoring_its_flag_without_processes_is_logged_and_never_rerun_early(procs):
    """Threads only: the body runs on past its deadline and grace; every heartbeat logs it
    and renews its lease, so a rival worker that reaps never runs it meanwhile. Once it
    returns, its attempt is the TimeoutError failure and the retry runs."""
    task = TimedTask.objects.create(
        payload={"modes": ["ignore", "quick"], "seconds": 6}, task_timeout=1
    )
    settings = {**FAST, "TASKCLAIM_TIMEOUT_GRACE": 0.5}
    w = start(procs, "deadlineapp.TimedTask", "--lease", "4", settings=settings)
    wait_for(lambda: runs(task), timeout=30, what="the body to start")
    rival = start(procs, "deadlineapp.TimedTask", "--lease", "4", settings=settings)
    wait_for(lambda: done(TimedTask, [task.pk]), timeout=90, what="the retry to finish")
    task.refresh_from_db()
    assert task.attempts == 2
    assert TIMEOUT_TEXT in task.last_error
    first, _second = runs(task)
    assert "flag" in [t.kind for t in first]
    assert first[-1].kind == "end"
    assert (first[-1].at - first[0].at).total_seconds() >= 5.5  # ran on, never stopped
    assert_never_two_at_once(task)
    assert w.stderr_count("task still running past its deadline", 3) >= 3
    assert "worker process started" not in w.stderr()  # no supervisor (--no-supervisor)
    assert w.stop() == 0
    assert rival.stop() == 0


# -- a body that stalls its whole process (a C call holding the GIL) ---------------------
STALL_LEASE = "4"  # seconds; the heartbeat every 0.5 s (FAST)


def stalled(tmp_path, seconds: int) -> TimedTask:
    """A row whose first body stalls its process ``seconds`` (GIL held), its retry quick;
    each body takes the row's lockfile (an ``overlap`` trace: two bodies at once)."""
    return TimedTask.objects.create(
        payload={
            "modes": ["stall", "quick"],
            "seconds": seconds,
            "lockfile": str(tmp_path / "row.lock"),
        }
    )


def kinds(task) -> list[str]:
    name = f"{type(task).__name__}:{task.pk}"
    return list(Trace.objects.filter(task=name).order_by("at", "pk").values_list("kind", flat=True))


@pytest.mark.slow
def test_a_body_stalling_its_process_under_processes_is_killed_before_its_lease_lapses(
    procs, tmp_path
):
    """ONE BODY AT A TIME under ``--processes``: the body holds the GIL 12 s, so its
    process's heartbeat is silent and its 4 s lease would lapse; a rival worker reaps
    every 0.5 s. The supervisor kills the child before the lease can lapse and only then
    gives its row back: the retry never finds the first body alive (no ``overlap``), the
    first body never reaches its end, the row is done by its second attempt."""
    task = stalled(tmp_path, 12)
    sup = start(procs, "deadlineapp.TimedTask", "--processes", "1", "--lease", STALL_LEASE)
    wait_for(lambda: runs(task), timeout=60, what="the body to start")
    rival = start(procs, "deadlineapp.TimedTask", "--lease", STALL_LEASE)
    rival.wait_started()
    try:
        wait_for(lambda: done(TimedTask, [task.pk]), timeout=90, what="the retry to finish")
    except AssertionError:
        raise AssertionError(f"{kinds(task)}\n{sup.stderr()[-4000:]}") from None
    task.refresh_from_db()
    assert "overlap" not in kinds(task), kinds(task)
    assert task.result == f"quick {task.pk}"
    assert task.attempts == 2
    first, second = runs(task)
    assert [t.kind for t in first] == ["start"]  # killed while it stalled
    assert [t.kind for t in second] == ["start", "end"]
    assert second[0].pid != first[0].pid
    assert_never_two_at_once(task)
    assert sup.stderr_count("worker process silent", 1) == 1
    assert sup.stderr_count("how=signal SIGKILL", 1) >= 1  # seen dead, then replaced
    assert sup.alive()
    assert sup.stop() == 0
    assert rival.stop() == 0
    assert "Traceback" not in sup.stderr()


@pytest.mark.slow
def test_a_stopped_child_under_processes_is_killed_before_its_lease_lapses(procs, tmp_path):
    """The same with ``SIGSTOP``: the child running a body is stopped (every thread, the
    heartbeat too); the supervisor kills it before its 4 s lease can lapse, and the row
    runs again only once it is dead."""
    task = TimedTask.objects.create(
        payload={"modes": ["slow", "quick"], "seconds": 30, "lockfile": str(tmp_path / "row.lock")}
    )
    sup = start(procs, "deadlineapp.TimedTask", "--processes", "1", "--lease", STALL_LEASE)
    first_pid = wait_for(lambda: runs(task) and runs(task)[0][0].pid, timeout=60,
                         what="the body to start")  # fmt: skip
    rival = start(procs, "deadlineapp.TimedTask", "--lease", STALL_LEASE)
    rival.wait_started()
    os.kill(first_pid, signal.SIGSTOP)
    wait_for(lambda: done(TimedTask, [task.pk]), timeout=90, what="the retry to finish")
    task.refresh_from_db()
    assert "overlap" not in kinds(task), kinds(task)
    assert task.attempts == 2
    first, second = runs(task)
    assert first[0].pid == first_pid
    assert "end" not in [t.kind for t in first]  # killed while stopped
    assert [t.kind for t in second] == ["start", "end"]
    assert_never_two_at_once(task)
    assert sup.stderr_count("worker process silent", 1) == 1
    assert sup.stop() == 0
    assert rival.stop() == 0


@pytest.mark.slow
def test_a_body_stalling_its_process_without_processes_writes_nothing_over_the_new_holder(
    procs, tmp_path
):
    """Threads only, what a worker gives up and what it keeps (docs/deadlines.md): the
    body holds the GIL 12 s, the heartbeat of its process is silent, its 4 s lease lapses
    and a rival worker runs the row beside it (an ``overlap``: said at start-up). The
    first body's completion, once it returns, lands nowhere (fenced): the row stays done
    by the rival's attempt, with the rival's result."""
    task = stalled(tmp_path, 12)
    w = start(procs, "deadlineapp.TimedTask", "--lease", STALL_LEASE)
    wait_for(lambda: runs(task), timeout=60, what="the body to start")
    assert "worker without its supervisor" in w.stderr()
    rival = start(procs, "deadlineapp.TimedTask", "--lease", STALL_LEASE)
    wait_for(lambda: done(TimedTask, [task.pk]), timeout=90, what="the rival's run to finish")
    wait_for(lambda: "end" in [t.kind for t in runs(task)[0]], timeout=60,
             what="the stalled body to return")  # fmt: skip
    wait_for(
        lambda: "its writes did not land" in w.stderr() or "nothing was written" in w.stderr(),
        timeout=30,
        what="the stalled body's completion to be refused",
    )
    task.refresh_from_db()
    assert task.status == "done"
    assert task.result == f"quick {task.pk}"  # not "stall": the late completion was fenced
    assert task.attempts == 2
    first, second = runs(task)
    assert [t.kind for t in first] == ["start", "end"]
    assert [t.kind for t in second] == ["overlap", "start", "end"]  # the promise given up
    assert second[0].at < first[-1].at
    assert w.stop() == 0
    assert rival.stop() == 0
    assert "Traceback" not in w.stderr()
