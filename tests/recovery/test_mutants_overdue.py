"""The writes of ``django_taskclaim/recovery/overdue.py`` at the points its own tests do not
look (docs/testing.md, "Mutation testing"): they go to the database they are given, not
the one a router would choose, and a model without ``locked_by`` is skipped, not the end
of the models to give back.
"""

from __future__ import annotations

import pytest
from django.db import models
from django.test.utils import isolate_apps, override_settings

from django_taskclaim.models import ClaimableMixin
from django_taskclaim.recovery.overdue import fail_overdue, give_back_held
from django_taskclaim.settle.transitions import Outcome
from tests.support.deadlineapp.models import TimedTask
from tests.support.testapp.models import Document

pytestmark = pytest.mark.django_db(transaction=True)


class ElsewhereRouter:
    """Sends every read and write it is asked about to a database alias that does not
    exist: an explicit ``using`` must never ask it."""

    def db_for_read(self, model, **hints):
        return "elsewhere"

    def db_for_write(self, model, **hints):
        return "elsewhere"


ELSEWHERE = override_settings(DATABASE_ROUTERS=[f"{__name__}.ElsewhereRouter"])


def test_fail_overdue_reads_and_writes_the_database_it_is_given():
    TimedTask.objects.create()
    row = TimedTask.objects.claim(1, worker="child-0")[0]
    with ELSEWHERE:
        outcome = fail_overdue(TimedTask, row.pk, row.version, using="default", timeout=3)
    assert outcome is Outcome.READY
    after = TimedTask.objects.get(pk=row.pk)
    assert (after.status, after.attempts) == ("ready", 1)
    assert after.last_error == "TimeoutError: ran past its 3s deadline"


def test_give_back_held_reads_and_writes_the_database_it_is_given():
    TimedTask.objects.bulk_create(TimedTask() for _ in range(2))
    rows = TimedTask.objects.claim(2, worker="child-0")
    with ELSEWHERE:
        assert give_back_held("child-0", [TimedTask], using="default") == 2
    for row in rows:
        after = TimedTask.objects.get(pk=row.pk)
        assert (after.status, after.attempts, after.locked_until) == ("ready", 0, None)
        assert after.version == row.version + 1


@isolate_apps("tests.support.testapp")
def test_give_back_held_skips_a_model_without_locked_by_and_goes_on():
    class Unnamed(ClaimableMixin, models.Model):
        """Claimable without ``locked_by``: its rows wait for their lease (no table: it is
        skipped before any query)."""

        status = models.CharField(max_length=20, default="ready")
        version = models.PositiveBigIntegerField(default=0)
        locked_until = models.DateTimeField(null=True)
        attempts = models.PositiveIntegerField(default=0)

        class Meta:
            app_label = "testapp"

    Document.objects.bulk_create(Document(title=f"d{i}") for i in range(2))
    TimedTask.objects.create()
    docs = Document.objects.claim(2, worker="child-0")
    timed = TimedTask.objects.claim(1, worker="child-0")[0]
    n = give_back_held("child-0", [Unnamed, Document, TimedTask], using="default")
    assert n == 3
    assert set(Document.objects.values_list("status", flat=True)) == {"ready"}
    assert TimedTask.objects.get(pk=timed.pk).status == "ready"
    assert all(Document.objects.get(pk=d.pk).version == d.version + 1 for d in docs)
