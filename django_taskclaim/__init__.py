"""django-taskclaim: the rows of your own Django model as a safe, fenced work queue.

The public API is flat: everything documented is importable from ``django_taskclaim``.
Model-related names are loaded lazily so that importing the package never touches
the app registry.
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import Any

try:
    __version__ = version("django-taskclaim")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"

from django_taskclaim.deprecation import install as _install_moved_modules
from django_taskclaim.exceptions import (
    ClaimInTransactionError,
    ClaimLost,
    ConfigurationError,
    DependencyError,
    EventTimeout,
    Fail,
    LockNotAcquired,
    NotClaimableError,
    Parked,
    Retry,
    Snooze,
    StrategyNotSupportedError,
    TaskClaimError,
)

_LAZY = {
    "ClaimableModel": "django_taskclaim.model.mixins",
    "ClaimFieldsMixin": "django_taskclaim.model.mixins",
    "StatusFieldMixin": "django_taskclaim.model.mixins",
    "ScheduleFieldsMixin": "django_taskclaim.model.mixins",
    "TimestampFieldsMixin": "django_taskclaim.model.mixins",
    "ErrorFieldMixin": "django_taskclaim.model.mixins",
    "ClaimableMixin": "django_taskclaim.model.mixins",
    "claim_indexes": "django_taskclaim.model.indexes",
    "Status": "django_taskclaim.row.status",
    "ClaimQuerySet": "django_taskclaim.model.queryset",
    "ClaimQuerySetMixin": "django_taskclaim.model.queryset",
    "ClaimManager": "django_taskclaim.model.queryset",
    "reap": "django_taskclaim.recovery.reap",
    "ReapResult": "django_taskclaim.recovery.reap",
    "release_worker": "django_taskclaim.recovery.reap",
    "claimable_models": "django_taskclaim.config.discovery",
    "get_options": "django_taskclaim.config.options",
    "run_task": "django_taskclaim.settle.outcome",
    "complete_many": "django_taskclaim.settle.batch",
    "Outcome": "django_taskclaim.settle.transitions",
    "Worker": "django_taskclaim.worker",
    "WorkerConfig": "django_taskclaim.worker",
    "recover": "django_taskclaim.recovery.reap",
    "notify": "django_taskclaim.wakeup.notify",
    "DbNow": "django_taskclaim.db",
    "db_now": "django_taskclaim.db",
    # concurrency keys and archives (model building)
    "concurrency_constraint": "django_taskclaim.model.concurrency_keys",
    "concurrency_slot": "django_taskclaim.model.concurrency_keys",
    "processing_key": "django_taskclaim.model.concurrency_keys",
    "archive_of": "django_taskclaim.recovery.archive",
    # locks
    "LeaseLock": "django_taskclaim.locks",
    "lease_lock": "django_taskclaim.locks",
    "advisory": "django_taskclaim.locks",
    "advisory_key": "django_taskclaim.locks",
    "singleton": "django_taskclaim.locks",
    "SKIPPED": "django_taskclaim.locks",
    "LockLost": "django_taskclaim.locks",
    "LockUsageError": "django_taskclaim.locks",
    # unique enqueue
    "ActiveKeyField": "django_taskclaim.model.unique",
    "insert_unique": "django_taskclaim.model.unique_insert",
    "UniqueKeyRaceError": "django_taskclaim.model.unique_insert",
    # bulk enqueue
    "enqueue_many": "django_taskclaim.model.enqueue",
    # workflows
    "FanIn": "django_taskclaim.settle.dependents",
    "fan_in": "django_taskclaim.settle.dependents",
    "prerequisites": "django_taskclaim.settle.dependents",
    "emit": "django_taskclaim.settle.events",
    # flow control
    "pause": "django_taskclaim.flow.pause",
    "resume": "django_taskclaim.flow.pause",
    "paused": "django_taskclaim.flow.pause",
    "is_paused": "django_taskclaim.flow.pause",
}

_install_moved_modules(_LAZY)  # the module paths earlier docs showed (deprecation.MOVED)

__all__ = [
    "SKIPPED",
    "ActiveKeyField",
    "ClaimFieldsMixin",
    "ClaimInTransactionError",
    "ClaimLost",
    "ClaimManager",
    "ClaimQuerySet",
    "ClaimQuerySetMixin",
    "ClaimableMixin",
    "ClaimableModel",
    "ConfigurationError",
    "DbNow",
    "DependencyError",
    "ErrorFieldMixin",
    "EventTimeout",
    "Fail",
    "FanIn",
    "LeaseLock",
    "LockLost",
    "LockNotAcquired",
    "LockUsageError",
    "NotClaimableError",
    "Outcome",
    "Parked",
    "ReapResult",
    "Retry",
    "ScheduleFieldsMixin",
    "Snooze",
    "Status",
    "StatusFieldMixin",
    "StrategyNotSupportedError",
    "TaskClaimError",
    "TimestampFieldsMixin",
    "UniqueKeyRaceError",
    "Worker",
    "WorkerConfig",
    "__version__",
    "advisory",
    "advisory_key",
    "archive_of",
    "claim_indexes",
    "claimable_models",
    "complete_many",
    "concurrency_constraint",
    "concurrency_slot",
    "db_now",
    "emit",
    "enqueue_many",
    "fan_in",
    "get_options",
    "insert_unique",
    "is_paused",
    "lease_lock",
    "notify",
    "pause",
    "paused",
    "prerequisites",
    "processing_key",
    "reap",
    "recover",
    "release_worker",
    "resume",
    "run_task",
    "singleton",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'django_taskclaim' has no attribute {name!r}")
    return getattr(import_module(module), name)
