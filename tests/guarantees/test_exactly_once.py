"""Exactly-once database effects, with real worker processes and real SIGKILLs.

Three ways to write a task's database side effect, and what each guarantees:

- ``with task.fenced(complete=True):`` — the effect and the completion commit in one
  transaction: EXACTLY ONCE;
- ``ClaimMeta.atomic = True`` — the worker runs the whole body and writes the completion
  (with the returned result fields) in one fenced transaction: EXACTLY ONCE;
- ``with task.fenced():`` and return — the effect commits at the end of the block, the
  completion later: AT LEAST ONCE (a crash in between repeats the effect).
"""

from __future__ import annotations

from collections import Counter

import pytest
from django.conf import settings

from tests.support.helpers import wait_for
from tests.support.testapp.models import Document, Ledger
from tests.support.worker_handlers import ATTEMPT
from tests.support.worker_procs import WorkerProc, kill_repeatedly, stop_all

pytestmark = pytest.mark.django_db(transaction=True)

FAST = {"TASKCLAIM_REAP_INTERVAL": 0.5, "TASKCLAIM_RETRY_BACKOFF": 0.05}
PATTERNS = {
    "fenced_complete": {"handler": "tests.support.worker_handlers.process_fenced_complete"},
    "atomic_meta": {"handler": "tests.support.worker_handlers.process_plain", "atomic": True},
    "fenced_only": {"handler": "tests.support.worker_handlers.process_fenced_only"},
}
EXACTLY_ONCE = ["fenced_complete", "atomic_meta"]


@pytest.fixture
def procs(transactional_db):
    started: list[WorkerProc] = []
    yield started
    stop_all(started)


def worker(procs, pattern: str, *args: str, **meta) -> WorkerProc:
    w = WorkerProc(
        "testapp.Document",
        *args,
        settings=FAST,
        claim_meta={**PATTERNS[pattern], "max_attempts": 50, **meta},
    )
    procs.append(w)
    return w


def effects() -> Counter:
    return Counter(
        Ledger.objects.exclude(worker__startswith=ATTEMPT).values_list("task_id", flat=True)
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("pattern", "expected"),
    [("fenced_complete", 1), ("atomic_meta", 1), ("fenced_only", 2)],
)
def test_a_kill_right_after_the_effect(procs, pattern, expected):
    """SIGKILL after the effect was written, before the task's completion was recorded
    on its own: the exactly-once patterns roll the effect back with the attempt; the
    at-least-once pattern has committed it, and the re-run writes it again."""
    task = Document.objects.create(title="k", payload={"then": "kill"})
    sup = worker(procs, pattern, "--processes", "1", "--lease", "300")
    wait_for(
        lambda: Document.objects.done().filter(pk=task.pk).exists(),
        timeout=60,
        what="the task done after its first holder was killed",
    )
    assert "worker process died" in sup.stderr()
    assert effects()[task.pk] == expected
    row = Document.objects.get(pk=task.pk)
    assert row.attempts == 2
    if pattern == "atomic_meta":
        assert row.result == f"atomic {task.pk}"  # returned fields commit with the effect


@pytest.mark.slow
@pytest.mark.parametrize("pattern", EXACTLY_ONCE)
@pytest.mark.parametrize("then", ["raise", "retry"])
def test_a_failed_attempt_commits_nothing(procs, pattern, then):
    """A body that raises (or asks for a retry) after writing its effect: the exactly-once
    patterns roll the effect back, the retry runs, and one effect is left."""
    task = Document.objects.create(title="r", payload={"then": then})
    w = worker(procs, pattern)
    wait_for(lambda: Document.objects.done().filter(pk=task.pk).exists(), timeout=60,
             what="the retried task done")  # fmt: skip
    assert w.stop() == 0, w.stderr()
    row = Document.objects.get(pk=task.pk)
    assert (row.status, row.attempts) == ("done", 2)
    assert effects()[task.pk] == 1
    # only the last attempt's effect is there: the failed attempt's was rolled back
    last = max(Ledger.objects.filter(worker__startswith=ATTEMPT).values_list("token", flat=True))
    kept = set(Ledger.objects.exclude(worker__startswith=ATTEMPT).values_list("token", flat=True))
    assert kept == {last}


def test_fenced_only_keeps_the_effect_of_a_failed_attempt(procs):
    """What the docs say of the at-least-once pattern: the block committed, so the
    effect of an attempt that then failed stays, and the retry adds another."""
    task = Document.objects.create(title="r", payload={"then": "raise"})
    w = worker(procs, "fenced_only")
    wait_for(lambda: Document.objects.done().filter(pk=task.pk).exists(), timeout=60,
             what="the retried task done")  # fmt: skip
    assert w.stop() == 0, w.stderr()
    assert effects()[task.pk] == 2


#: (tasks, seconds each) per database: the chaos lasts about 12 s on two shared cores.
CHAOS = {"postgresql": (600, 0.03), "mysql": (400, 0.05), "sqlite": (300, 0.05)}


@pytest.mark.slow
@pytest.mark.parametrize("pattern", [*EXACTLY_ONCE, "fenced_only"])
def test_chaos_sigkill_every_two_seconds(procs, pattern):
    """Three workers, one SIGKILLed about every 2 s and replaced for 12 s, then drained:
    the exactly-once patterns leave one effect per task; the at-least-once pattern at
    least one (duplicates are what it allows)."""
    if pattern not in EXACTLY_ONCE and settings.DB_VENDOR != "postgresql":
        pytest.skip("the at-least-once form is shown under chaos once, on PostgreSQL")
    n, seconds = CHAOS[settings.DB_VENDOR]
    Document.objects.bulk_create(
        [Document(title=f"x{i}", payload={"sleep": seconds}) for i in range(n)], batch_size=500
    )
    args = ("--concurrency", "2", "--batch", "5", "--lease", "3")
    alive = [worker(procs, pattern, *args) for _ in range(3)]
    kills = kill_repeatedly(
        alive,
        lambda: worker(procs, pattern, *args),
        seconds=12,
        done=lambda: Document.objects.done().count() >= n,
        seed=20261123,
    )
    wait_for(lambda: Document.objects.done().count() == n, timeout=120, interval=0.25,
             what="drain after the chaos")  # fmt: skip
    assert kills >= 3
    per_task = effects()
    assert len(per_task) == n  # NO LOSS: every task's effect is there
    if pattern in EXACTLY_ONCE:
        duplicated = {pk: c for pk, c in per_task.items() if c != 1}
        assert not duplicated, f"effects committed more than once: {duplicated}"
    else:
        assert min(per_task.values()) >= 1
    for w in alive:
        assert w.stop() == 0, w.stderr()[-2000:]
