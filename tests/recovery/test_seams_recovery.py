"""Recovery seams: a crash-looping fleet still reaps; a frozen claimer never holds the
claim gate for everyone.

A worker's first in-worker reap comes a few seconds after it starts, not a whole
``TASKCLAIM_REAP_INTERVAL`` later, so workers that keep dying young (SIGKILL every few
seconds) still take back the rows whose lease expired. A large claim sent as two
statements (Django's server-side binding cursors) bounds how long its transaction may sit
idle between the gate and the claim: a claimer frozen there by SIGSTOP loses its session
and the other claimers pass the gate.

Run as a script (``python -m tests.recovery.test_seams_recovery freeze-at-gate MARKER``), this
module is the claimer that freezes itself between the gate and its claim.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, connections
from django.db.models.functions import Now
from django.test.utils import override_settings
from django.utils import timezone

from tests.support.helpers import child_env, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

# Imported lazily in the script mode (before django.setup()).
if __name__ != "__main__":
    from tests.support.testapp.models import Document
    from tests.support.worker_procs import WorkerProc, stop_all


# -- 1. a crash-looping fleet reaps -------------------------------------------------------

LIFE = 4.0  # seconds each worker of the restart loop lives after its startup line


def expired_rows(n: int) -> list[int]:
    """``n`` rows held by a worker that is gone, their lease over on the database clock."""
    Document.objects.bulk_create([Document(title=f"orphan {i}") for i in range(n)])
    held = Document.objects.claim(n, worker="gone-for-good")
    assert len(held) == n
    Document.objects.filter(pk__in=[d.pk for d in held]).update(
        locked_until=Now() - timedelta(seconds=5)
    )
    return [d.pk for d in held]


def still_expired(pks: list[int]) -> int:
    """Rows of ``pks`` still held by the dead claim (``version`` 1: never reaped)."""
    return Document.objects.filter(pk__in=pks, status="processing", version=1).count()


def test_a_worker_restart_loop_reaps_expired_leases():
    """Workers SIGKILLed about 4 s after they start (the default 30 s reap interval, far
    longer than a life): within three lives the rows whose lease ended are taken back
    (token bumped: ready again, or claimed and run by a later worker)."""
    pks = expired_rows(40)
    procs: list[WorkerProc] = []
    lives = 0
    last_words = ""
    try:
        for _ in range(3):
            w = WorkerProc(
                "testapp.Document",
                "--poll",
                "0.2",
                settings={"TASKCLAIM_REAP_INTERVAL": 30.0},
            )
            procs.append(w)
            w.wait_started(timeout=60)
            born = time.monotonic()
            lives += 1
            # A short life is what is simulated: live until reaped or LIFE seconds.
            wait_for(
                lambda b=born: still_expired(pks) == 0 or time.monotonic() - b >= LIFE,
                timeout=LIFE + 30,
                interval=0.1,
                what="a reap or the end of a short life",
            )
            w.kill()
            last_words = w.stderr()[-2000:]
            if still_expired(pks) == 0:
                break
    finally:
        stop_all(procs)
    assert still_expired(pks) == 0, (
        f"{still_expired(pks)} of {len(pks)} expired rows still held after {lives} worker "
        f"lives of {LIFE} s:\n{last_words}"
    )
    rows = Document.objects.filter(pk__in=pks)
    assert all(d.version >= 2 for d in rows)
    assert not rows.filter(status="processing", locked_by="gone-for-good").exists()


def test_the_first_reap_comes_soon_after_a_worker_starts():
    from django_taskclaim.worker.maintenance.reaping import FIRST_REAP, first_wait

    low, high = FIRST_REAP
    assert all(low <= first_wait(30.0) <= high for _ in range(200))
    assert all(first_wait(0.3) <= 0.36 for _ in range(200))  # never later than the interval


INTERVAL = 3.0  # TASKCLAIM_REAP_INTERVAL of the crash-looping fleet below
SLACK = 1.0  # seconds allowed beyond one interval: jitter, the reap's statements, a loaded machine
FLEET = 3  # workers alive at a time (one of them at least started)
SHORT_LIFE = 1.5  # seconds each lives after its startup line before its SIGKILL


def expiring_rows(n: int, *, start: float, step: float) -> list[int]:
    """``n`` rows held by a worker that is gone, their leases ending one by one on the
    database clock: the first ``start`` seconds from now, then one every ``step``."""
    # Made held, never ready: a running fleet could otherwise claim one in between.
    far = timezone.now() + timedelta(days=1)
    held = Document.objects.bulk_create(
        [
            Document(
                title=f"orphan {i}",
                status="processing",
                locked_by="gone-for-good",
                locked_until=far,
                attempts=1,
                version=1,
            )
            for i in range(n)
        ]
    )
    assert len(held) == n
    for i, doc in enumerate(held):
        Document.objects.filter(pk=doc.pk).update(
            locked_until=Now() + timedelta(seconds=start + i * step)
        )
    return [d.pk for d in held]


@pytest.mark.slow
def test_a_crash_looping_fleet_reaps_every_expired_lease_within_one_interval():
    """Workers SIGKILLed SHORT_LIFE s after their startup line, one after another, each
    replaced at once, so that one has always started: every lease that ends meanwhile
    is reaped within one reap interval of its end (database clock), however short the
    lives of the workers and whoever held the reap lock when it was killed.

    What the bound allows beyond the interval is measured, not guessed: a reap is dated
    by the poll before the one that saw it (the latest time it is known not to have
    happened), and each worker killed mid-reap (holding the reap lock for its short
    :data:`REAP_HOLD`, not yet extended to the interval) delays the next reap by that
    hold, as documented; such kills are read from the lock's row at each kill. Without
    the first reap soon after a start no row is ever reaped (every life is shorter than
    the interval); with a waiter sleeping a whole interval instead of the lock's
    remaining lease, rows wait up to two intervals."""
    from django_taskclaim.db import default_worker_id
    from django_taskclaim.models import Lease
    from django_taskclaim.worker.maintenance.reaping import REAP_HOLD, REAP_LOCK_KEY

    procs: list[WorkerProc] = []
    born: dict[int, float] = {}
    polls: list[Any] = []  # database time of each poll of the rows
    mid_reap_kills: list[Any] = []  # database times of kills of a worker mid-reap

    def spawn() -> WorkerProc:
        w = WorkerProc("testapp.Document", "--poll", "0.2",
                       settings={"TASKCLAIM_REAP_INTERVAL": INTERVAL})  # fmt: skip
        procs.append(w)
        return w

    def kill(victim: WorkerProc) -> None:
        lock = (
            Lease.objects.filter(key=REAP_LOCK_KEY, owner=default_worker_id(victim.pid))
            .annotate(now=Now())
            .values_list("locked_until", "acquired_at", "now")
            .first()
        )
        victim.kill()
        if lock is not None:
            until, acquired, now = lock
            if until > now and (until - acquired).total_seconds() <= REAP_HOLD + 0.05:
                mid_reap_kills.append(now)

    alive = [spawn() for _ in range(FLEET)]
    kills = 0
    try:
        alive[0].wait_started(timeout=60)
        pks = expiring_rows(40, start=2.0, step=0.25)
        ends = dict(Document.objects.filter(pk__in=pks).values_list("pk", "locked_until"))
        seen: dict[int, int] = {}  # pk -> index in polls of the poll that first saw it reaped

        def step() -> bool:
            nonlocal kills
            pending = [pk for pk in pks if pk not in seen]
            rows = list(
                Document.objects.filter(pk__in=pending)
                .annotate(db_time=Now())
                .values_list("pk", "version", "db_time")
            )
            polls.append(rows[0][2])
            for pk, version, _at in rows:
                if version > 1:
                    seen[pk] = len(polls) - 1
            for w in alive:
                if w.pid not in born and "taskclaim worker" in w.stdout():
                    born[w.pid] = time.monotonic()
            started = sorted((w for w in alive if w.pid in born), key=lambda w: born[w.pid])
            if len(started) >= 2 and time.monotonic() - born[started[0].pid] >= SHORT_LIFE:
                kill(started[0])
                kills += 1
                alive.remove(started[0])
                alive.append(spawn())
            assert all(w.alive() for w in alive), "a worker of the fleet exited on its own"
            return len(seen) == len(pks)

        wait_for(step, timeout=120, interval=0.05, what="every expired lease reaped")
    finally:
        stop_all(procs)
    assert kills >= 5, f"only {kills} workers killed: the fleet did not crash-loop"
    late: dict[int, float] = {}
    over: list[str] = []
    for pk in pks:
        # The reap happened after the poll before the one that saw it.
        before = polls[seen[pk] - 1] if seen[pk] else ends[pk]
        late[pk] = max(0.0, (before - ends[pk]).total_seconds())
        window = [t for t in mid_reap_kills if ends[pk] - timedelta(seconds=INTERVAL) <= t]
        allowed = INTERVAL + SLACK + REAP_HOLD * len([t for t in window if t <= polls[seen[pk]]])
        if late[pk] > allowed:
            over.append(f"row {pk}: {late[pk]:.2f} s (allowed {allowed:.2f} s)")
    assert not over, (
        f"expired leases waited longer than one interval ({INTERVAL} s) for their reap: "
        f"{over}; kills mid-reap at {mid_reap_kills}; "
        f"waits: {sorted(round(v, 2) for v in late.values())}"
    )


# -- 3. the claim gate is bounded ---------------------------------------------------------

GATE = 5  # TASKCLAIM_CLAIM_GATE of both claimers: a claim of 5 rows takes the gate


def _server_side_binding() -> None:
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    if connection.vendor != "postgresql":
        pytest.skip(f"the claim gate is PostgreSQL's (running on {connection.vendor})")
    if not is_psycopg3:
        pytest.skip("server-side binding is a psycopg 3 option")


def process_state(pid: int) -> str:
    """The state letter of ``pid`` in ``/proc`` (``T``: stopped)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


