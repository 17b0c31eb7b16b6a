"""The fenced lifecycle at its seams: what ``fenced(complete=True)`` writes, ``fenced()``
under a busy SQLite database, and the fields no completion may write (the primary key,
the claim bookkeeping)."""

from __future__ import annotations

import json
import subprocess
import threading
from collections import Counter
from pathlib import Path

import pytest
from django.db import OperationalError, connection, connections, transaction

from django_taskclaim import ClaimLost
from django_taskclaim.settle.batch import PENDING_ATTR, BatchableResult, complete_many
from django_taskclaim.settle.outcome import run_task
from django_taskclaim.settle.transitions import complete_pending
from tests.support.helpers import PYTHON, child_env, wait_for
from tests.support.testapp.models import (
    CharKeyTask,
    ColumnTask,
    Document,
    Ledger,
    ResultTypes,
    UUIDTask,
)

pytestmark = pytest.mark.django_db(transaction=True)


# -- 1. fenced(complete=True) writes the fields the block set -----------------------------
# The exactly-once pattern of docs/lifecycle.md, verbatim, on a model with a ``text``
# result field; ``Page`` is the test app's effect table.
Page = Ledger


def extract(path):
    return f"words of {path}"


def split(text):
    return [Page(task_id=0, token=0, worker=word) for word in text.split()]


def process(self):
    text = extract(self.path)  # no database writes yet
    with self.fenced(complete=True):  # one transaction:
        Page.objects.bulk_create(split(text))  #   your writes
        self.text = text  #   and result fields


@pytest.fixture
def with_path(monkeypatch):
    """``ResultTypes`` rows get the ``path`` the documented example reads."""
    monkeypatch.setattr(
        ResultTypes, "path", property(lambda self: f"/docs/{self.pk}.pdf"), raising=False
    )


def test_documented_exactly_once_example_saves_what_the_block_set(with_path):
    ResultTypes.objects.create()
    (task,) = ResultTypes.objects.claim(1)
    assert run_task(task, process) == "done"
    row = ResultTypes.objects.get(pk=task.pk)
    assert (row.status, row.text) == ("done", f"words of /docs/{task.pk}.pdf")
    assert row.version == task.version  # one completion, the instance in step with it
    assert Page.objects.count() == 3


