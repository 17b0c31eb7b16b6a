"""``notify = "trigger"``: PostgreSQL wakes the workers from a trigger on the table.

Every writer — the ORM, ``bulk_create()``, ``update()``, raw SQL — makes the database send
the notification when its transaction commits; the enqueuing process sends nothing
itself (one round trip for an INSERT in autocommit). ``sync_notify_triggers()`` (run after
every ``migrate``) creates, updates and drops the triggers to match the models. A real
listening connection counts the notifications; a real worker with a one-minute poll
starts a row inserted by raw SQL.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.core import checks
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext, override_settings

from django_taskclaim.backends import for_connection
from django_taskclaim.config import options
from django_taskclaim.wakeup import trigger as notify_trigger
from django_taskclaim.wakeup.notify import notify
from django_taskclaim.wakeup.trigger import sync_notify_triggers
from tests.support.helpers import wait_for
from tests.support.testapp.models import Document
from tests.support.worker_procs import WorkerProc

pytestmark = pytest.mark.django_db(transaction=True)

LABEL = "testapp.Document"
TABLE = "testapp_document"


@pytest.fixture(autouse=True)
def _postgresql_only():
    if connection.vendor != "postgresql":
        assert sync_notify_triggers("default") == []  # nothing to do elsewhere, no error
        pytest.skip(f"triggers that notify are PostgreSQL's (running on {connection.vendor})")


def set_mode(monkeypatch: pytest.MonkeyPatch, value: Any) -> None:
    monkeypatch.setattr(Document.ClaimMeta, "notify", value, raising=False)
    options._cache.pop(Document, None)


@pytest.fixture
def trigger_mode(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    set_mode(monkeypatch, "trigger")
    assert sync_notify_triggers("default", [Document]) == [(LABEL, "created")]
    yield
    monkeypatch.undo()
    options._cache.pop(Document, None)
    assert sync_notify_triggers("default", [Document]) == [(LABEL, "dropped")]


def triggers() -> dict[str, str]:
    with connection.cursor() as cursor:
        return for_connection(connection).notify_trigger_fingerprints(cursor)


class Listener:
    """A LISTENing connection of its own; :meth:`drain` returns what arrived before a
    sentinel notification it sends itself (delivery follows commit order)."""

    def __init__(self, channel: str = "taskclaim") -> None:
        s = connection.settings_dict
        self.channel = channel
        self.conn = psycopg.connect(
            host=s["HOST"] or "127.0.0.1",
            port=int(s["PORT"] or 5432),
            user=s["USER"] or "postgres",
            dbname=s["NAME"],
            autocommit=True,
        )
        self.conn.execute(f'LISTEN "{channel}"')

    def drain(self) -> list[str]:
        # Sent from the listening session itself: delivered after everything committed
        # before it, whatever the test's own connection has open.
        self.conn.execute("SELECT pg_notify(%s, 'sentinel')", [self.channel])
        got = []
        for note in self.conn.notifies(timeout=30):
            if note.payload == "sentinel":
                return got
            got.append(note.payload)
        raise AssertionError(f"no sentinel within 30 s; got {got}")

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    heard = Listener()
    yield heard
    heard.close()


def test_sync_creates_updates_and_drops_the_trigger(monkeypatch):
    assert TABLE not in triggers()
    assert sync_notify_triggers("default", [Document]) == []  # notify=True: no trigger
    set_mode(monkeypatch, "trigger")
    assert sync_notify_triggers("default", [Document]) == [(LABEL, "created")]
    first = triggers()[TABLE]
    assert first.startswith("taskclaim ")
    assert sync_notify_triggers("default") == []  # nothing changed: nothing done
    with override_settings(TASKCLAIM_NOTIFY_CHANNEL="elsewhere"):
        assert sync_notify_triggers("default", [Document]) == [(LABEL, "updated")]
        assert triggers()[TABLE] != first
    assert sync_notify_triggers("default", [Document]) == [(LABEL, "updated")]
    assert triggers()[TABLE] == first
    set_mode(monkeypatch, False)
    assert sync_notify_triggers("default", [Document]) == [(LABEL, "dropped")]
    assert TABLE not in triggers()


@pytest.mark.usefixtures("trigger_mode")
def test_every_writer_notifies_once_per_transaction_when_it_commits(listener):
    # The ORM: one INSERT, nothing else sent by this process.
    with CaptureQueriesContext(connection) as ctx:
        Document.objects.create(title="orm")
    assert [q["sql"].split()[0] for q in ctx.captured_queries] == ["INSERT"]
    assert listener.drain() == [LABEL]
    # Raw SQL, which no post_save hook sees.
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO testapp_document (title, kind, payload, result, status, version, "
            "attempts, locked_by, priority, last_error) VALUES "
            "('raw', '', '{}', '', 'ready', 0, 0, '', 0, '')"
        )
    assert listener.drain() == [LABEL]
    # 50 rows in one transaction: one notification.
    Document.objects.bulk_create([Document(title=str(i)) for i in range(50)])
    assert listener.drain() == [LABEL]
    # Not before the commit.
    with transaction.atomic():
        Document.objects.create(title="later")
        assert listener.drain() == []
    assert listener.drain() == [LABEL]
    # Rows written in another state wake nobody; an update back to ready does.
    Document.objects.bulk_create([Document(title="held", status="processing")])
    assert listener.drain() == []
    assert Document.objects.filter(title="held").update(status="ready") == 1
    assert listener.drain() == [LABEL]
    # notify() has nothing left to send.
    assert notify(Document) is True
    assert listener.drain() == []


def test_the_post_save_hook_notifies_without_a_trigger(listener):
    """The default (``notify = True``): the hook sends it, one more statement."""
    with CaptureQueriesContext(connection) as ctx:
        Document.objects.create(title="hook")
    assert [q["sql"].split()[0] for q in ctx.captured_queries] == ["INSERT", "SELECT"]
    assert "pg_notify" in ctx.captured_queries[1]["sql"]
    assert listener.drain() == [LABEL]


@pytest.mark.slow
@pytest.mark.usefixtures("trigger_mode")
def test_an_idle_worker_starts_a_row_inserted_by_raw_sql_without_polling():
    worker = WorkerProc(
        "testapp.Document", "--poll", "600", "-v", "2", claim_meta={"notify": "trigger"}
    )
    try:
        worker.wait_started(timeout=60)
        wait_for(lambda: "listening channel=" in worker.stderr(), timeout=30, what="listener up")
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO testapp_document (title, kind, payload, result, status, version, "
                "attempts, locked_by, priority, last_error) VALUES "
                "('raw', '', '{}', '', 'ready', 0, 0, '', 0, '') RETURNING id"
            )
            (pk,) = cursor.fetchone()
        # The poll interval is ten minutes: only the trigger's notification can start it.
        wait_for(
            lambda: Document.objects.get(pk=pk).status == "done",
            timeout=30,
            what="the raw row done",
        )
    finally:
        worker.stop()
        worker.close()


def test_a_busy_table_is_skipped_with_a_warning_and_done_later(monkeypatch, caplog):
    set_mode(monkeypatch, "trigger")
    monkeypatch.setattr(notify_trigger, "LOCK_TIMEOUT", "200ms")
    s = connection.settings_dict
    with psycopg.connect(
        host=s["HOST"] or "127.0.0.1", port=int(s["PORT"] or 5432), user=s["USER"] or "postgres",
        dbname=s["NAME"],
    ) as other:  # fmt: skip
        other.execute("LOCK TABLE testapp_document IN SHARE MODE")  # writes wait; so does DDL
        changes = sync_notify_triggers("default", [Document])
    assert len(changes) == 1
    assert changes[0][1].startswith("skipped: ")
    assert "lock timeout" in changes[0][1]
    assert "notify trigger of testapp.Document not changed" in caplog.text
    assert TABLE not in triggers()
    assert sync_notify_triggers("default", [Document]) == [(LABEL, "created")]
    set_mode(monkeypatch, True)
    assert sync_notify_triggers("default", [Document]) == [(LABEL, "dropped")]


@pytest.mark.parametrize("value", ["sometimes", 1, None])
def test_a_notify_option_other_than_true_false_or_trigger_is_refused(monkeypatch, value):
    set_mode(monkeypatch, value)
    try:
        found = [e for e in checks.run_checks(tags=["taskclaim"]) if e.id == "taskclaim.E002"]
        assert any("notify must be True, False or 'trigger'" in e.msg for e in found), found
    finally:
        monkeypatch.undo()
        options._cache.pop(Document, None)


def test_the_doctor_finds_a_missing_stale_or_left_over_trigger(monkeypatch):
    from django_taskclaim.ops.doctor import diagnose

    def finding() -> Any:
        found = [f for f in diagnose([Document]) if f.id == "TC-D007"]
        return found[0] if found else None

    assert finding() is None  # notify=True, no trigger: nothing to say
    set_mode(monkeypatch, "trigger")
    assert (finding().severity, finding().title.split(",")[0]) == ("warning", "notify = 'trigger'")
    sync_notify_triggers("default", [Document])
    assert finding().severity == "ok"
    with override_settings(TASKCLAIM_NOTIFY_CHANNEL="elsewhere"):
        stale = finding()
    assert stale.severity == "warning"
    assert "another channel" in stale.title
    assert "migrate" in stale.fix
    set_mode(monkeypatch, True)
    left = finding()
    assert left.severity == "warning"
    assert "left on the table" in left.title
    sync_notify_triggers("default", [Document])
    assert finding() is None