def gate_holders() -> int:
    """Sessions holding a claim gate (granted advisory locks in its key space)."""
    from django_taskclaim.backends.postgresql import CLAIM_GATE_SPACE

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND classid = %s::oid AND objsubid = 2",
            [CLAIM_GATE_SPACE & 0xFFFFFFFF],
        )
        return int(cursor.fetchone()[0])


@pytest.mark.slow
@override_settings(TASKCLAIM_CLAIM_GATE=GATE)
def test_a_claimer_frozen_between_gate_and_claim_does_not_hold_the_gate(tmp_path):
    """Server-side binding: the gate and the claim are two statements of one transaction.
    A claimer frozen (SIGSTOP) right after taking the gate loses its session within the
    bound, the other large claims pass the gate, and the frozen one claimed nothing."""
    _server_side_binding()
    Document.objects.bulk_create([Document(title=str(i)) for i in range(20)])
    marker = tmp_path / "at-gate"
    frozen = subprocess.Popen(
        [sys.executable, "-m", "tests.recovery.test_seams_recovery", "freeze-at-gate", str(marker)],
        env=child_env(PYTHONUNBUFFERED="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    got: dict[str, Any] = {}

    def large_claim() -> None:
        try:
            got["rows"] = Document.objects.claim(GATE)
        except Exception as exc:  # reported by the assertion below
            got["error"] = exc
        finally:
            connections.close_all()

    waiter = threading.Thread(target=large_claim, daemon=True)
    try:
        wait_for(
            lambda: (marker.exists() and process_state(frozen.pid) == "T") or frozen.poll(),
            timeout=60,
            what="the claimer frozen between the gate and its claim",
        )
        assert frozen.poll() is None, frozen.communicate()[0]
        assert gate_holders() == 1, "the frozen claimer does not hold the gate"
        started = time.monotonic()
        waiter.start()
        waiter.join(timeout=30)
        waited = time.monotonic() - started
        assert not waiter.is_alive(), "a large claim waited 30 s behind a frozen claimer"
    finally:
        if frozen.poll() is None:
            os.kill(frozen.pid, signal.SIGCONT)
        try:
            output = frozen.communicate(timeout=60)[0]
        except subprocess.TimeoutExpired:
            os.kill(frozen.pid, signal.SIGKILL)
            output = frozen.communicate()[0]
        waiter.join(timeout=30)
    assert "error" not in got, got.get("error")
    assert len(got["rows"]) == GATE
    assert waited < 20, f"the gate was held {waited:.1f} s by a frozen claimer"
    # The frozen claimer's transaction ended with its session: it claimed nothing, and
    # woken up it says so in one line.
    assert "claimed=0" not in output
    assert "claim failed:" in output, output
    assert frozen.returncode == 3, output
    assert Document.objects.filter(status="processing").count() == GATE
    assert gate_holders() == 0


def _freeze_at_gate(marker: str) -> int:
    """Claim (server-side binding, gate at :data:`GATE`) and stop this process with
    SIGSTOP right after the gate statement ran, before the claim is sent."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.support.settings")
    django.setup()
    from django.conf import settings
    from django.db import DatabaseError
    from django.db import connection as conn

    from tests.support.testapp.models import Document as Doc

    settings.TASKCLAIM_CLAIM_GATE = GATE
    conn.settings_dict["OPTIONS"]["server_side_binding"] = True

    def freeze_after_gate(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        result = execute(sql, params, many, context)
        if "pg_advisory_xact_lock" in sql:
            Path(marker).write_text("at the gate")
            os.kill(os.getpid(), signal.SIGSTOP)
        return result

    try:
        with conn.execute_wrapper(freeze_after_gate):
            rows = Doc.objects.claim(GATE, worker="frozen")
    except DatabaseError as exc:
        print(f"claim failed: {str(exc).strip().splitlines()[0]}")
        return 3
    print(f"claimed={len(rows)}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["freeze-at-gate"]:
        sys.exit(_freeze_at_gate(sys.argv[2]))
    sys.exit(f"usage: {sys.argv[0]} freeze-at-gate MARKER")
