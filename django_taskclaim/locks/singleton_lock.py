"""``@singleton``: run a function only where its lock was won; skip it elsewhere."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, Literal, TypeVar, cast

from django_taskclaim.exceptions import LockNotAcquired, LockUsageError
from django_taskclaim.locks.advisory_lock import AdvisoryLock
from django_taskclaim.locks.keys import dotted_path, normalize_key, validate_lease_key
from django_taskclaim.locks.lease import LeaseLock, validate_ttl

logger = logging.getLogger("django_taskclaim.locks")

F = TypeVar("F", bound=Callable[..., Any])


class _Skipped:
    """The value a :func:`singleton` function returns where it did not run."""

    _instance: _Skipped | None = None

    def __new__(cls) -> _Skipped:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "SKIPPED"


#: Returned by a :func:`singleton` function that was skipped (falsy; compare with ``is``).
SKIPPED = _Skipped()


def singleton(
    key: Any = None,
    *,
    ttl: float | None = None,
    backend: Literal["lease", "advisory"] = "lease",
    using: str | None = None,
    xact: bool = True,
) -> Any:
    """Decorate a function so it runs only where the lock on ``key`` was won.

    Where the lock is held elsewhere the call is skipped: it returns :data:`SKIPPED`
    (falsy) and logs ``singleton skipped key=… backend=…`` at INFO. ``key`` defaults to
    the function's dotted path.

    - ``backend="lease"`` (default, every database, any pooler): a :class:`LeaseLock`
      of ``ttl`` seconds (default ``TASKCLAIM_LEASE``), renewed in the background while
      the function runs, released when it returns. If the lease is lost meanwhile the
      call raises :class:`LockLost` after the function returns.
    - ``backend="advisory"`` (PostgreSQL, MySQL/MariaDB): a non-waiting
      :func:`advisory` lock, transaction scope unless ``xact=False``; ``ttl`` unused.

    A bad ``backend``, ``ttl`` or key raises :class:`LockUsageError`, an ``xact`` that is
    not a bool ``TypeError``, when the function is decorated.
    """
    ttl = _checked(key, ttl=ttl, backend=backend, xact=xact)

    def decorate(func: F) -> F:
        name = key if key is not None else dotted_path(func)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if backend == "lease":
                lock = LeaseLock(name, ttl, using=using, auto_renew=True)
                return _run_leased(lock, name, func, args, kwargs)
            with AdvisoryLock(name, xact=xact, wait=False, using=using, on_fail="return") as got:
                if not got:
                    _log_skip(name, backend)
                    return SKIPPED
                return func(*args, **kwargs)

        return cast(F, wrapper)

    if callable(key):  # bare ``@singleton``
        func, key = key, None
        return decorate(func)
    return decorate


def _checked(key: Any, *, ttl: float | None, backend: str, xact: Any) -> float | None:
    """Refuse a bad ``xact`` (``TypeError``), ``backend``, ``ttl`` or key
    (:class:`LockUsageError`) of :func:`singleton`; the ttl it takes, in seconds (a lease's;
    as given for an advisory lock)."""
    if not isinstance(xact, bool):
        raise TypeError(f"singleton(xact=...) is True or False, got {xact!r}")
    if backend not in ("lease", "advisory"):
        raise LockUsageError(f'singleton backend is "lease" or "advisory", got {backend!r}')
    if backend == "lease":
        ttl = validate_ttl(ttl)
        if key is not None and not callable(key):
            validate_lease_key(key)
    elif key is not None and not callable(key):
        normalize_key(key)
    return ttl


def _run_leased(
    lock: LeaseLock, name: Any, func: Callable[..., Any], args: Any, kwargs: Any
) -> Any:
    """``func(*args, **kwargs)`` under ``lock`` (:data:`SKIPPED` where it is held
    elsewhere); the lock's exit sees the function's exception, if any."""
    try:
        lock.__enter__()
    except LockNotAcquired:
        _log_skip(name, "lease")
        return SKIPPED
    try:
        result = func(*args, **kwargs)
    except BaseException as exc:
        lock.__exit__(type(exc), exc, exc.__traceback__)
        raise
    lock.__exit__(None, None, None)
    return result


def _log_skip(key: Any, backend: str) -> None:
    logger.info("singleton skipped key=%s backend=%s reason=held-elsewhere", key, backend)
