"""Per-vendor SQL: the one place that reads a connection's vendor and writes SQL text.

:func:`for_connection` (or :func:`for_alias`) returns the vendor's
:class:`~django_taskclaim.backends.base.DatabaseSQL`, one shared instance per vendor. See
``base.py`` for what belongs in these classes and how their statements are named.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from django.db import connections

from django_taskclaim.backends.base import ClaimColumns, DatabaseSQL
from django_taskclaim.backends.base_locks import AdvisoryKind, LeaseTable
from django_taskclaim.backends.mysql import MySQL
from django_taskclaim.backends.postgresql import PostgreSQL
from django_taskclaim.backends.sqlite import SQLite
from django_taskclaim.backends.statement import Statement

__all__ = [
    "AdvisoryKind",
    "ClaimColumns",
    "DatabaseSQL",
    "LeaseTable",
    "MySQL",
    "PostgreSQL",
    "SQLite",
    "Statement",
    "for_alias",
    "for_connection",
    "for_engine",
    "for_vendor",
]

#: The vendors with their own class, by Django's ``connection.vendor``.
VENDORS: dict[str, type[DatabaseSQL]] = {cls.vendor: cls for cls in (PostgreSQL, MySQL, SQLite)}


@functools.cache
def for_vendor(vendor: str) -> DatabaseSQL:
    """The shared instance for Django's vendor name ``vendor``; a vendor without a class
    gets a plain :class:`DatabaseSQL` (no lease or advisory locks, nothing transient)."""
    cls = VENDORS.get(vendor)
    return cls() if cls is not None else DatabaseSQL(vendor)


def for_connection(connection: Any) -> DatabaseSQL:
    """The statements for a Django database connection (no query is sent)."""
    return for_vendor(connection.vendor)


def for_alias(using: str) -> DatabaseSQL:
    """The statements for the database alias ``using`` (no query is sent)."""
    return for_connection(connections[using])


def for_engine(settings_dict: Mapping[str, Any]) -> DatabaseSQL | None:
    """The statements for a ``DATABASES`` entry, judged from its ``ENGINE`` text alone
    (for checks that read settings and must not load a driver or connect); ``None`` when
    no vendor's :attr:`~DatabaseSQL.engine_marker` is in it."""
    engine = str(settings_dict.get("ENGINE", ""))
    for vendor, cls in VENDORS.items():
        if cls.engine_marker and cls.engine_marker in engine:
            return for_vendor(vendor)
    return None
