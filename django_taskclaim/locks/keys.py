"""Lock keys: the string → signed int64 hash, advisory-key and lease-key validation."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from django_taskclaim.exceptions import LockUsageError

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
#: Longest lease key (the ``Lease.key`` column is ``varchar(255)``).
MAX_LEASE_KEY = 255

Key = int | str | tuple[int, int]


def advisory_key(name: str) -> int:
    """Return the signed 64-bit lock key of the string ``name``.

    Stable across processes, machines and Python versions: the first 8 bytes of the MD5
    digest of the UTF-8 encoded name, read as a big-endian signed integer. The same
    number is computed in PostgreSQL by
    ``SELECT ('x' || substr(md5(name), 1, 16))::bit(64)::bigint`` (database encoding
    UTF8), so a lock taken with ``advisory("name")`` can be found in ``pg_locks``.
    """
    if not isinstance(name, str):
        raise LockUsageError(f"advisory_key() needs a string, got {type(name).__name__}")
    if not name:
        raise LockUsageError("a lock key must not be empty")
    digest = hashlib.md5(name.encode("utf-8"), usedforsecurity=False).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def normalize_key(key: object) -> tuple[int] | tuple[int, int]:
    """Validate ``key`` and return it as ``(int64,)`` or ``(int32, int32)``.

    Strings are hashed with :func:`advisory_key`. Raises :class:`LockUsageError` for an
    empty string, a number out of range or any other type.
    """
    if isinstance(key, str):
        return (advisory_key(key),)
    if isinstance(key, bool):
        raise LockUsageError("a lock key cannot be a bool")
    if isinstance(key, int):
        if not INT64_MIN <= key <= INT64_MAX:
            raise LockUsageError(
                f"integer lock key {key} is out of the signed 64-bit range "
                f"[{INT64_MIN}, {INT64_MAX}]"
            )
        return (key,)
    if isinstance(key, tuple | list) and len(key) == 2:
        pair = []
        for part in key:
            if isinstance(part, bool) or not isinstance(part, int):
                raise LockUsageError(f"a key pair holds two integers, got {key!r}")
            if not INT32_MIN <= part <= INT32_MAX:
                raise LockUsageError(
                    f"each half of a key pair must fit a signed 32-bit integer, got {key!r}"
                )
            pair.append(part)
        return (pair[0], pair[1])
    raise LockUsageError(
        f"a lock key is an int, a pair of int32 or a non-empty string, got {key!r}"
    )


def validate_lease_key(key: Any) -> str:
    """Return ``key`` if it can name a lease (a non-empty string of at most
    :data:`MAX_LEASE_KEY` characters, no NUL); raise :class:`LockUsageError` otherwise."""
    if not isinstance(key, str):
        raise LockUsageError(f"a lease key is a string, got {type(key).__name__}")
    if not key:
        raise LockUsageError("a lock key must not be empty")
    if len(key) > MAX_LEASE_KEY:
        raise LockUsageError(f"a lease key has at most {MAX_LEASE_KEY} characters")
    if "\x00" in key:
        raise LockUsageError("a lease key cannot contain a NUL character")
    return key


def dotted_path(func: Callable[..., Any]) -> str:
    """The key a decorator derives from ``func``: ``module.qualname``."""
    return f"{func.__module__}.{func.__qualname__}"
