"""Every import path that any earlier version of the docs (README.md, docs/*.md,
CHANGELOG.md) showed still works until it is removed: a path that moved resolves to the
same object with a ``DeprecationWarning`` naming the new import; a path that did not move
resolves without one.

The table below was collected from the history of those pages (every ``from
django_taskclaim… import …`` and every public dotted name such as
``django_taskclaim.archive.archive_finished()``). Names the protocol page's table of code
locations gave for private functions (``django_taskclaim.transitions:_fenced_update``) and
module names mentioned in passing are not import paths and are not listed. No database.
"""

from __future__ import annotations

import importlib
import warnings

import pytest

from django_taskclaim.deprecation import MOVED
from tests.unit.test_public_api import _import

#: (module, name) as earlier docs showed it → where it lives now (None: it never moved).
EARLIER: dict[tuple[str, str], str | None] = {
    # package-level names
    ("django_taskclaim", "ActiveKeyField"): None,
    ("django_taskclaim", "ClaimLost"): None,
    ("django_taskclaim", "LeaseLock"): None,
    ("django_taskclaim", "SKIPPED"): None,
    ("django_taskclaim", "advisory"): None,
    ("django_taskclaim", "archive_of"): None,
    ("django_taskclaim", "concurrency_constraint"): None,
    ("django_taskclaim", "concurrency_slot"): None,
    ("django_taskclaim", "db_now"): None,
    ("django_taskclaim", "enqueue_many"): None,
    ("django_taskclaim", "is_paused"): None,
    ("django_taskclaim", "notify"): None,
    ("django_taskclaim", "outbox"): None,
    ("django_taskclaim", "pause"): None,
    ("django_taskclaim", "paused"): None,
    ("django_taskclaim", "processing_key"): None,
    ("django_taskclaim", "recover"): None,
    ("django_taskclaim", "release_worker"): None,
    ("django_taskclaim", "resume"): None,
    ("django_taskclaim", "run_task"): None,
    ("django_taskclaim", "singleton"): None,
    # paths that never moved
    ("django_taskclaim.admin", "ClaimableAdminMixin"): None,
    ("django_taskclaim.contrib.racelab.lab", "RaceLab"): None,
    ("django_taskclaim.contrib.racelab.report", "format_table"): None,
    ("django_taskclaim.contrib.tasks", "enqueue_unique"): None,
    ("django_taskclaim.contrib.tasks.models", "QueuedTask"): None,
    ("django_taskclaim.model.concurrency_keys", "concurrency_constraint"): None,
    ("django_taskclaim.model.concurrency_keys", "concurrency_slot"): None,
    ("django_taskclaim.model.concurrency_keys", "processing_key"): None,
    ("django_taskclaim.model.unique", "ActiveKeyField"): None,
    ("django_taskclaim.model.unique", "SparseUniqueConstraint"): None,
    ("django_taskclaim.models", "ClaimFieldsMixin"): None,
    ("django_taskclaim.models", "ClaimableMixin"): None,
    ("django_taskclaim.models", "ClaimableModel"): None,
    ("django_taskclaim.models", "claim_indexes"): None,
    ("django_taskclaim.ops.doctor", "diagnose"): None,
    ("django_taskclaim.ops.doctor", "Thresholds"): None,
    ("django_taskclaim.ops.figures", "db_now"): None,
    ("django_taskclaim.ops.metrics.views", "metrics_view"): None,
    ("django_taskclaim.outbox", "OutboxMessage"): None,
    ("django_taskclaim.periodic", "periodic"): None,
    ("django_taskclaim.recovery.archive", "archive_of"): None,
    ("django_taskclaim.recovery.archive", "archive_finished"): None,
    ("django_taskclaim.settle.outcome", "BatchableResult"): None,
    ("django_taskclaim.telemetry", "configure"): None,
    ("django_taskclaim.config.options", "retry_delay"): None,
    ("django_taskclaim.wakeup.notify", "notify"): None,
    ("django_taskclaim.wakeup.trigger", "sync_notify_triggers"): None,
    ("django_taskclaim.worker", "Worker"): None,
    ("django_taskclaim.worker", "WorkerConfig"): None,
    # paths that moved (django_taskclaim.deprecation.MOVED), removed in 0.2
    ("django_taskclaim.archive", "archive_of"): "django_taskclaim import archive_of",
    ("django_taskclaim.archive", "archive_finished"): (
        "django_taskclaim.recovery.archive import archive_finished"
    ),
    ("django_taskclaim.concurrency", "concurrency_constraint"): (
        "django_taskclaim import concurrency_constraint"
    ),
    (
        "django_taskclaim.concurrency",
        "concurrency_slot",
    ): "django_taskclaim import concurrency_slot",
    ("django_taskclaim.concurrency", "processing_key"): "django_taskclaim import processing_key",
    ("django_taskclaim.doctor", "diagnose"): "django_taskclaim.ops.doctor import diagnose",
    ("django_taskclaim.doctor", "Thresholds"): "django_taskclaim.ops.doctor import Thresholds",
    ("django_taskclaim.lifecycle", "BatchableResult"): (
        "django_taskclaim.settle.outcome import BatchableResult"
    ),
    ("django_taskclaim.monitoring", "db_now"): "django_taskclaim import db_now",
    ("django_taskclaim.notify", "notify"): "django_taskclaim import notify",
    ("django_taskclaim.notify_trigger", "sync_notify_triggers"): (
        "django_taskclaim.wakeup.trigger import sync_notify_triggers"
    ),
    (
        "django_taskclaim.options",
        "retry_delay",
    ): "django_taskclaim.config.options import retry_delay",
    ("django_taskclaim.unique", "ActiveKeyField"): "django_taskclaim import ActiveKeyField",
    ("django_taskclaim.unique", "SparseUniqueConstraint"): (
        "django_taskclaim.model.unique import SparseUniqueConstraint"
    ),
    ("django_taskclaim.unique", "insert_unique"): "django_taskclaim import insert_unique",
    ("django_taskclaim.unique", "UniqueKeyRaceError"): "django_taskclaim import UniqueKeyRaceError",
    ("django_taskclaim.worker", "recover"): "django_taskclaim import recover",
}


@pytest.mark.parametrize(("module", "name"), list(EARLIER))
def test_every_import_earlier_docs_showed_still_works(module, name):
    now = EARLIER[(module, name)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = getattr(_import(module), name)
    deprecations = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    if now is None:
        assert deprecations == []
        assert value is not None
        return
    assert deprecations == [
        f"{module}.{name} is deprecated: use `from {now}` ({module}.{name} is removed in 0.2)"
    ]
    home = MOVED[module][1][name]  # the module that defines it
    assert value is getattr(importlib.import_module(home), name)


def test_the_table_covers_every_moved_name():
    """Every alias of the one compatibility table is exercised above, and nothing else is."""
    moved = {(old, name) for old, (_, names) in MOVED.items() for name in names}
    assert moved == {key for key, now in EARLIER.items() if now is not None}
