"""Two prerequisites of one dependent settling at once, in transactions on real
connections: the dependent is released exactly once, never left waiting with every
prerequisite settled (docs/workflows.md, "Guarantees"). SQLite has one writer: the
settles cannot overlap there, so the race is run on PostgreSQL and MariaDB only."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from django_taskclaim.models import TaskDependency
from tests.support.testapp.models import Document, Step

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        settings.DB_VENDOR == "sqlite", reason="SQLite has one writer: settles never overlap"
    ),
]

PREREQUISITES = 8
ROUNDS = 10


def _race(calls: list[Any]) -> list[Any]:
    """Run each call in its own thread and connection, all released at once."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[i] = calls[i]()
        except BaseException as exc:  # recorded, asserted below
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive(), "a settle hung"
    return results


@pytest.mark.parametrize("how", ["complete", "fail_with_run"])
def test_concurrent_final_settles_release_each_dependent_exactly_once(how):
    for rnd in range(ROUNDS):
        steps = Step.objects.enqueue_many([{"name": f"{rnd}-{i}"} for i in range(PREREQUISITES)])
        policy = "run" if how == "fail_with_run" else "cancel"
        every = Document.objects.enqueue_many(
            [{"title": f"all-{rnd}-{i}"} for i in range(3)], after=steps, on_failure=policy
        )
        half = Document.objects.create(title=f"half-{rnd}", after=steps[::2], on_failure=policy)
        tasks = Step.objects.claim(PREREQUISITES)
        assert len(tasks) == PREREQUISITES
        settle = (lambda t: t.complete) if how == "complete" else (lambda t: lambda: t.fail("x"))
        results = _race([settle(t) for t in tasks])
        assert [r for r in results if isinstance(r, BaseException)] == []
        for row in [*every, half]:
            now = Document.objects.get(pk=row.pk)
            # released once: waiting -> ready bumped the token once, from 0 to 1
            assert (now.status, now.version) == ("ready", 1), (rnd, row.title)
        assert not TaskDependency.objects.filter(outcome="").exists()
        Document.objects.all().delete()
