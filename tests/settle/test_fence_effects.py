"""What each write of the protocol does to a real row.

``protocol/actions.json`` names these tests beside the model's actions: the model's
``tok[r]++`` and its fence (token and ``processing`` re-checked) are the two things the
code must do, and each test here fails when the code stops doing one of them. A write
that settles a row moves its token, so an instance still carrying the token it was
claimed under can write nothing afterwards; and every fenced write re-checks the status,
so a write under the right token on a row that someone moved out of ``processing``
without touching the token (a raw ``UPDATE``, a data migration, an admin edit of the
status column) does not land.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from django_taskclaim import ClaimLost, reap, release_worker
from django_taskclaim.db import DbNow
from django_taskclaim.settle.transitions import give_back
from tests.support.testapp.models import Document, Ledger

pytestmark = pytest.mark.django_db(transaction=True)


def claimed(worker: str = "w1", title: str = "t") -> Document:
    Document.objects.create(title=title)
    task = Document.objects.filter(title=title).claim_next(worker=worker)
    assert task is not None
    return task


def holding(task: Document) -> Document:
    """A second instance of the claimed row, carrying the same claim token (what an
    earlier holder keeps in memory once the row has moved on)."""
    copy = Document.objects.get(pk=task.pk)
    assert (copy.version, copy.status) == (task.version, "processing")
    return copy


def state(task: Document) -> tuple[Any, ...]:
    row = Document._base_manager.get(pk=task.pk)
    return (row.status, row.version, row.attempts, row.locked_until, row.locked_by, row.result)


def fenced_ledger(task: Document) -> None:
    with task.fenced():
        Ledger.objects.create(task_id=task.pk, token=task.version, worker="late")


#: every write a holder can make once it has claimed, by name
WRITES: dict[str, Callable[[Document], Any]] = {
    "complete": lambda t: t.complete(result="late"),
    "fail": lambda t: t.fail("late"),
    "retry": lambda t: t.retry(),
    "release": lambda t: t.release(),
    "extend_lease": lambda t: t.extend_lease(600),
    "fenced": fenced_ledger,
}


def assert_token_writes_nothing(old: Document) -> None:
    """Every write of ``old`` (the token it carries is no longer the row's, or the row
    is no longer processing) raises ClaimLost and changes nothing."""
    before = state(old)
    for name, write in WRITES.items():
        with pytest.raises(ClaimLost):
            write(old)
        assert state(old) == before, f"{name} with a stale claim changed the row"
    assert Ledger.objects.filter(worker="late").count() == 0
    assert give_back(Document, [old], "default") == 0
    assert Document.objects.renew_leases([old]) == ([old], [])
    # last: a row done at exactly this token + 1 was completed under this claim, and
    # complete_many() reports such a task as completed (its instance updated)
    Document.objects.complete_many([old])
    assert state(old) == before


# -- each settling write moves the token -----------------------------------------------


def test_complete_moves_the_token_so_the_claim_cannot_write_again():
    task = claimed()
    old = holding(task)
    task.complete(result="42")
    status, version, attempts, until, _, result = state(task)
    assert (status, version, attempts, until, result) == ("done", old.version + 1, 1, None, "42")
    assert task.version == old.version + 1
    assert_token_writes_nothing(old)


def test_fail_moves_the_token_so_the_claim_cannot_write_again():
    task = claimed()
    old = holding(task)
    task.fail("boom")
    status, version, _, until, _, _ = state(task)
    assert (status, version, until) == ("failed", old.version + 1, None)
    assert task.version == old.version + 1
    assert_token_writes_nothing(old)


def test_retry_moves_the_token_so_the_claim_cannot_write_again():
    task = claimed()
    old = holding(task)
    task.retry(delay=0)
    status, version, attempts, until, _, _ = state(task)
    assert (status, version, attempts, until) == ("ready", old.version + 1, 1, None)
    assert task.version == old.version + 1
    assert_token_writes_nothing(old)


def test_release_moves_the_token_and_gives_the_attempt_back():
    task = claimed()
    old = holding(task)
    task.release()
    status, version, attempts, until, _, _ = state(task)
    assert (status, version, attempts, until) == ("ready", old.version + 1, 0, None)
    assert task.version == old.version + 1
    assert_token_writes_nothing(old)


def test_give_back_moves_each_token_and_gives_the_attempts_back():
    first, second = claimed(title="a"), claimed(title="b")
    tokens = {first.pk: first.version, second.pk: second.version}
    assert give_back(Document, [first, second], "default") == 2
    for task in (first, second):
        status, version, attempts, _, _, _ = state(task)
        assert (status, version, attempts) == ("ready", tokens[task.pk] + 1, 0)
        assert_token_writes_nothing(task)


def test_complete_many_moves_each_token_so_the_claims_cannot_write_again():
    first, second = claimed(title="a"), claimed(title="b")
    olds = [holding(first), holding(second)]
    assert Document.objects.complete_many([first, second]) == []
    for task, old in zip((first, second), olds, strict=True):
        status, version, _, until, _, _ = state(task)
        assert (status, version, until) == ("done", old.version + 1, None)
        assert task.version == old.version + 1
        assert_token_writes_nothing(old)


def test_claim_moves_the_token_counts_the_attempt_and_takes_the_lease():
    doc = Document.objects.create(title="c")
    task = Document.objects.claim_next(worker="w1")
    assert task is not None
    assert task.pk == doc.pk
    status, version, attempts, _until, holder, _ = state(task)
    assert (status, version, attempts, holder) == ("processing", doc.version + 1, 1, "w1")
    assert task.version == version
    assert Document.objects.filter(pk=doc.pk, locked_until__gt=DbNow()).exists()
    assert Document.objects.claim_next(worker="w2") is None  # one holder
    assert_token_writes_nothing(doc)  # the token the row had while ready


# -- the fence re-checks the status ----------------------------------------------------


@pytest.mark.parametrize("moved_to", ["ready", "cancelled", "done"])
@pytest.mark.parametrize("write", [*WRITES, "complete_many", "give_back", "renew_leases"], ids=str)
def test_no_write_lands_on_a_row_moved_out_of_processing_under_the_same_token(write, moved_to):
    """Someone changed the status, not the token (a raw UPDATE): the holder's fenced
    write, whichever it is, must find the row no longer held and write nothing."""
    task = claimed()
    Document._base_manager.filter(pk=task.pk).update(status=moved_to)
    before = state(task)
    assert before[:2] == (moved_to, task.version)  # same token, other status
    if write in WRITES:
        with pytest.raises(ClaimLost):
            WRITES[write](task)
    elif write == "complete_many":
        assert Document.objects.complete_many([task]) == [task]
    elif write == "give_back":
        assert give_back(Document, [task], "default") == 0
    else:
        assert Document.objects.renew_leases([task]) == ([task], [])
    assert state(task) == before
    assert Ledger.objects.count() == 0


def test_fenced_block_runs_and_commits_only_while_the_claim_holds():
    task = claimed()
    with task.fenced():
        Ledger.objects.create(task_id=task.pk, token=task.version, worker="holder")
    assert Ledger.objects.filter(worker="holder").count() == 1
    assert state(task)[:2] == ("processing", task.version)  # the lock moved nothing


# -- recovery and the operator move the token too ---------------------------------------


def expire(task: Document) -> None:
    Document._base_manager.filter(pk=task.pk).update(locked_until=DbNow() - timedelta(seconds=1))


def test_reap_takes_only_lapsed_leases_and_moves_their_tokens():
    lapsed, running = claimed(title="a"), claimed(title="b")
    old_lapsed, old_running = holding(lapsed), holding(running)
    expire(lapsed)
    assert reap(Document).requeued == 1
    assert state(lapsed)[:2] == ("ready", old_lapsed.version + 1)
    assert_token_writes_nothing(old_lapsed)
    # a lease still running is not taken: its holder still writes
    assert state(running)[:2] == ("processing", old_running.version)
    running.complete()
    assert state(running)[:2] == ("done", old_running.version + 1)


def test_reap_leaves_a_lease_that_ends_in_a_moment():
    task = claimed()
    Document._base_manager.filter(pk=task.pk).update(locked_until=DbNow() + timedelta(seconds=5))
    assert reap(Document).requeued == 0
    assert state(task)[:2] == ("processing", task.version)
    task.complete()
    assert state(task)[0] == "done"


def test_release_worker_takes_that_workers_rows_only_and_moves_their_tokens():
    gone, other = claimed("dead", title="a"), claimed("live", title="b")
    old_gone = holding(gone)
    assert release_worker("dead", Document).requeued == 1
    assert state(gone)[:2] == ("ready", old_gone.version + 1)
    assert_token_writes_nothing(old_gone)
    assert state(other)[:2] == ("processing", other.version)


def test_cancel_moves_the_token_so_the_holder_cannot_write():
    task = claimed()
    old = holding(task)
    assert Document.objects.filter(pk=task.pk).cancel() == 1
    assert state(task)[:2] == ("cancelled", old.version + 1)
    assert_token_writes_nothing(old)


def test_requeue_moves_the_token_and_resets_the_attempts():
    task = claimed()
    task.fail("boom")
    failed = Document.objects.get(pk=task.pk)
    assert Document.objects.filter(pk=task.pk).requeue() == 1
    status, version, attempts, _, _, _ = state(task)
    assert (status, version, attempts) == ("ready", failed.version + 1, 0)
    again = Document.objects.claim_next(worker="w2")
    assert again is not None
    assert again.version == failed.version + 2


def test_a_renewal_of_two_attempts_of_one_row_tells_the_earlier_one_it_is_lost():
    """An earlier attempt still held beside the row's current claim (reaped, then claimed
    again by the same worker) is lost: a renewal of both says so for the earlier one and
    renews the current one. It was compared by primary key alone, so neither was lost."""
    first = claimed(worker="w1")
    expire(first)
    assert reap(Document).requeued == 1
    second = Document.objects.claim_next(worker="w1")
    assert second is not None
    assert (second.pk, second.version > first.version) == (first.pk, True)
    assert Document.objects.renew_leases([first, second]) == ([first], [])
    assert Document.objects.extend_leases([first, second]) == [first]
    assert state(second)[:2] == ("processing", second.version)
