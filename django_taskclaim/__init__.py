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

from django_taskclaim.exceptions import (
    ClaimInTransactionError,
    ClaimLost,
    ConfigurationError,
    Fail,
    LockNotAcquired,
    NotClaimableError,
    Retry,
    StrategyNotSupportedError,
    TaskClaimError,
)

_LAZY = {
    "ClaimableModel": "django_taskclaim.mixins",
    "ClaimFieldsMixin": "django_taskclaim.mixins",
    "StatusFieldMixin": "django_taskclaim.mixins",
    "ScheduleFieldsMixin": "django_taskclaim.mixins",
    "TimestampFieldsMixin": "django_taskclaim.mixins",
    "ErrorFieldMixin": "django_taskclaim.mixins",
    "ClaimableMixin": "django_taskclaim.mixins",
    "claim_indexes": "django_taskclaim.mixins",
    "Status": "django_taskclaim.status",
    "ClaimQuerySet": "django_taskclaim.querysets",
    "ClaimQuerySetMixin": "django_taskclaim.querysets",
    "ClaimManager": "django_taskclaim.querysets",
    "reap": "django_taskclaim.reaper",
    "ReapResult": "django_taskclaim.reaper",
    "release_worker": "django_taskclaim.reaper",
    "claimable_models": "django_taskclaim.options",
    "get_options": "django_taskclaim.options",
    "run_task": "django_taskclaim.lifecycle",
    "complete_many": "django_taskclaim.lifecycle",
    "Outcome": "django_taskclaim.lifecycle",
    "Worker": "django_taskclaim.worker",
    "WorkerConfig": "django_taskclaim.worker",
    "recover": "django_taskclaim.reaper",
    "notify": "django_taskclaim.notify",
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
    "ActiveKeyField": "django_taskclaim.unique",
    "insert_unique": "django_taskclaim.unique",
    "UniqueKeyRaceError": "django_taskclaim.unique",
}

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
    "ErrorFieldMixin",
    "Fail",
    "LeaseLock",
    "LockLost",
    "LockNotAcquired",
    "LockUsageError",
    "NotClaimableError",
    "Outcome",
    "ReapResult",
    "Retry",
    "ScheduleFieldsMixin",
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
    "claim_indexes",
    "claimable_models",
    "complete_many",
    "get_options",
    "insert_unique",
    "lease_lock",
    "notify",
    "reap",
    "recover",
    "release_worker",
    "run_task",
    "singleton",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'django_taskclaim' has no attribute {name!r}")
    return getattr(import_module(module), name)
