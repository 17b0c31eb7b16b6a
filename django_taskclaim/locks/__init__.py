"""Locks coordinated by the database: lease locks, advisory locks and singletons.

- :class:`LeaseLock` — a row of the ``taskclaim.Lease`` table held by an owner until a
  time on the database clock, with a fencing token. Works on every supported database
  and through any connection pooler. Acquire, renew and release are one atomic
  statement each (:mod:`.lease`).
- :func:`advisory` — PostgreSQL advisory locks (MySQL / MariaDB ``GET_LOCK``), as a
  context manager or a decorator; transaction scope by default (:mod:`.advisory`).
- :func:`singleton` — run a function only where the lock was won; skip elsewhere
  (:mod:`.singleton`).
- :func:`advisory_key` — the stable string → signed int64 hash used for string keys
  (:mod:`.keys`).
- :class:`LeaseState` — what a lease lock knows, one frozen snapshot (:mod:`.state`,
  with the advisory blocks' ``Entered``); the lease renewer thread is :mod:`.renewer`.

The SQL they send is the vendor's, in :mod:`django_taskclaim.backends`. Everything is
importable from here. See ``docs/locks.md`` for which lock fits which job.
"""

from __future__ import annotations

from django_taskclaim.exceptions import LockLost, LockUsageError
from django_taskclaim.locks.advisory import (
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
    MIN_RENEW_EVERY,
    MIN_TTL,
    LeaseLock,
    LeaseState,
    lease_lock,
    safety_margin,
)
from django_taskclaim.locks.singleton import SKIPPED, singleton

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
    "lease_lock",
    "mysql_lock_name",
    "normalize_key",
    "safety_margin",
    "singleton",
]
