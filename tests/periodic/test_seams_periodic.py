"""A periodic slot fires once across a fleet whose workers list their databases in
different orders: the schedules have one home database (``schedule_home()``: the routers'
database for writes of ``taskclaim.PeriodicSlot``), the same for every worker."""

from __future__ import annotations

import pytest

from django_taskclaim.models import PeriodicRun, PeriodicSlot
from django_taskclaim.worker import fleet
from django_taskclaim.worker.fleet import plan, schedule_home
from tests.support import periodic_jobs
from tests.support.helpers import wait_for
from tests.support.worker_procs import WorkerProc, stop_all
from tests.worker.test_fleet import needs_two_servers, shard  # noqa: F401 (a fixture)

FAST = {"TASKCLAIM_REAP_INTERVAL": 0.5, "TASKCLAIM_RETRY_BACKOFF": 0.05}


def test_only_the_home_databases_configuration_runs_the_scheduler(monkeypatch) -> None:
    assert schedule_home() == "default"  # no routers
    assert [c.scheduler for c in plan(["taskclaim.PeriodicRun"], ["default"])] == [True]
    monkeypatch.setattr(fleet, "schedule_home", lambda: "elsewhere")
    assert [c.scheduler for c in plan(["taskclaim.PeriodicRun"], ["default"])] == [False]


@needs_two_servers
@pytest.mark.slow
def test_two_workers_listing_two_databases_in_opposite_orders_fire_each_slot_once(
    shard,  # noqa: F811
    transactional_db,
):
    _data_dir, env, sql = shard
    env = {**env, "TASKCLAIM_T_PERIODIC": "1"}
    workers = [
        WorkerProc(
            "taskclaim.PeriodicRun",
            *("--lease", "2", "--database", first, "--database", second),
            *("--worker-id", f"w-{first}"),
            settings=FAST,
            env=env,
        )
        for first, second in (("default", "shard"), ("shard", "default"))
    ]
    try:
        for worker in workers:
            worker.wait_started(90)
        wait_for(
            lambda: PeriodicRun.objects.filter(status="done").count() >= 5,
            timeout=120,
            what="5 periodic runs done",
        )
        for worker in workers:
            assert worker.stop(90) == 0, worker.stderr()[-3000:]
    finally:
        stop_all(workers)
    assert sql("SELECT count(*) FROM taskclaim_periodicslot") == [(0,)], "fired on the shard"
    assert sql("SELECT count(*) FROM taskclaim_periodicrun") == [(0,)], "ran on the shard"
    slots = list(
        PeriodicSlot.objects.filter(schedule=periodic_jobs.TICK).values_list("slot", flat=True)
    )
    runs = list(PeriodicRun.objects.filter(schedule=periodic_jobs.TICK).values_list("slot"))
    assert len(slots) >= 5
    assert sorted(r for (r,) in runs) == sorted(slots), "one run per slot"
