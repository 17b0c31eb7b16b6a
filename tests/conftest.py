from __future__ import annotations

import os
import socket

import pytest
from django.conf import settings


def _mariadb_down_reason() -> str | None:
    if settings.DB_VENDOR != "mysql":
        return None
    conf = settings.DATABASES["default"]
    host, port = conf.get("HOST") or "127.0.0.1", int(conf.get("PORT") or 3306)
    try:
        with socket.create_connection((host, port), timeout=1):
            pass
    except OSError:
        return f"MariaDB/MySQL not reachable at {host}:{port} (start it or unset TASKCLAIM_TEST_DB)"
    try:
        import MySQLdb  # noqa: F401
    except ImportError:
        return "mysqlclient is not installed (apt-get install libmariadb-dev pkg-config)"
    return None


def pytest_report_header(config):
    conf = settings.DATABASES["default"]
    return f"taskclaim test database: {settings.DB_VENDOR} {conf.get('HOST') or conf['NAME']}"


def pytest_collection_modifyitems(config, items):
    reason = _mariadb_down_reason()
    if reason:
        print(f"\nSKIPPING ALL TESTS: {reason}")
        for item in items:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def vendor() -> str:
    return settings.DB_VENDOR


def pytest_configure(config):
    os.environ.setdefault("TASKCLAIM_TESTING", "1")
