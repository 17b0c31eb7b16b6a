"""The worker command's default is supervised (``manage.py worker``, no flag): one worker
process under a supervisor that kills it before its leases can lapse when a body stalls
it, so ONE BODY AT A TIME holds; ``--no-supervisor`` gives that up. Real worker processes,
real stalls (a C call holding the GIL, ``SIGSTOP``), real signals.

Every body writes ``Trace`` rows on the database clock (one run per claim token), and a
row's bodies share its lockfile: a body that finds another living body of its row writes
an ``overlap`` trace.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess

import pytest

from django_taskclaim.models import TaskAttempt
from tests.support.deadlineapp.models import TimedTask, Trace
from tests.support.helpers import wait_for
from tests.support.testapp.models import Document
from tests.support.worker_procs import WorkerProc, run_command, stop_all

pytestmark = pytest.mark.django_db(transaction=True)

#: Seconds of lease: the heartbeat renews every third of it (the default), the supervisor
#: kills a silent worker process a quarter of it (1.5 s) before a lease could lapse.
LEASE = 6
#: The rival reaps often, so that a lapsed lease is taken back at once.
SETTINGS = {"TASKCLAIM_REAP_INTERVAL": 0.5}
#: The worker as the README starts it (``supervised``), and with the opt-out.
MODES = [pytest.param(True, id="default"), pytest.param(False, id="no-supervisor")]
KILLED = "past its lease margin: killed"


@pytest.fixture
def procs(transactional_db):
    started: list[WorkerProc] = []
    yield started
    stop_all(started)


def start(procs, *args: str, supervised: bool = True, **kwargs) -> WorkerProc:
    kwargs.setdefault("settings", SETTINGS)
    if not supervised:
        args = (*args, "--no-supervisor")
    w = WorkerProc(*args, supervised=True, **kwargs)  # the flags as given, nothing added
    procs.append(w)
    return w


def runs(task) -> list[list[Trace]]:
    """The runs of ``task``'s body (one per claim token), each its traces in order, the
    runs in the order they started (database clock)."""
    by_token: dict[int, list[Trace]] = {}
    for t in Trace.objects.filter(task=f"TimedTask:{task.pk}").order_by("at", "pk"):
        by_token.setdefault(t.token, []).append(t)
    return sorted(by_token.values(), key=lambda run: run[0].at)


def kinds(task) -> list[str]:
    traces = Trace.objects.filter(task=f"TimedTask:{task.pk}").order_by("at", "pk")
    return list(traces.values_list("kind", flat=True))


def one_body_at_a_time(task) -> bool:
    """The ledger: no body of ``task`` started while another still ran (no ``overlap``,
    and each run's first trace is after the last trace of the run before)."""
    found = runs(task)
    if any(t.kind == "overlap" for run in found for t in run):
        return False
    return all(after[0].at > before[-1].at for before, after in itertools.pairwise(found))


def done(task) -> bool:
    return TimedTask.objects.filter(pk=task.pk, status="done").exists()


def rival(procs, supervised: bool) -> WorkerProc:
    w = start(procs, "deadlineapp.TimedTask", "--lease", str(LEASE), supervised=supervised)
    w.wait_started()
    return w


def assert_killed_and_run_again(task, w: WorkerProc, first_pid: int) -> None:
    """The stalled worker process was killed before its lease lapsed, its attempt ended
    with the reason (the row, its TaskAttempt, the log), and the row ran again after."""
    assert one_body_at_a_time(task), kinds(task)
    task.refresh_from_db()
    assert task.attempts == 2
    assert task.result == f"quick {task.pk}"
    first, second = runs(task)
    assert first[0].pid == first_pid
    assert "end" not in [t.kind for t in first]  # killed while it stalled
    assert [t.kind for t in second] == ["start", "end"]
    assert second[0].pid != first_pid
    assert "the worker stalled for" in task.last_error
    assert KILLED in task.last_error
    attempt = TaskAttempt.objects.get(model="deadlineapp.TimedTask", row=str(task.pk), number=1)
    assert attempt.outcome == "retried"
    assert KILLED in attempt.error
    assert w.stderr_count("the worker stalled for", 1) == 1
    assert "how=signal SIGKILL" in w.stderr()
    assert w.alive()  # the supervisor, with a new worker process


@pytest.mark.slow
@pytest.mark.parametrize("supervised", MODES)
def test_a_body_holding_the_gil_for_twice_the_lease_never_runs_beside_a_second_body(
    procs, tmp_path, supervised
):
    """The body holds the GIL 12 s (twice the lease): its process's heartbeat is silent.
    By default the supervisor kills that process before the lease can lapse and only then
    gives the row back; with ``--no-supervisor`` the lease lapses, the rival reaps the row
    and runs it beside the stalled body (the ``overlap``: the check that the supervisor is
    what keeps the promise)."""
    task = TimedTask.objects.create(
        payload={"modes": ["stall", "quick"], "seconds": 2 * LEASE,
                 "lockfile": str(tmp_path / "row.lock")}
    )  # fmt: skip
    w = start(procs, "deadlineapp.TimedTask", "--lease", str(LEASE), supervised=supervised)
    first_pid = wait_for(lambda: runs(task) and runs(task)[0][0].pid, timeout=60,
                         what="the body to start")  # fmt: skip
    other = rival(procs, supervised)
    try:
        wait_for(lambda: done(task), timeout=90, what="the row to run again")
    except AssertionError:
        raise AssertionError(f"{kinds(task)}\n{w.stderr()[-4000:]}") from None
    if not supervised:
        assert "worker without its supervisor" in w.stderr()
        assert first_pid == w.pid
        assert not one_body_at_a_time(task), kinds(task)  # the promise given up
        return
    assert_killed_and_run_again(task, w, first_pid)
    assert first_pid != w.pid  # the body ran in the supervisor's worker process
    assert w.stop() == 0
    assert other.stop() == 0
    assert "Traceback" not in w.stderr()


@pytest.mark.slow
@pytest.mark.parametrize("supervised", MODES)
def test_a_worker_stopped_for_twice_the_lease_never_runs_beside_a_second_body(
    procs, tmp_path, supervised
):
    """The same with ``SIGSTOP`` of the process running the body (every thread stops),
    kept stopped until the row has run again or twice the lease has passed."""
    task = TimedTask.objects.create(
        payload={"modes": ["slow", "quick"], "seconds": 60,
                 "lockfile": str(tmp_path / "row.lock")}
    )  # fmt: skip
    w = start(procs, "deadlineapp.TimedTask", "--lease", str(LEASE), supervised=supervised)
    first_pid = wait_for(lambda: runs(task) and runs(task)[0][0].pid, timeout=60,
                         what="the body to start")  # fmt: skip
    other = rival(procs, supervised)
    os.kill(first_pid, signal.SIGSTOP)
    try:
        wait_for(lambda: done(task), timeout=90, what="the row to run again")
    except AssertionError:
        raise AssertionError(f"{kinds(task)}\n{w.stderr()[-4000:]}") from None
    finally:
        if not supervised:
            os.kill(first_pid, signal.SIGCONT)
    if not supervised:
        assert not one_body_at_a_time(task), kinds(task)  # the promise given up
        return
    assert_killed_and_run_again(task, w, first_pid)
    assert w.stop() == 0
    assert other.stop() == 0


# -- one stop per Ctrl-C, docker stop, systemd ---------------------------------------------
def slow_row(tmp_path, seconds: float = 3) -> TimedTask:
    return TimedTask.objects.create(
        payload={"modes": ["slow"], "seconds": seconds, "lockfile": str(tmp_path / "row.lock")}
    )


@pytest.mark.parametrize(
    ("how", "sig"),
    [
        pytest.param("group", signal.SIGINT, id="ctrl-c"),  # the terminal's process group
        pytest.param("group", signal.SIGTERM, id="systemd"),  # KillMode=control-group
        pytest.param("parent", signal.SIGTERM, id="docker-stop"),  # PID 1 only
        # the same two deliveries, in a known order (at once, they may merge into one)
        pytest.param("child-then-parent", signal.SIGINT, id="ctrl-c-child-first"),
        pytest.param("parent-then-child", signal.SIGTERM, id="systemd-parent-first"),
    ],
)
def test_one_stop_signal_is_one_graceful_stop_of_the_default_worker(procs, tmp_path, how, sig):
    """A signal that reaches both the supervisor and its worker process (Ctrl-C, systemd)
    is one graceful stop: the running body finishes within ``--grace``, exit 0. (Passed
    on as the same signal, the worker process counted two and exited 4 at once.)"""
    task = slow_row(tmp_path)
    w = start(procs, "deadlineapp.TimedTask", "--grace", "60")
    child = wait_for(lambda: runs(task) and runs(task)[0][0].pid, timeout=60,
                     what="the body to start")  # fmt: skip
    stopping = ": stopping worker="
    if how == "group":
        os.killpg(w.pid, sig)
    elif how == "parent":
        w.signal(sig)
    else:
        first, second = (child, w.pid) if how == "child-then-parent" else (w.pid, child)
        os.kill(first, sig)
        wait_for(lambda: stopping in w.stderr(), timeout=30, what="the worker to stop")
        os.kill(second, sig)
    try:
        code = w.wait(90)
    except subprocess.TimeoutExpired:
        code = None
    assert code == 0, f"{kinds(task)}\n{w.stdout()}\n{w.stderr()[-3000:]}"
    assert [t.kind for t in runs(task)[0]][-1] == "end"  # finished in its grace
    assert done(task)
    assert "second" not in w.stderr()
    assert "Traceback" not in w.stderr()


def test_a_second_ctrl_c_exits_at_once_with_code_4(procs, tmp_path):
    task = slow_row(tmp_path, seconds=60)
    w = start(procs, "deadlineapp.TimedTask", "--grace", "60")
    wait_for(lambda: runs(task), timeout=60, what="the body to start")
    os.killpg(w.pid, signal.SIGINT)
    wait_for(lambda: ": stopping worker=" in w.stderr(), timeout=30, what="the first stop")
    os.killpg(w.pid, signal.SIGINT)
    assert w.wait(60) == 4
    assert "second SIGINT" in w.stderr()


def test_a_grace_that_runs_out_exits_3(procs, tmp_path):
    task = slow_row(tmp_path, seconds=60)
    w = start(procs, "deadlineapp.TimedTask", "--grace", "0.5")
    wait_for(lambda: runs(task), timeout=60, what="the body to start")
    w.signal(signal.SIGTERM)
    assert w.wait(60) == 3
    task.refresh_from_db()
    assert task.status == "ready"


def test_the_default_burst_prints_its_startup_and_leftover_lines():
    """``worker --burst`` as the README runs it: the worker's startup line (with its
    supervisor), the leftover line, exit 0."""
    docs = [Document.objects.create(title=f"d{i}") for i in range(3)]
    proc = run_command("taskclaim_worker", "testapp.Document", "--burst")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("taskclaim worker id=")
    assert " supervisor=" in lines[0]
    assert lines[-1].startswith("burst finished; left: testapp.Document: ready=0")
    assert Document.objects.filter(pk__in=[d.pk for d in docs], status="done").count() == 3
    assert "Traceback" not in proc.stderr
