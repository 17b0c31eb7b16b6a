"""Real worker processes drain chains of rows that wait for each other: every row ends
done, and each one started (``claimed_at``) after its prerequisite finished
(``finished_at``), both by the database clock. On each database the suite runs on."""

from __future__ import annotations

import pytest

from tests.support.helpers import wait_for
from tests.support.testapp.models import Document, Step
from tests.support.worker_procs import WorkerProc

pytestmark = pytest.mark.django_db(transaction=True)

CHAINS = 6
LENGTH = 4  # three Steps, then a Document


def test_worker_processes_drain_chains_each_row_after_its_prerequisite(procs):
    links: list[tuple[object, object]] = []
    lasts = []
    for c in range(CHAINS):
        row = Step.objects.create(name=f"{c}-0")
        for i in range(1, LENGTH - 1):
            nxt = Step.objects.create(name=f"{c}-{i}", after=[row])
            links.append((row, nxt))
            row = nxt
        doc = Document.objects.create(title=f"{c}-end", after=[row])
        links.append((row, doc))
        lasts.append(row)
    fan_in = Document.objects.create(title="fan-in", after=lasts)
    links.extend((row, fan_in) for row in lasts)
    for n in range(2):
        w = WorkerProc(
            "testapp.Step",
            "testapp.Document",
            "--concurrency",
            "3",
            "--batch",
            "2",
            "--poll",
            "0.2",
            "--worker-id",
            f"chains-{n}",
        )
        procs.append(w)
    total = CHAINS * LENGTH + 1

    def all_done() -> bool:
        done = Step.objects.filter(status="done").count()
        return done + Document.objects.filter(status="done").count() == total

    wait_for(all_done, timeout=120, what="every row of the chains done")
    for w in procs:
        assert w.stop() == 0, w.stderr()[-3000:]
    for before, after in links:
        first = type(before)._base_manager.get(pk=before.pk)
        then = type(after)._base_manager.get(pk=after.pk)
        assert first.finished_at is not None
        assert then.claimed_at is not None
        assert then.claimed_at >= first.finished_at, (first, then)
        assert then.attempts == 1


def test_one_burst_drains_a_chain_its_own_completions_release(procs):
    # A --burst worker stops when a claim finds nothing: the completions it writes after
    # that claim (batched) may have released rows, which it must look for first.
    for attempt in range(3):
        row = Step.objects.create(name=f"burst {attempt}-0")
        for i in range(1, 6):
            row = Step.objects.create(name=f"burst {attempt}-{i}", after=[row])
        fan = Document.objects.create(
            title=f"burst fan {attempt}",
            after=[Step.objects.create(name=f"burst {attempt} m{k}") for k in range(4)],
        )
        worker = WorkerProc("testapp.Step", "testapp.Document", "--burst", "--concurrency", "2")
        procs.append(worker)
        assert worker.wait(timeout=120) == 0, worker.stderr()[-3000:]
        left = list(Step.objects.exclude(status="done").values_list("name", "status")) + list(
            Document.objects.exclude(status="done").values_list("title", "status")
        )
        assert left == [], f"round {attempt}: one burst left {left}"
        assert Document.objects.get(pk=fan.pk).status == "done"
