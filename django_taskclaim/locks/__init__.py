"""Locks coordinated by the database: lease locks, advisory locks and singletons.

- :class:`LeaseLock` — a row of the ``taskclaim.Lease`` table held by an owner until a
  time on the database clock, with a fencing token. Works on every supported database
  and through any connection pooler. Acquire, renew and release are one atomic
  statement each (:mod:`.lease`, its statements :mod:`.lease_sql`).
- :func:`break_lease` — expire held leases now and bump their tokens, fencing their
  holders (the admin's action; :mod:`.lease_sql`).
- :func:`advisory` — PostgreSQL advisory locks (MySQL / MariaDB ``GET_LOCK``), as a
  context manager or a decorator; transaction scope by default (:mod:`.advisory_lock`).
- :func:`singleton` — run a function only where the lock was won; skip elsewhere
  (:mod:`.singleton_lock`).
- :func:`advisory_key` — the stable string → signed int64 hash used for string keys
  (:mod:`.keys`).
- :class:`LeaseState` — what a lease lock knows, one frozen snapshot (:mod:`.state`,
  with the advisory blocks' ``Entered``); the lease renewer thread is :mod:`.renewer`.

The SQL they send is the vendor's, in :mod:`django_taskclaim.backends`. Everything is
importable from here (loaded on first use; no submodule is named like one of these
names, so importing a submodule never hides one). See ``docs/locks.md`` for which lock
fits which job.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the same names, for type checkers
    from django_taskclaim.exceptions import LockLost, LockUsageError
    from django_taskclaim.locks.advisory_lock import (
        PG_MAX_TIMEOUT,
        AdvisoryLock,
        OnFail,
        advisory,
        mysql_lock_name,
    )
    from django_taskclaim.locks.keys import (
        INT32_MAX,
        INT32_MIN,
        INT64_MAX,
        INT64_MIN,
        MAX_LEASE_KEY,
        Key,
        advisory_key,
        normalize_key,
    )
    from django_taskclaim.locks.lease import (
        MAX_TTL,
        MIN_TTL,
        LeaseLock,
        LeaseState,
        lease_lock,
    )
    from django_taskclaim.locks.lease_sql import break_lease
    from django_taskclaim.locks.renewer import MIN_RENEW_EVERY, safety_margin
    from django_taskclaim.locks.singleton_lock import SKIPPED, singleton

#: Each public name and the module that defines it, imported on first use: importing
#: ``django_taskclaim.locks.keys`` (as ``model.unique`` does) must not import the lease
#: and advisory locks, which sit above the models.
_LAZY = {
    "LockLost": "django_taskclaim.exceptions",
    "LockUsageError": "django_taskclaim.exceptions",
    "PG_MAX_TIMEOUT": "django_taskclaim.locks.advisory_lock",
    "AdvisoryLock": "django_taskclaim.locks.advisory_lock",
    "OnFail": "django_taskclaim.locks.advisory_lock",
    "advisory": "django_taskclaim.locks.advisory_lock",
    "mysql_lock_name": "django_taskclaim.locks.advisory_lock",
    "INT32_MAX": "django_taskclaim.locks.keys",
    "INT32_MIN": "django_taskclaim.locks.keys",
    "INT64_MAX": "django_taskclaim.locks.keys",
    "INT64_MIN": "django_taskclaim.locks.keys",
    "MAX_LEASE_KEY": "django_taskclaim.locks.keys",
    "Key": "django_taskclaim.locks.keys",
    "advisory_key": "django_taskclaim.locks.keys",
    "normalize_key": "django_taskclaim.locks.keys",
    "MAX_TTL": "django_taskclaim.locks.lease",
    "MIN_RENEW_EVERY": "django_taskclaim.locks.renewer",
    "MIN_TTL": "django_taskclaim.locks.lease",
    "LeaseLock": "django_taskclaim.locks.lease",
    "LeaseState": "django_taskclaim.locks.lease",
    "lease_lock": "django_taskclaim.locks.lease",
    "break_lease": "django_taskclaim.locks.lease_sql",
    "safety_margin": "django_taskclaim.locks.renewer",
    "SKIPPED": "django_taskclaim.locks.singleton_lock",
    "singleton": "django_taskclaim.locks.singleton_lock",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "INT32_MAX",
    "INT32_MIN",
    "INT64_MAX",
    "INT64_MIN",
    "MAX_LEASE_KEY",
    "MAX_TTL",
    "MIN_RENEW_EVERY",
    "MIN_TTL",
    "PG_MAX_TIMEOUT",
    "SKIPPED",
    "AdvisoryLock",
    "Key",
    "LeaseLock",
    "LeaseState",
    "LockLost",
    "LockUsageError",
    "OnFail",
    "advisory",
    "advisory_key",
    "break_lease",
    "lease_lock",
    "mysql_lock_name",
    "normalize_key",
    "safety_margin",
    "singleton",
]