def test_fenced_complete_writes_changed_fields_in_the_completion_statement():
    ResultTypes.objects.create(text="before", data={"a": 1})
    (task,) = ResultTypes.objects.claim(1)
    statements: list[str] = []

    def spy(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    with task.fenced(complete=True), connection.execute_wrapper(spy):
        task.text = "after"
        task.number = 7
        task.data["b"] = 2  # changed in place, not reassigned
    row = ResultTypes.objects.get(pk=task.pk)
    assert (row.status, row.text, row.number, row.data) == ("done", "after", 7, {"a": 1, "b": 2})
    assert (row.flag, row.amount) == (None, None)  # untouched fields stay as they were
    assert statements == []  # nothing written in the block itself: all by the completion


def test_fenced_complete_block_that_raises_writes_none_of_its_fields():
    ResultTypes.objects.create(text="before")
    (task,) = ResultTypes.objects.claim(1)

    def body():
        with task.fenced(complete=True):
            task.text = "after"
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        body()
    row = ResultTypes.objects.get(pk=task.pk)
    assert (row.status, row.text, task.text) == ("processing", "before", "before")


def test_fenced_complete_that_changes_the_primary_key_is_refused_and_writes_nothing():
    ResultTypes.objects.create()
    (task,) = ResultTypes.objects.claim(1)
    pk = task.pk

    def body():
        with task.fenced(complete=True):
            Ledger.objects.create(task_id=pk, token=task.version, worker="w")
            task.text = "after"
            task.id = pk + 1000

    with pytest.raises(ValueError, match="'id'"):
        body()
    assert not Ledger.objects.exists()
    assert task.pk == pk  # the instance as it was on entry
    row = ResultTypes.objects.get(pk=pk)
    assert (row.status, row.text) == ("processing", "")
    assert ResultTypes.objects.count() == 1


@pytest.mark.parametrize(
    ("field", "value"),
    [("attempts", 0), ("locked_by", "someone"), ("last_error", "x"), ("version", 0)],
)
def test_fenced_complete_that_changes_claim_bookkeeping_is_refused(field, value):
    ResultTypes.objects.create()
    (task,) = ResultTypes.objects.claim(1)

    def body():
        with task.fenced(complete=True):
            task.text = "after"
            setattr(task, field, value)

    with pytest.raises(ValueError, match=f"'{field}'"):
        body()
    row = ResultTypes.objects.get(pk=task.pk)
    assert (row.status, row.text) == ("processing", "")


def test_fenced_complete_allows_a_lease_extension_in_the_block():
    ResultTypes.objects.create()
    (task,) = ResultTypes.objects.claim(1)
    with task.fenced(complete=True):
        task.extend_lease(60)
        task.refresh_from_db()
        task.text = "after"
    row = ResultTypes.objects.get(pk=task.pk)
    assert (row.status, row.text, row.locked_until) == ("done", "after", None)


def test_fenced_complete_lost_claim_writes_nothing():
    ResultTypes.objects.create()
    (task,) = ResultTypes.objects.claim(1)
    ResultTypes.objects.filter(pk=task.pk).update(version=task.version + 5)
    with pytest.raises(ClaimLost), task.fenced(complete=True):
        task.text = "after"  # never runs
    assert ResultTypes.objects.get(pk=task.pk).text == ""


# -- 3. result fields never include the primary key or the claim fields ------------------
def test_complete_refuses_the_primary_key_before_writing():
    Document.objects.create(title="a")
    (task,) = Document.objects.claim(1)
    pk, token = task.pk, task.version
    with pytest.raises(ValueError, match=r"'id' is the primary key"):
        task.complete(id=pk + 1000, result="r")
    with pytest.raises(ValueError, match=r"'pk' is the primary key"):
        task.complete(pk=pk + 1000)
    row = Document.objects.get(pk=pk)
    assert (row.status, row.version, row.result) == ("processing", token, "")
    assert not Document.objects.filter(pk=pk + 1000).exists()
    task.complete(result="r")  # the claim is intact
    assert Document.objects.get(pk=pk).status == "done"


@pytest.mark.parametrize(
    ("model", "field"),
    [(CharKeyTask, "key"), (UUIDTask, "id"), (ColumnTask, "id")],
)
def test_complete_refuses_other_primary_keys(model, field):
    if model is CharKeyTask:
        model.objects.create(key="k1")
    else:
        model.objects.create()
    (task,) = model.objects.claim(1)
    with pytest.raises(ValueError, match=rf"'{field}' is the primary key"):
        task.complete(**{field: "k2" if model is CharKeyTask else task.pk})
    assert model.objects.get(pk=task.pk).status == "processing"


@pytest.mark.parametrize(
    "field", ["status", "version", "locked_until", "locked_by", "attempts", "finished_at"]
)
def test_complete_fail_and_retry_refuse_claim_fields(field):
    Document.objects.create(title="a")
    (task,) = Document.objects.claim(1)
    for write in (task.complete, task.fail, task.retry):
        with pytest.raises(ValueError, match=f"'{field}'"):
            write(**{field: None})
    assert Document.objects.get(pk=task.pk).status == "processing"


def test_fail_and_retry_refuse_the_primary_key():
    Document.objects.create(title="a")
    (task,) = Document.objects.claim(1)
    with pytest.raises(ValueError, match="'id'"):
        task.fail("x", id=task.pk + 1000)
    with pytest.raises(ValueError, match="'id'"):
        task.retry(id=task.pk + 1000)
    assert Document.objects.get(pk=task.pk).status == "processing"


def test_deferred_result_naming_the_primary_key_is_not_deferred_but_retried():
    Document.objects.create(title="a")
    (task,) = Document.objects.claim(1)
    pk = task.pk
    deferred: list = []
    outcome = run_task(task, lambda t: BatchableResult({"id": pk + 1000}), defer=deferred.append)
    assert (outcome, deferred) == ("ready", [])
    row = Document.objects.get(pk=pk)
    assert "'id' is the primary key" in row.last_error
    assert not Document.objects.filter(pk=pk + 1000).exists()


def test_complete_many_refuses_a_pending_primary_key_before_writing_any_row():
    Document.objects.bulk_create([Document(title=str(i)) for i in range(3)])
    tasks = Document.objects.claim(3)
    bad = tasks[-1]
    bad.__dict__[PENDING_ATTR] = ({"id": bad.pk + 1000}, None)
    with pytest.raises(ValueError, match=r"'id' is the primary key"):
        complete_many(tasks)
    assert sorted(Document.objects.values_list("status", flat=True)) == ["processing"] * 3
    assert not Document.objects.filter(pk=bad.pk + 1000).exists()
    with pytest.raises(ValueError, match="'id'"):
        complete_pending(bad)
    assert Document.objects.get(pk=bad.pk).status == "processing"


def test_complete_many_refuses_pending_claim_fields():
    Document.objects.create(title="a")
    (task,) = Document.objects.claim(1)
    task.__dict__[PENDING_ATTR] = ({"attempts": 0}, None)
    with pytest.raises(ValueError, match="'attempts'"):
        complete_many([task])
    assert Document.objects.get(pk=task.pk).status == "processing"


# -- 2. fenced() under a busy SQLite database: 4 processes, one file ---------------------
CHILD = r"""
import json, os, sys
import django

go, out, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
django.setup()
from django.conf import settings
from django.db import connection

# A short busy timeout: a writer waiting for the lock gets "database is locked" quickly.
connection.settings_dict["OPTIONS"]["timeout"] = timeout
settings.TASKCLAIM_DB_RETRIES = 1000
from tests.support.helpers import simulate_work, wait_for
from tests.support.testapp.models import Document, Ledger

open(out + ".ready", "w").close()  # set up: the test starts everyone at once
wait_for(lambda: os.path.exists(go), timeout=120, interval=0.005, what="go")
me, done, errors = f"p{os.getpid()}", [], []
while True:
    task = Document.objects.claim_next()
    if task is None:
        break
    try:
        with task.fenced(complete=True):
            Ledger.objects.create(task_id=task.pk, token=task.version, worker=me)
            simulate_work(0.02)  # holds the database write lock meanwhile
        done.append(task.pk)
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
with open(out, "w") as f:
    json.dump({"done": done, "errors": errors}, f)
"""


def test_fenced_waits_for_the_sqlite_write_lock_across_processes(tmp_path):
    if connection.vendor != "sqlite":
        pytest.skip("the busy database of SQLite (one writer at a time)")
    n, procs = 80, 4
    Document.objects.bulk_create([Document(title=str(i)) for i in range(n)])
    go = tmp_path / "go"
    outs = [tmp_path / f"out{i}.json" for i in range(procs)]
    children = [
        subprocess.Popen(
            [PYTHON, "-c", CHILD, str(go), str(out), "0.01"],
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for out in outs
    ]
    try:
        # All children set up before any starts: else the first one up drains the rows
        # alone and nothing contends for the write lock.
        wait_for(
            lambda: all(Path(f"{o}.ready").exists() or c.poll() is not None
                        for o, c in zip(outs, children, strict=True)),
            timeout=120,
            what="every child set up",
        )  # fmt: skip
        go.touch()
        logs = [c.communicate(timeout=300)[0] for c in children]
    finally:
        for c in children:
            if c.poll() is None:
                c.kill()
                c.communicate()
    assert [c.returncode for c in children] == [0] * procs, logs
    wait_for(lambda: all(o.exists() for o in outs), what="children's reports")
    reports = [json.loads(o.read_text()) for o in outs]
    errors = [e for r in reports for e in r["errors"]]
    assert errors == [], errors[:5]
    done = [pk for r in reports for pk in r["done"]]
    assert sorted(done) == sorted(Document.objects.values_list("pk", flat=True))
    assert sorted(Document.objects.values_list("status", flat=True)) == ["done"] * n
    effects = Counter(Ledger.objects.values_list("task_id", flat=True))
    assert len(effects) == n
    assert set(effects.values()) == {1}  # each block's effect landed exactly once
    assert len({w for w in Ledger.objects.values_list("worker", flat=True)}) > 1


def test_fenced_gives_up_on_a_busy_sqlite_database_with_a_clear_error(settings):
    if connection.vendor != "sqlite":
        pytest.skip("the busy database of SQLite (one writer at a time)")
    Document.objects.create(title="a")
    (task,) = Document.objects.claim(1)
    locked, release = threading.Event(), threading.Event()

    def holder():  # another connection holds the database's write lock
        try:
            with transaction.atomic():
                Ledger.objects.create(task_id=0, token=0, worker="holder")
                locked.set()
                release.wait(60)
        finally:
            connections.close_all()

    def body():
        with task.fenced(complete=True):
            Ledger.objects.create(task_id=task.pk, token=task.version, worker="body")

    settings.TASKCLAIM_DB_RETRIES = 2
    thread = threading.Thread(target=holder)
    thread.start()
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA busy_timeout = 20")
    try:
        wait_for(locked.is_set, what="the other connection's write lock")
        with pytest.raises(OperationalError, match=r"stayed busy.*gave up after 3 tries"):
            body()
    finally:
        release.set()
        thread.join(60)
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA busy_timeout = 20000")
    assert Document.objects.get(pk=task.pk).status == "processing"
    assert list(Ledger.objects.values_list("worker", flat=True)) == ["holder"]
    body()  # the lock free again, the same block runs
    assert Document.objects.get(pk=task.pk).status == "done"
