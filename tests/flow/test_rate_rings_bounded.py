"""Operator reads that do not grow with idle keys, and idle rings pruned by the worker's
maintenance (docs/rate-limits.md, "Seeing it" and "Idle rings"), on the real database:
slots charged by real claims, rings made idle by their claim times (database clock),
pruning run by a real worker subprocess."""

from __future__ import annotations

import threading
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.urls import reverse

from django_taskclaim.config.options import get_options
from django_taskclaim.db import db_now
from django_taskclaim.flow import rate_prune
from django_taskclaim.flow.rate_prune import prune_idle_rings
from django_taskclaim.flow.rate_view import KEY_RINGS, key_slots_in_window, rate_view
from django_taskclaim.models import RateSlot
from tests.flow.test_rate_limits import claim_meta, max_in_window, start_of
from tests.support.flowapp.models import Errand, KeyedErrand
from tests.support.helpers import wait_for
from tests.support.keyedapp.models import PairJob
from tests.support.worker_procs import WorkerProc, stop_all

pytestmark = pytest.mark.django_db(transaction=True)

KEYED = "flowapp.KeyedErrand"


def idle_rings(label: str, scopes: list[str], count: int, *, ago: float = 7200.0) -> None:
    """Rings of ``count`` slots for ``scopes``, every slot last used ``ago`` seconds
    before the database clock (keys used once, long ago)."""
    when = db_now() - timedelta(seconds=ago)
    RateSlot.objects.bulk_create(
        RateSlot(model=label, scope=scope, slot=slot, last_start=when)
        for scope in scopes
        for slot in range(count)
    )


def scopes_of(label: str) -> set[str]:
    return set(RateSlot.objects.filter(model=label).values_list("scope", flat=True))


def busy_keys(n: int) -> None:
    """``n`` keys with one real claim each (a start in the window), keys 0 … n-1; key 0
    claimed twice more (at its 2/h limit)."""
    KeyedErrand.objects.bulk_create(KeyedErrand(customer_id=c) for c in range(n))
    assert len(KeyedErrand.objects.claim(n)) == n
    KeyedErrand.objects.filter(status="processing").update(status="done")
    KeyedErrand.objects.create(customer_id=0)
    (task,) = KeyedErrand.objects.claim(5)
    task.complete()


def test_the_view_lists_the_busiest_keys_and_sums_up_the_rest(admin_client) -> None:
    with claim_meta(KeyedErrand, key_rate_limit="2/h"):
        busy_keys(KEY_RINGS + 5)
        idle_rings(KEYED, [f"key:idle{i}" for i in range(40)], 2)
        (rated,) = rate_view([KeyedErrand])
        keys = [r for r in rated.rings if r.per == "key"]
        # Only the busiest are listed (at the limit first), the idle ones not at all.
        assert len(keys) == KEY_RINGS
        assert (keys[0].value, keys[0].starts, keys[0].at_limit) == ("0", 2, True)
        assert not any(r.value.startswith("idle") for r in keys)
        assert rated.keys is not None
        assert (rated.keys.busy, rated.keys.at_limit) == (KEY_RINGS + 5, 1)
        assert rated.keys.starts == KEY_RINGS + 5 + 1
        out = StringIO()
        call_command("taskclaim_stats", KEYED, stdout=out)
        assert f"  {KEYED} keys 2/h: {KEY_RINGS + 5} with starts in the window, 1 at the" in (
            out.getvalue()
        )
        assert out.getvalue().count(f"  {KEYED} key ") == KEY_RINGS
        resp = admin_client.get(reverse("admin:taskclaim_dashboard"))
    (row,) = resp.context["taskclaim_rates"]
    assert (row["keys"]["busy"], row["more"]) == (KEY_RINGS + 5, 5)
    assert f'data-model="{KEYED}" data-busy="{KEY_RINGS + 5}"' in resp.content.decode()


