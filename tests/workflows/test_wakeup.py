"""A released dependent wakes idle workers as a new row does: one notification, after
the settle's commit, never for a row that starts waiting (PostgreSQL LISTEN/NOTIFY)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.conf import settings
from django.db import transaction

from tests.support.testapp.models import Document, Step
from tests.wakeup.test_notify_trigger import Listener

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(settings.DB_VENDOR != "postgresql", reason="NOTIFY is PostgreSQL's"),
]


@pytest.fixture
def listener() -> Iterator[Listener]:
    heard = Listener()
    yield heard
    heard.close()


def test_the_release_notifies_after_the_settle_commits(listener):
    first = Step.objects.create()
    assert listener.drain() == ["testapp.Step"]
    Document.objects.create(after=[first])
    Document.objects.enqueue_many([{"title": "b"}], after=[first])
    assert listener.drain() == []  # waiting rows wake nobody
    task = Step.objects.claim_next()
    with transaction.atomic():
        task.complete()
        assert listener.drain() == []  # not before the commit
    assert listener.drain() == ["testapp.Document"]
