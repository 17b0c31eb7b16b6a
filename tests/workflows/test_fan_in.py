"""Fan-in: a row waiting for many others keeps one counter row (``TaskFanIn``), updated
in each prerequisite's settle; the settle that brings it to zero releases the row, and
what a settle reads does not grow with the number of prerequisites (docs/workflows.md,
"Fan-in")."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_taskclaim import FanIn, fan_in, prerequisites
from django_taskclaim.models import TaskDependency, TaskFanIn
from tests.support.testapp.models import Document, Step

pytestmark = pytest.mark.django_db(transaction=True)


def settle(step: Step, how: str) -> None:
    task = Step.objects.filter(pk=step.pk).claim_next()
    assert task is not None
    if how == "done":
        task.complete()
    else:
        task.fail("member broke")


def test_the_counter_follows_every_settle_and_the_last_one_releases():
    members = Step.objects.enqueue_many([{"name": f"m{i}"} for i in range(5)])
    join = Document.objects.create(title="join", after=members, on_failure="run")
    assert fan_in(join) == FanIn(total=5, open=5, done=0, failed=0, cancelled=0, released=False)
    for i, (member, how) in enumerate(
        zip(members, ["done", "failed", "done", "done"], strict=False)
    ):
        settle(member, how)
        counts = fan_in(join)
        assert counts is not None
        assert counts.open == 4 - i
        assert not counts.released
        assert Document.objects.get(pk=join.pk).status == "waiting"
    assert Step.objects.filter(pk=members[4].pk).cancel() == 1  # an operator's cancel
    assert fan_in(join) == FanIn(total=5, open=0, done=3, failed=1, cancelled=1, released=True)
    row = Document.objects.get(pk=join.pk)
    assert (row.status, row.version) == ("ready", 1)  # released once
    # The members' outcomes, one by one, for the callback's body:
    assert [e.prerequisite_pk for e in prerequisites(row, "failed")] == [str(members[1].pk)]
    assert len(prerequisites(row)) == 5
    assert fan_in(Document.objects.create(title="plain")) is None


def test_a_settle_again_of_a_requeued_member_counts_nothing():
    members = Step.objects.enqueue_many([{"name": "a"}, {"name": "b"}])
    join = Document.objects.create(title="join", after=members)
    settle(members[0], "done")
    Step.objects.filter(pk=members[0].pk).update(status="ready")  # requeued by hand
    settle(members[0], "done")
    assert fan_in(join) == FanIn(total=2, open=1, done=1, failed=0, cancelled=0, released=False)
    settle(members[1], "done")
    counts = fan_in(join)
    assert counts is not None
    assert (counts.open, counts.done, counts.released) == (0, 2, True)


def test_a_held_edge_stays_open_and_a_requeued_prerequisite_releases_it():
    members = Step.objects.enqueue_many([{"name": "a"}, {"name": "b"}])
    join = Document.objects.create(title="join", after=members, on_failure="hold")
    settle(members[0], "failed")
    assert fan_in(join) == FanIn(total=2, open=2, done=0, failed=0, cancelled=0, released=False)
    settle(members[1], "done")
    Step.objects.filter(pk=members[0].pk).update(status="ready")  # the operator requeues it
    settle(members[0], "done")
    assert fan_in(join) == FanIn(total=2, open=0, done=2, failed=0, cancelled=0, released=True)
    assert Document.objects.get(pk=join.pk).status == "ready"


def test_prerequisites_already_settled_at_enqueue_are_counted():
    done, failed, open_ = Step.objects.enqueue_many([{"name": n} for n in "abc"])
    settle(done, "done")
    settle(failed, "failed")
    join = Document.objects.create(title="join", after=[done, failed, open_], on_failure="run")
    assert fan_in(join) == FanIn(total=3, open=1, done=1, failed=1, cancelled=0, released=False)
    ready = Document.objects.create(title="ready", after=[done])
    assert fan_in(ready) == FanIn(total=1, open=0, done=1, failed=0, cancelled=0, released=True)
    assert Document.objects.get(pk=ready.pk).status == "ready"


def test_a_large_fan_in_is_written_in_chunks_and_released_once():
    """More prerequisites than SQLite binds in one statement (32,766 parameters)."""
    members = Step.objects.bulk_create([Step(name=f"m{i}") for i in range(3000)], batch_size=500)
    if members[0].pk is None:  # MySQL's bulk insert returns no keys
        members = list(Step.objects.order_by("pk"))
    join = Document.objects.create(title="join", after=members)
    assert TaskDependency.objects.count() == 3000
    Step.objects.update(status="done")  # settled by hand: their edges stay open...
    settle_last = members[-1]
    Step.objects.filter(pk=settle_last.pk).update(status="ready")
    settle(settle_last, "done")  # ...so one settle closes one edge
    counts = fan_in(join)
    assert counts is not None
    assert (counts.open, counts.done) == (2999, 1)


def _statements_of_one_settle(size: int) -> tuple[int, int]:
    """(statements, edge rows the database read) of the settle of one member of a fan-in
    of ``size`` whose other members are still open."""
    members = Step.objects.bulk_create([Step(name=f"m{i}") for i in range(size)])
    if members[0].pk is None:
        members = list(Step.objects.order_by("-pk")[:size])[::-1]
    Document.objects.create(title=f"join of {size}", after=members)
    task = Step.objects.filter(pk=members[0].pk).claim_next()
    assert task is not None
    read = 0
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        task.complete()
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                table = TaskDependency._meta.db_table
                cursor.execute(
                    "SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) "
                    "FROM pg_stat_xact_user_tables WHERE relname = %s",
                    [table],
                )
                found = cursor.fetchone()
                read = int(found[0]) if found else 0
    return len(queries) - (1 if connection.vendor == "postgresql" else 0), read


def test_a_members_settle_costs_the_same_for_ten_members_or_a_thousand():
    """The statements of a member's settle are the same for a fan-in of 10 and of 1,000,
    and (PostgreSQL, which counts them per transaction) the edge rows it reads do not
    grow with the open members: a settle that counted the open edges would read 999."""
    small = _statements_of_one_settle(10)
    large = _statements_of_one_settle(1000)
    assert small[0] == large[0]
    if connection.vendor == "postgresql":
        # a few index entries (and versions left by the earlier updates), never the 999
        assert large[1] < 50, (small, large)


def test_the_admin_page_of_a_large_fan_in_counts_and_names_a_few(admin_client):
    members = Step.objects.enqueue_many([{"name": f"m{i}"} for i in range(30)])
    settle(members[0], "done")
    join = Document.objects.create(title="join", after=members)
    text = admin_client.get(reverse("admin:testapp_document_change", args=[join.pk]))
    page = text.content.decode()
    assert "29 of 30 open (1 done)" in page
    assert f"testapp.Step #{members[1].pk}" in page
    assert f"testapp.Step #{members[29].pk}" not in page  # past the first 20
    assert "(9 more)" in page
    assert TaskFanIn.objects.get().total == 30


def test_the_doctor_names_waiting_rows_no_settle_will_release():
    from django_taskclaim.ops.doctor import diagnose

    gone, hand, held_on, fine = Step.objects.enqueue_many([{"name": n} for n in "abcd"])
    a = Document.objects.create(title="a", after=[gone])
    b = Document.objects.create(title="b", after=[hand])
    c = Document.objects.create(title="c", after=[held_on], on_failure="hold")
    Document.objects.create(title="d", after=[fine])  # waits, as it should
    Step.objects.filter(pk=gone.pk).delete()  # deleted by hand
    Step.objects.filter(pk=hand.pk).update(status="done")  # written outside the library
    settle(held_on, "failed")
    [found] = [f for f in diagnose([Document]) if f.id == "TC-D025"]
    assert found.severity == "warning"
    assert found.title == (
        "2 waiting row(s) no settle will release, 1 held for an operator (on_failure='hold')"
    )
    assert f"#{a.pk}: prerequisite testapp.Step #{gone.pk} is gone" in found.detail
    assert f"#{b.pk}: prerequisite testapp.Step #{hand.pk} ended done without" in found.detail
    assert f"#{c.pk}: held: prerequisite testapp.Step #{held_on.pk} ended failed" in found.detail
    [plain] = [f for f in diagnose([Step]) if f.id == "TC-D025"]
    assert (plain.severity, plain.title) == ("ok", "no waiting row is stuck")


def test_pruning_finished_rows_deletes_what_the_workflow_tables_kept_of_them():
    from datetime import timedelta

    from django_taskclaim.models import TaskStep
    from django_taskclaim.recovery.prune import prune

    members = Step.objects.enqueue_many([{"name": n} for n in "ab"])
    join = Document.objects.create(title="join", after=members, on_failure="hold")
    held = Document.objects.create(title="held", after=[members[1]], on_failure="hold")
    settle(members[0], "done")
    task = Step.objects.filter(pk=members[1].pk).claim_next()
    task.step("kept while it runs", lambda: 1)
    task.fail("broke")
    assert TaskStep.objects.count() == 1
    Step.objects.update(finished_at=Now() - timedelta(days=30))
    assert prune(Step, older_than=timedelta(days=7), states=("done", "failed")) == 2
    assert not TaskStep.objects.exists()
    # closed edges from the pruned rows are gone; the open (held) ones stay, for the doctor
    assert list(TaskDependency.objects.values_list("dependent_pk", "outcome")) == [
        (str(join.pk), ""),
        (str(held.pk), ""),
    ]
    Document.objects.filter(pk__in=[join.pk, held.pk]).update(
        status="cancelled", finished_at=Now() - timedelta(days=30)
    )
    assert prune(Document, older_than=timedelta(days=7)) == 2
    assert not TaskDependency.objects.exists()
    assert not TaskFanIn.objects.exists()
