"""Crash recovery under fire: SIGKILLed workers and killed database connections."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from django.conf import settings
from django.db import connection

from tests.support.helpers import wait_for
from tests.support.testapp.models import Document, Ledger
from tests.support.worker_handlers import ATTEMPT
from tests.support.worker_procs import ATOMIC, WorkerProc, kill_repeatedly, stop_all

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

LEASE = 3.0
SETTINGS = {"TASKCLAIM_REAP_INTERVAL": 0.5, "TASKCLAIM_RETRY_BACKOFF": 0.05}
#: Sized so that each database's run stays well under two minutes on two shared cores.
#: (tasks, seconds each): the chaos lasts 10-24 s whatever the database's speed.
TASKS = {"postgresql": (2000, 0.05), "mysql": (1000, 0.1), "sqlite": (1000, 0.1)}


@pytest.fixture
def procs(transactional_db):
    started: list[WorkerProc] = []
    yield started
    stop_all(started)


def spawn(procs: list[WorkerProc], worker_id: str, *extra: str) -> WorkerProc:
    w = WorkerProc(
        "testapp.Document",
        "--concurrency", "2", "--batch", "5", "--lease", str(LEASE),
        "--worker-id", worker_id, *extra,
        settings=SETTINGS,
        claim_meta={"handler": ATOMIC, "max_attempts": 50},
    )  # fmt: skip
    procs.append(w)
    return w


def assert_exactly_once(n: int) -> None:
    assert Document.objects.exclude(status="done").count() == 0, Document.objects.stats()
    per_task = Counter(
        Ledger.objects.exclude(worker__startswith=ATTEMPT).values_list("task_id", flat=True)
    )
    assert len(per_task) == n
    duplicated = {pk: c for pk, c in per_task.items() if c != 1}
    assert not duplicated, f"side effects applied more than once: {duplicated}"


def test_chaos_sigkill_random_workers(procs):
    n, seconds = TASKS[settings.DB_VENDOR]
    Document.objects.bulk_create(
        [Document(title=f"c{i}", payload={"sleep": seconds}) for i in range(n)], batch_size=500
    )
    alive = [spawn(procs, f"chaos-{i}") for i in range(4)]
    spawned = [4]
    final_leases: list[tuple[int, int, object]] = []  # (pk, token, locked_until) of the dead

    def record_final_leases(victim: WorkerProc) -> None:
        # The dead process can no longer extend its leases: these are their final ends.
        final_leases.extend(
            Document.objects.processing()
            .filter(locked_by=victim.args[victim.args.index("--worker-id") + 1])
            .values_list("pk", "version", "locked_until")
        )

    def respawn() -> WorkerProc:
        spawned[0] += 1
        return spawn(procs, f"chaos-{spawned[0] - 1}")

    kills = kill_repeatedly(
        alive,
        respawn,
        seconds=24,
        done=lambda: Document.objects.done().count() >= n,
        seed=20261122,
        on_kill=record_final_leases,
    )
    wait_for(lambda: Document.objects.done().count() == n, timeout=120, interval=0.25,
             what="drain after the chaos")  # fmt: skip
    assert kills >= 5
    assert final_leases, "no kill hit a worker holding tasks"
    assert_exactly_once(n)
    # No task started again before the lease of its killed holder had ended (DB clock).
    for pk, token, until in final_leases:
        later = Ledger.objects.filter(task_id=pk, token__gt=token, worker__startswith=ATTEMPT)
        for row in later:
            assert row.at >= until, f"task {pk} re-run at {row.at}, lease ran to {until}"
    for w in alive:
        assert w.stop() == 0, w.stderr()[-2000:]


@pytest.mark.skipif(settings.DB_VENDOR != "postgresql", reason="pg_terminate_backend")
def test_connections_killed_every_second(procs):
    n = 400
    Document.objects.bulk_create(
        [Document(title=f"k{i}", payload={"sleep": 0.03}) for i in range(n)]
    )
    w = spawn(procs, "survivor")
    w.wait_started()
    killed = 0
    started = time.monotonic()
    for round_ in range(12):
        wait_for(lambda r=round_: time.monotonic() >= started + r + 1, timeout=5, interval=0.05,
                 what="next connection kill")  # fmt: skip
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND backend_type = 'client backend'"
            )
            killed += cursor.fetchone()[0]
    wait_for(lambda: Document.objects.done().count() == n, timeout=90, interval=0.25,
             what="all tasks done after the connection kills")  # fmt: skip
    assert killed >= 12
    assert w.alive()
    assert_exactly_once(n)
    err = w.stderr()
    assert "Traceback" not in err
    # It did notice (a claim, an outcome write, the heartbeat or the listener saw a killed
    # connection; an idle one is replaced before use without an error), and carried on.
    assert "OperationalError" in err
    assert w.stop() == 0
