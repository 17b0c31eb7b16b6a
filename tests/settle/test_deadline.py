"""Deadline rules (:mod:`django_taskclaim.settle.deadline`): where a body's deadline
comes from, how it is validated, the grace, and an atomic body rolled back past it.
In-process, real database; the worker's side is in tests/worker/test_deadlines.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings

from django_taskclaim.config import options
from django_taskclaim.exceptions import ConfigurationError
from django_taskclaim.settle.deadline import (
    deadline_error,
    grace,
    mark_overdue,
    timeout_of,
    uses_deadlines,
)
from django_taskclaim.settle.outcome import attempt
from django_taskclaim.settle.writes import format_error
from django_taskclaim.worker.config import WorkerConfig
from tests.support.deadlineapp.models import AsyncTimedTask, TimedTask
from tests.support.testapp.models import Document, Ledger


@pytest.fixture
def document_meta():
    """Set ``Document.ClaimMeta`` options for one test; put them back after."""
    changed: dict[str, object] = {}
    missing = object()

    def set_(**values: object) -> None:
        for name, value in values.items():
            changed.setdefault(name, getattr(Document.ClaimMeta, name, missing))
            setattr(Document.ClaimMeta, name, value)
        options._cache.pop(Document, None)

    yield set_
    for name, value in changed.items():
        if value is missing:
            delattr(Document.ClaimMeta, name)
        else:
            setattr(Document.ClaimMeta, name, value)
    options._cache.pop(Document, None)


def test_no_deadline_by_default():
    assert options.get_options(Document).timeout is None
    assert not uses_deadlines(Document)
    assert timeout_of(Document(title="x")) is None


def test_a_row_value_wins_over_the_model_and_null_falls_through():
    assert uses_deadlines(TimedTask)
    assert uses_deadlines(AsyncTimedTask)
    assert timeout_of(TimedTask(task_timeout=2.5)) == 2.5
    assert timeout_of(TimedTask()) == 60.0  # ClaimMeta.timeout
    assert timeout_of(AsyncTimedTask(task_timeout=timedelta(minutes=2))) == 120.0
    assert timeout_of(AsyncTimedTask()) is None  # no ClaimMeta.timeout, no setting


def test_a_bad_row_value_is_logged_and_the_models_deadline_applies(caplog):
    assert timeout_of(TimedTask(task_timeout=-1)) == 60.0
    assert timeout_of(TimedTask(task_timeout=float("nan"))) == 60.0
    assert "task_timeout must be" in caplog.text


@override_settings(TASKCLAIM_TIMEOUT=12)
def test_the_setting_is_the_project_default():
    assert options.get_options(Document).timeout == 12.0
    assert timeout_of(AsyncTimedTask()) == 12.0
    assert timeout_of(TimedTask()) == 60.0  # ClaimMeta wins


@pytest.mark.parametrize("bad", [0, -3, True, "10", float("inf"), 400 * 86400])
def test_claim_meta_timeout_is_bounded_with_one_line(document_meta, bad):
    document_meta(timeout=bad)
    with pytest.raises(ConfigurationError, match=r"testapp\.Document timeout must be"):
        options.get_options(Document).timeout  # noqa: B018
    with pytest.raises(ConfigurationError, match=r"testapp\.Document timeout must be"):
        WorkerConfig.build(["testapp.Document"])


def test_claim_meta_timeout_takes_a_timedelta(document_meta):
    document_meta(timeout=timedelta(seconds=90))
    assert options.get_options(Document).timeout == 90.0


def test_the_grace_defaults_to_the_lease_and_is_bounded():
    assert grace(30.0) == 30.0
    with override_settings(TASKCLAIM_TIMEOUT_GRACE=2):
        assert grace(30.0) == 2.0
    with override_settings(TASKCLAIM_TIMEOUT_GRACE=-1):
        with pytest.raises(ConfigurationError, match="TASKCLAIM_TIMEOUT_GRACE must be"):
            grace(30.0)
        with pytest.raises(ConfigurationError, match="TASKCLAIM_TIMEOUT_GRACE must be"):
            WorkerConfig.build(["deadlineapp.TimedTask"])
    WorkerConfig.build(["testapp.Document"])  # a model without deadlines never reads it


def test_the_failure_text():
    assert format_error(deadline_error(30)) == "TimeoutError: ran past its 30s deadline"
    assert format_error(deadline_error(0.5)) == "TimeoutError: ran past its 0.5s deadline"


@pytest.mark.django_db(transaction=True)
def test_an_atomic_body_past_its_deadline_is_rolled_back(document_meta):
    document_meta(atomic=True)
    Document.objects.create(title="atomic")
    task = Document.objects.claim(1, worker="w")[0]

    def body(row):
        Ledger.objects.create(task_id=row.pk, token=row.version, worker="effect")
        mark_overdue(row, 1.0)  # the deadline fired while it ran
        return {"result": "too late"}

    done = attempt(task, body)
    assert isinstance(done.error, TimeoutError)
    assert not Ledger.objects.filter(task_id=task.pk).exists()  # its effect rolled back
    row = Document.objects.get(pk=task.pk)
    assert (row.status, row.result, row.version) == ("processing", "", task.version)