def test_the_metrics_have_the_busy_keys_and_no_idle_key() -> None:
    parser = pytest.importorskip("prometheus_client.parser")
    with claim_meta(KeyedErrand, key_rate_limit="2/h"):
        busy_keys(3)
        idle_rings(KEYED, [f"key:idle{i}" for i in range(10)], 2)
        out = StringIO()
        call_command("taskclaim_metrics", stdout=out)
    found = {
        family.name: {tuple(sorted(s.labels.items())): s.value for s in family.samples}
        for family in parser.text_string_to_metric_families(out.getvalue())
    }
    assert found["taskclaim_rate_limit_keys_busy"] == {(("model", KEYED),): 3}
    assert found["taskclaim_rate_limit_keys_at_limit"] == {(("model", KEYED),): 1}
    assert {dict(k)["scope"] for k in found["taskclaim_rate_limit_starts"]} == {
        "key:0",
        "key:1",
        "key:2",
    }


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL plans")
def test_the_key_rings_read_goes_through_the_recent_slots_index() -> None:
    """20,000 idle slot rows and a few busy ones: the read of the key rings is an index
    range over the slots of the window, never a scan of every ring."""
    with claim_meta(KeyedErrand, key_rate_limit="2/h"):
        busy_keys(3)
        idle_rings(KEYED, [f"key:idle{i}" for i in range(10_000)], 2)
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE taskclaim_rateslot")
        (lim,) = [lim for lim in get_options(KeyedErrand).rate_limits if lim.per == "key"]
        plan = key_slots_in_window(KeyedErrand, lim, db_now(), "default").explain()
    assert "taskclaim_rate_recent" in plan, plan
    assert "Seq Scan" not in plan, plan


@pytest.mark.slow
@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL plans")
def test_the_gauges_read_of_live_work_never_scans_the_finished_rows() -> None:
    """50,000 done rows and a few live ones: the gauges' query of the ready and
    processing rows goes through the claim and lease partial indexes."""
    from django.test.utils import CaptureQueriesContext

    from django_taskclaim.ops.metrics.gauges import queue_gauges

    Errand.objects.bulk_create(
        (Errand(queue_name=f"q{i % 3}", status="done") for i in range(50_000)), batch_size=5000
    )
    Errand.objects.bulk_create(Errand(queue_name=f"q{i % 3}") for i in range(30))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE flowapp_errand")
    with CaptureQueriesContext(connection) as queries:
        gauges = queue_gauges(Errand, db_now(), using="default")
    assert {g.queue: g.ready for g in gauges} == {"q0": 10, "q1": 10, "q2": 10}
    live = [q["sql"] for q in queries.captured_queries if "'processing'" in q["sql"]]
    assert len(live) == 1
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {live[0]}")
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "Seq Scan" not in plan, plan
    assert "flowapp_errand_claim" in plan, plan


def test_pruning_removes_idle_rings_and_never_a_ring_whose_window_holds_a_slot() -> None:
    with (
        claim_meta(KeyedErrand, key_rate_limit="2/h"),
        claim_meta(Errand, rate_limit="3/h", rate_limit_per="queue"),
    ):
        busy_keys(2)  # key:0 at its limit, key:1 one start
        idle_rings(KEYED, [f"key:{i}" for i in range(100, 130)], 2)
        # a ring with one slot long idle and one used a moment ago: not idle
        idle_rings(KEYED, ["key:7"], 1)
        RateSlot.objects.create(model=KEYED, scope="key:7", slot=1, last_start=db_now())
        # a ring idle for a little less than its window: a slot still counts
        idle_rings(KEYED, ["key:8"], 2, ago=3500)
        idle_rings("flowapp.Errand", ["queue:old", "queue:gone"], 3)
        Errand.objects.create(queue_name="live")
        assert len(Errand.objects.claim(1)) == 1
        before = {s: RateSlot.objects.filter(scope=s).count() for s in ("key:0", "key:7")}
        deleted = prune_idle_rings([KeyedErrand, Errand])
        assert deleted == 30 * 2 + 2 * 3
        assert scopes_of(KEYED) == {"key:0", "key:1", "key:7", "key:8"}
        assert scopes_of("flowapp.Errand") == {"queue:live"}
        assert {s: RateSlot.objects.filter(scope=s).count() for s in before} == before
        assert prune_idle_rings([KeyedErrand, Errand]) == 0  # nothing left to prune
        # A pruned key's next claim makes its ring again, every slot free; the limit of
        # a key still in its window is what it was (exact): key 0 gets nothing.
        KeyedErrand.objects.bulk_create(KeyedErrand(customer_id=c) for c in (100, 0))
        got = KeyedErrand.objects.claim(5)
        assert [t.customer_id for t in got] == [100]
        assert RateSlot.objects.filter(scope="key:100").count() == 2


