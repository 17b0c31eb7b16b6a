"""PostgreSQL: the kept claim and the complete-many go as prepared statements where the
connection may prepare (Django's ``OPTIONS["prepare_threshold"]``), and the rows they
claim and complete are those of the unprepared path: same order, same fencing, result
fields written (docs/claiming.md, "Prepared statements")."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_taskclaim.settle.batch import PENDING_ATTR
from tests.support.keyedapp.models import KeyedJob
from tests.support.testapp.models import Document

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared claims: PostgreSQL"),
]


@pytest.fixture
def may_prepare():
    """The connection allows prepared statements (as OPTIONS["prepare_threshold"] does);
    put back as it was afterwards, prepared statements dropped."""
    connection.ensure_connection()
    raw = connection.connection
    before = raw.prepare_threshold
    raw.prepare_threshold = 5
    yield raw
    raw.prepare_threshold = before
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    raw._prepared.clear()  # psycopg's own record of what it prepared


def _prepared_updates() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall() if "UPDATE" in row[0]]


def _drain_one_at_a_time(done: list[str]) -> None:
    while True:
        claimed = Document.objects.claim(1, worker="prep-w")
        if not claimed:
            return
        (task,) = claimed
        task.__dict__[PENDING_ATTR] = ({"kind": f"k{task.title}"}, None)
        assert Document.objects.complete_many([task]) == []
        done.append(task.title)


def test_claims_and_completions_are_prepared_and_claim_in_order(may_prepare):
    for i, priority in enumerate((0, 5, 1, 5)):
        Document.objects.create(title=str(i), priority=priority)
    done: list[str] = []
    with CaptureQueriesContext(connection) as queries:
        _drain_one_at_a_time(done)
    assert done == ["1", "3", "2", "0"]  # priority, then age: the claim order unchanged
    assert dict(Document.objects.values_list("title", "kind")) == {
        str(i): f"k{i}" for i in range(4)
    }
    assert set(Document.objects.values_list("status", flat=True)) == {"done"}
    prepared = _prepared_updates()
    claims = [s for s in prepared if "RETURNING" in s]
    completions = [s for s in prepared if "unnest" in s or "jsonb_to_recordset" in s]
    assert claims, prepared
    assert completions, prepared
    # The claim is prepared with its values written in (planned as an unprepared claim,
    # the partial index known); the completion with parameters (rows by primary key).
    assert not any(re.search(r"\$\d", s) for s in claims), claims
    assert all(re.search(r"\$\d", s) for s in completions), completions
    # logged as any query while queries are captured
    assert sum("UPDATE" in q["sql"] for q in queries) == 4 + 4 + 1  # claims, acks, empty


def test_a_prepared_completion_is_fenced(may_prepare):
    Document.objects.create(title="x")
    (old,) = Document.objects.claim(1, worker="first")
    Document.objects.filter(pk=old.pk).update(status="ready", locked_until=None)
    (new,) = Document.objects.claim(1, worker="second")
    assert Document.objects.complete_many([old]) == [old]  # the stale token writes nothing
    assert Document.objects.get(pk=new.pk).status == "processing"
    assert Document.objects.complete_many([new]) == []
    assert Document.objects.get(pk=new.pk).status == "done"
    assert _prepared_updates()


@pytest.mark.parametrize("how", ["django's default", "behind a transaction pooler"])
def test_nothing_is_prepared_where_the_connection_may_not(how, may_prepare):
    if how == "django's default":
        may_prepare.prepare_threshold = None
    settings = {"TASKCLAIM_POOLER_MODE": "transaction"} if how != "django's default" else {}
    with override_settings(**settings):
        Document.objects.create(title="x")
        (task,) = Document.objects.claim(1, worker="w")
        assert Document.objects.complete_many([task]) == []
    assert _prepared_updates() == []
    assert Document.objects.get(pk=task.pk).status == "done"


def test_a_connection_with_execute_wrappers_sends_them_through_its_hooks(may_prepare):
    seen: list[str] = []

    def hook(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    Document.objects.create(title="x")
    with connection.execute_wrapper(hook):
        (task,) = Document.objects.claim(1, worker="w")
        assert Document.objects.complete_many([task]) == []
    assert sum("UPDATE" in sql for sql in seen) == 2
    assert _prepared_updates() == []


def test_only_the_kept_claim_is_prepared_not_a_keyed_one(may_prepare):
    """A keyed claim (a statement built per claim) goes unprepared even where the
    connection may prepare: only the worker's kept claim and its completions are."""
    KeyedJob.objects.bulk_create(KeyedJob(customer_id=i) for i in range(8))
    for _ in range(8):  # past psycopg's prepare threshold
        assert len(KeyedJob.objects.claim(1, worker="k")) == 1
    table = KeyedJob._meta.db_table
    assert [s for s in _prepared_updates() if table in s] == []
    assert KeyedJob.objects.filter(status="processing").count() == 8
