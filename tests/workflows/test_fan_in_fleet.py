"""Fan-out / fan-in under SIGKILL: real worker processes, one killed about every 2 s and
replaced, drain groups of members and their callbacks (a row created with ``after=`` the
group, ``on_failure='run'``). Checked over the ledger and the database clock, on each
database the suite runs on:

- every callback's effect committed exactly once (its ledger row is written inside its
  fenced completion);
- no callback was released before the last member's settle committed, nor claimed
  before its release (``TaskFanIn.released_at``, ``claimed_at``, ``finished_at``);
- every fan-in counter ends exact (done and failed as the members ended, none open);
- every link of the chains ran after its prerequisite's settle (database clock);
- nothing lost, nothing stuck.

The suite runs 60 groups, 3 chains of 20 and 3 workers for about 12 s of kills. The
issue's scale (2,000 groups of 10 and chains of 20, 6 workers) is the same test with
``TASKCLAIM_FANIN_GROUPS=2000 TASKCLAIM_FANIN_CHAINS=10 TASKCLAIM_FANIN_WORKERS=6
TASKCLAIM_FANIN_CALLBACK_SLEEP=0 TASKCLAIM_FANIN_KILL_SECONDS=3600`` (kills until the
end; docs/workflows.md gives its last results).
"""

from __future__ import annotations

import os
import time

import pytest
from django.db.models import Max

from django_taskclaim.models import TaskFanIn
from django_taskclaim.settle.dependents import key_of
from tests.support.helpers import wait_for
from tests.support.testapp.models import Document, Ledger, Step
from tests.support.worker_procs import WorkerProc, kill_repeatedly

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

GROUPS = int(os.environ.get("TASKCLAIM_FANIN_GROUPS", "60"))
CHAINS = int(os.environ.get("TASKCLAIM_FANIN_CHAINS", "3"))
LINKS = 20
WORKERS = int(os.environ.get("TASKCLAIM_FANIN_WORKERS", "3"))
#: Seconds of kills (they stop earlier once everything finished).
KILLING = float(os.environ.get("TASKCLAIM_FANIN_KILL_SECONDS", "12"))
MEMBERS = 10  # the last member of each group fails: the callback runs anyway ('run')
#: Each callback takes 0.5 s, then writes its ledger row and completes in one fenced
#: transaction: 60 of them keep the six slots busy for 5 s at least, so the kills (one
#: every 1.5-2.5 s) land while callbacks run, however fast the machine.
CALLBACK = {
    "sleep": float(os.environ.get("TASKCLAIM_FANIN_CALLBACK_SLEEP", "0.5")),
    "ledger": True,
}


def worker(procs: list[WorkerProc]) -> WorkerProc:
    w = WorkerProc(
        "testapp.Step",
        "testapp.Document",
        "--concurrency", "2",
        "--batch", "5",
        "--poll", "0.2",
        "--lease", "3",
        settings={"TASKCLAIM_REAP_INTERVAL": 1.0},
    )  # fmt: skip
    procs.append(w)
    return w


def test_a_killed_fleet_runs_every_callback_exactly_once_after_its_members(procs):
    groups: dict[int, list[int]] = {}
    for g in range(GROUPS):
        members = Step.objects.enqueue_many(
            [
                {"name": f"{g}-{i}", "payload": {"fail": "broken"} if i == MEMBERS - 1 else {}}
                for i in range(MEMBERS)
            ]
        )
        callback = Document.objects.create(
            title=f"join {g}", payload=CALLBACK, after=members, on_failure="run"
        )
        groups[callback.pk] = [m.pk for m in members]
    links: list[tuple[int, int]] = []
    for c in range(CHAINS):
        row = Step.objects.create(name=f"chain {c}-0")
        for i in range(1, LINKS):
            nxt = Step.objects.create(name=f"chain {c}-{i}", after=[row])
            links.append((row.pk, nxt.pk))
            row = nxt
    total = GROUPS * (MEMBERS + 1) + CHAINS * LINKS
    began = time.monotonic()

    def finished() -> int:
        steps = Step.objects.filter(status__in=["done", "failed"]).count()
        return steps + Document.objects.filter(status="done").count()

    alive = [worker(procs) for _ in range(WORKERS)]
    kills = kill_repeatedly(
        alive,
        lambda: worker(procs),
        seconds=KILLING,
        done=lambda: finished() == total,
        seed=20261128,
    )
    wait_for(lambda: finished() == total, timeout=180 + total / 20, interval=0.25,
             what="every member and callback finished")  # fmt: skip
    drained = time.monotonic() - began
    for w in alive:
        assert w.stop() == 0, w.stderr()[-3000:]

    effects = Ledger.objects.filter(task_id__in=list(groups)).values_list("task_id", flat=True)
    counted = {pk: list(effects).count(pk) for pk in groups}
    assert counted == dict.fromkeys(groups, 1), "a callback's effect committed twice or never"
    fan_ins = {
        int(f.dependent_pk): f for f in TaskFanIn.objects.filter(dependent_model="testapp.Document")
    }
    for pk, members in groups.items():
        counter = fan_ins[pk]
        assert (counter.total, counter.open, counter.done, counter.failed) == (
            MEMBERS, 0, MEMBERS - 1, 1,
        ), pk  # fmt: skip
        last = Step.objects.filter(pk__in=members).aggregate(t=Max("finished_at"))["t"]
        callback = Document.objects.get(pk=pk)
        assert counter.released_at is not None
        assert last is not None
        assert counter.released_at >= last, (pk, counter.released_at, last)
        assert callback.claimed_at is not None
        assert callback.claimed_at >= counter.released_at
        assert key_of(pk) == counter.dependent_pk
    steps = dict(Step.objects.filter(pk__in=[p for link in links for p in link])
                 .values_list("pk", "finished_at"))  # fmt: skip
    claimed = dict(Step.objects.filter(pk__in=[b for _, b in links])
                   .values_list("pk", "claimed_at"))  # fmt: skip
    for before, after in links:
        assert claimed[after] >= steps[before], (before, after)
    assert not Step.objects.exclude(status__in=["done", "failed"]).exists()
    print(f"{total:,} rows ({GROUPS:,} groups of {MEMBERS}, {CHAINS} chains of {LINKS}), "
          f"{WORKERS} workers, {kills} killed, drained in {drained:.0f} s")  # fmt: skip
    assert kills >= 2, f"only {kills} workers killed: the fleet drained before the chaos"