def test_pruning_leaves_a_ring_whose_slot_a_claim_holds() -> None:
    """A slot locked by a claim in progress (its take, before its charge): the ring is
    left whole, not waited for; the next pass, after that claim ended, deletes it."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite: one writer at a time, no row locks to skip")
    with claim_meta(KeyedErrand, key_rate_limit="2/h"):
        idle_rings(KEYED, ["key:1", "key:2"], 2)
        locked, release = threading.Event(), threading.Event()

        def claim_in_progress() -> None:
            try:
                with transaction.atomic():
                    list(RateSlot.objects.select_for_update().filter(scope="key:1", slot=0))
                    locked.set()
                    release.wait(60)
            finally:
                connections.close_all()

        holder = threading.Thread(target=claim_in_progress)
        holder.start()
        try:
            assert locked.wait(30)
            assert prune_idle_rings([KeyedErrand]) == 2
            assert scopes_of(KEYED) == {"key:1"}
            assert RateSlot.objects.filter(scope="key:1").count() == 2  # whole
        finally:
            release.set()
            holder.join(30)
        assert prune_idle_rings([KeyedErrand]) == 2
        assert scopes_of(KEYED) == set()


def test_a_pass_prunes_a_batch_and_the_next_goes_on(monkeypatch) -> None:
    monkeypatch.setattr(rate_prune, "PRUNE_BATCH", 4)
    monkeypatch.setattr(rate_prune, "PRUNE_PASSES", 2)
    with claim_meta(KeyedErrand, key_rate_limit="2/h"):
        idle_rings(KEYED, [f"key:{i}" for i in range(10)], 2)
        assert prune_idle_rings([KeyedErrand]) == 16  # two passes of four rings
        assert prune_idle_rings([KeyedErrand]) == 4
        assert scopes_of(KEYED) == set()


@pytest.mark.slow
def test_pruning_while_claims_run_never_lets_a_key_exceed_its_limit() -> None:
    """Four connections claim and finish rows of 12 keys at ``2/0.3s`` each while a fifth
    prunes idle rings in a loop: a ring is idle exactly when its slots are free, so the
    pruner keeps deleting rings that claimers are about to take. Every key's busiest
    sliding 0.3 s still holds at most 2 claim times, and every row is done."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite: one writer at a time (the claim's write lock); no race to run")
    PairJob.objects.bulk_create(PairJob(customer_id=k) for _ in range(8) for k in range(12))
    starts: dict[int, list[Any]] = {}
    pruned: list[int] = []
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[BaseException] = []

    def claimer() -> None:
        try:
            while not stop.is_set():
                for task in PairJob.objects.claim(4):
                    with lock:
                        starts.setdefault(task.customer_id, []).append(start_of(task, 30))
                    task.complete()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    def pruner() -> None:
        try:
            while not stop.is_set():
                pruned.append(prune_idle_rings([PairJob]))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    with claim_meta(PairJob, key_rate_limit="2/0.3s", concurrency_limit=100, lease=30):
        threads = [threading.Thread(target=claimer) for _ in range(4)]
        threads.append(threading.Thread(target=pruner))
        for t in threads:
            t.start()
        try:
            wait_for(
                lambda: (
                    bool(errors)
                    or (PairJob.objects.filter(status="done").count() == 96 and sum(pruned) > 0)
                ),
                timeout=120,
                what="every row done, rings pruned on the way",
            )
        finally:
            stop.set()
            for t in threads:
                t.join(60)
    assert not errors, errors
    assert PairJob.objects.filter(status="processing").count() == 0  # none claimed, lost
    assert sum(len(v) for v in starts.values()) == 96  # each row claimed once
    busiest = {key: max_in_window(times, 0.3) for key, times in starts.items()}
    assert max(busiest.values()) <= 2, busiest
    assert sum(pruned) > 0


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the server raises 40P01")
def test_a_deadlock_in_a_later_pass_keeps_the_rows_claimed_before_it(monkeypatch) -> None:
    """A per-key claim looks past a held-back key in a second pass, its own transaction.
    When that pass fails with a deadlock (raised by the server, SQLSTATE 40P01), the rows
    the first pass committed are returned to the caller, not left ``processing`` while
    the claim is retried from the start."""
    from django_taskclaim.claim import rate

    real = rate._claim_in_transaction
    calls: list[int] = []

    def second_pass_deadlocks(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            cursor = args[3]
            cursor.execute(
                "DO $$ BEGIN RAISE EXCEPTION 'deadlock detected' USING ERRCODE = '40P01'; END $$"
            )
        return real(*args, **kwargs)

    PairJob.objects.bulk_create(PairJob(customer_id=c) for c in (1, 1, 1, 2, 3))
    monkeypatch.setattr(rate, "_claim_in_transaction", second_pass_deadlocks)
    with claim_meta(PairJob, key_rate_limit="1/h", concurrency_limit=100, lease=30):
        got = PairJob.objects.claim(3)
    held = set(PairJob.objects.filter(status="processing").values_list("pk", flat=True))
    assert len(calls) >= 2  # the second pass ran, and failed
    assert held == {t.pk for t in got}  # every claimed row is the caller's
    assert [t.customer_id for t in got] == [1]


KEY_META = {"key_rate_limit": "2/h", "concurrency_limit": 2, "lease": 30}


@pytest.mark.slow
def test_the_workers_maintenance_prunes_idle_rings() -> None:
    """A real worker (reaping every 0.5 s) deletes the idle key rings of the model it
    serves, and leaves the ring of a key used within its window."""
    idle_rings("keyedapp.PairJob", [f"key:{i}" for i in range(100, 150)], 2)
    RateSlot.objects.create(model="keyedapp.PairJob", scope="key:7", slot=0, last_start=db_now())
    PairJob.objects.bulk_create(PairJob(customer_id=1000) for _ in range(2))
    proc = WorkerProc(
        "keyedapp.PairJob",
        "--poll=0.2",
        "--worker-id=prune-1",
        settings={"TASKCLAIM_REAP_INTERVAL": 0.5},
        claim_meta=KEY_META,
        env={"TASKCLAIM_T_CLAIMMETA_MODEL": "keyedapp.PairJob"},
    )
    try:
        proc.wait_started(timeout=60)
        wait_for(
            lambda: scopes_of("keyedapp.PairJob") <= {"key:7", "key:1000"},
            timeout=60,
            what="the idle rings pruned by the worker",
        )
        wait_for(
            lambda: PairJob.objects.filter(status="done").count() == 2,
            timeout=60,
            what="the rows of the busy key done",
        )
    finally:
        stop_all([proc])
    assert RateSlot.objects.filter(scope="key:7").count() == 1
    # key 1000 ran its 2 rows within its window: its ring holds both starts, not pruned
    assert RateSlot.objects.filter(scope="key:1000").count() == 2
