"""NO ORPHANS: a worker process never outlives its supervisor.

Real ``worker --processes`` subprocesses, real SIGKILLs, the real database: when the
supervisor dies, its children notice at once (``PR_SET_PDEATHSIG`` on Linux, a
parent-pid watch everywhere), give back what they hold on the graceful-stop path (fenced)
and exit, so their rows run again long before their lease ends. A child the supervisor
saw die is marked stopped in the registry, so its replacement registers quietly.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from django_taskclaim.models import WorkerProcess
from tests.support.helpers import wait_for
from tests.support.testapp.models import Document
from tests.support.worker_procs import WorkerProc, stop_all

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def procs(transactional_db):
    started: list[WorkerProc] = []
    yield started
    stop_all(started)


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie nobody reaped yet counts as gone)."""
    stat = Path(f"/proc/{pid}/stat")
    if stat.parent.parent.exists() and Path("/proc/self/stat").exists():
        try:
            state = stat.read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return False
        return state not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def children(prefix: str, n: int) -> dict[str, int]:
    """worker id -> pid of the ``n`` live registered children named ``prefix-i``."""
    rows = WorkerProcess.objects.filter(worker_id__startswith=f"{prefix}-", stopped_at__isnull=True)
    found = dict(rows.values_list("worker_id", "pid"))
    return found if len(found) == n else {}


def test_killing_the_supervisor_ends_its_children_and_frees_their_rows_at_once(procs):
    docs = Document.objects.bulk_create(
        [Document(title=f"long {i}", payload={"sleep": 300}) for i in range(2)]
    )
    sup = WorkerProc(
        "testapp.Document", "--processes", "2", "--lease", "300", "--worker-id", "orphan"
    )
    procs.append(sup)
    pids = wait_for(lambda: children("orphan", 2), timeout=60, what="two registered children")
    held = wait_for(
        lambda: (
            dict(Document.objects.filter(status="processing").values_list("pk", "version"))
            if Document.objects.filter(status="processing").count() == 2
            else None
        ),
        timeout=60,
        what="each child running one long task",
    )
    assert set(Document.objects.values_list("locked_by", flat=True)) == set(pids)

    sup.signal(signal.SIGKILL)
    sup.wait(10)

    wait_for(
        lambda: not any(running(pid) for pid in pids.values()),
        timeout=20,
        interval=0.1,
        what=f"the orphaned children {sorted(pids.values())} to exit",
    )
    # Given back by their holders on the way out (fenced: the token moved on), not by a
    # lease that has 300 s left.
    for doc in Document.objects.filter(pk__in=[d.pk for d in docs]):
        assert doc.status == "ready", (doc.status, sup.stderr()[-3000:])
        assert doc.version > held[doc.pk]
    assert not WorkerProcess.objects.filter(
        worker_id__in=list(pids), stopped_at__isnull=True
    ).exists(), "the children marked themselves stopped"
    assert "supervisor gone" in sup.stderr()
    assert "Traceback" not in sup.stderr()


@pytest.mark.slow
def test_a_child_restarted_after_its_death_registers_without_a_duplicate_id_warning(procs):
    sup = WorkerProc("testapp.Document", "--processes", "1", "--worker-id", "again")
    procs.append(sup)
    first = wait_for(lambda: children("again", 1), timeout=60, what="the child registered")
    old_pid = first["again-0"]
    os.kill(old_pid, signal.SIGKILL)
    wait_for(
        lambda: (children("again", 1).get("again-0") or old_pid) != old_pid,
        timeout=60,
        what="the replacement registered",
    )
    sup.stderr_count("worker process died", 1)
    assert "is registered as alive" not in sup.stderr()
    assert sup.stop() == 0
