"""The writes after a supervisor replaced a child for a body past its deadline
(:mod:`django_taskclaim.recovery.overdue`): the stuck attempt fails with TimeoutError,
the other rows go back without losing an attempt; every write fenced."""

from __future__ import annotations

import pytest

from django_taskclaim.recovery.overdue import fail_overdue, give_back_held
from django_taskclaim.settle.transitions import Outcome
from tests.support.deadlineapp.models import TimedTask
from tests.support.testapp.models import Document

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_stuck_attempt_fails_with_timeout_error_fenced_on_its_token():
    TimedTask.objects.create()
    row = TimedTask.objects.claim(1, worker="child-0")[0]
    assert fail_overdue(TimedTask, row.pk, row.version + 1, using="default", timeout=2) is None
    assert TimedTask.objects.get(pk=row.pk).status == "processing"  # another token: untouched
    outcome = fail_overdue(TimedTask, str(row.pk), row.version, using="default", timeout=2)
    assert outcome is Outcome.READY
    after = TimedTask.objects.get(pk=row.pk)
    assert (after.status, after.attempts) == ("ready", 1)
    assert after.last_error == "TimeoutError: ran past its 2s deadline"
    assert after.version > row.version
    # Written once: the same report again finds the claim gone and writes nothing.
    assert fail_overdue(TimedTask, row.pk, row.version, using="default", timeout=2) is None


def test_the_stuck_attempt_on_its_last_attempt_ends_failed():
    TimedTask.objects.create(attempts=4)  # ClaimMeta max_attempts: the default 5
    row = TimedTask.objects.claim(1, worker="child-0")[0]
    assert fail_overdue(TimedTask, row.pk, row.version, using="default", timeout=1) is (
        Outcome.FAILED
    )
    after = TimedTask.objects.get(pk=row.pk)
    assert after.status == "failed"
    assert after.last_error.startswith("gave up after 5 attempt(s)")
    assert after.last_error.endswith("TimeoutError: ran past its 1s deadline")


def test_the_other_rows_go_back_without_losing_an_attempt():
    TimedTask.objects.bulk_create(TimedTask() for _ in range(4))
    Document.objects.create(title="other model")
    mine = TimedTask.objects.claim(3, worker="child-0")
    theirs = TimedTask.objects.claim(1, worker="child-1")[0]
    doc = Document.objects.claim(1, worker="child-0")[0]
    stuck = mine[0]
    n = give_back_held(
        "child-0", [TimedTask, Document], using="default", keep=[(TimedTask, str(stuck.pk))]
    )
    assert n == 3
    for row in [*mine[1:], doc]:
        after = type(row).objects.get(pk=row.pk)
        assert (after.status, after.attempts, after.locked_until) == ("ready", 0, None)
    assert TimedTask.objects.get(pk=stuck.pk).status == "processing"  # kept
    assert TimedTask.objects.get(pk=theirs.pk).status == "processing"  # another holder
