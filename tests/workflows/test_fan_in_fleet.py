"""Fan-out / fan-in under SIGKILL: real worker processes, one killed about every 2 s and
replaced, drain groups of members and their callbacks (a row created with ``after=`` the
group, ``on_failure='run'``). Checked over the ledger and the database clock, on each
database the suite runs on:

- every callback's effect committed exactly once (its ledger row is written inside its
  fenced completion);
- no callback was released before the last member's settle committed, nor claimed
  before its release (``TaskFanIn.released_at``, ``claimed_at``, ``finished_at``);
- every fan-in counter ends exact (done and failed as the members ended, none open);
- nothing lost, nothing stuck.
"""

from __future__ import annotations

import pytest
from django.db.models import Max

from django_taskclaim.models import TaskFanIn
from django_taskclaim.settle.dependents import key_of
from tests.support.helpers import wait_for
from tests.support.testapp.models import Document, Ledger, Step
from tests.support.worker_procs import WorkerProc, kill_repeatedly, stop_all

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

GROUPS = 60
MEMBERS = 10  # the last member of each group fails: the callback runs anyway ('run')
#: Each callback takes 0.5 s, then writes its ledger row and completes in one fenced
#: transaction: 60 of them keep the six slots busy for 5 s at least, so the kills (one
#: every 1.5-2.5 s) land while callbacks run, however fast the machine.
CALLBACK = {"sleep": 0.5, "ledger": True}


@pytest.fixture
def procs():
    started: list[WorkerProc] = []
    yield started
    stop_all(started)


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
    total = GROUPS * (MEMBERS + 1)

    def finished() -> int:
        steps = Step.objects.filter(status__in=["done", "failed"]).count()
        return steps + Document.objects.filter(status="done").count()

    alive = [worker(procs) for _ in range(3)]
    kills = kill_repeatedly(
        alive, lambda: worker(procs), seconds=12, done=lambda: finished() == total, seed=20261128
    )
    wait_for(lambda: finished() == total, timeout=180, interval=0.25,
             what="every member and callback finished")  # fmt: skip
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
    assert not Step.objects.exclude(status__in=["done", "failed"]).exists()
    assert kills >= 2, f"only {kills} workers killed: the fleet drained before the chaos"
