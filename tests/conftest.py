from __future__ import annotations

import os
import socket
import threading

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


@pytest.fixture(autouse=True)
def no_leaked_lease_renewers():
    """A test must not leave a lease renewer running: it would renew into the next test's
    database and fail there, far from its cause. One left behind is stopped and reported
    here, on the test that started it."""
    yield
    from django_taskclaim.locks.renewer import Renewer

    leaked = [t for t in threading.enumerate() if isinstance(t, Renewer) and t.is_alive()]
    for renewer in leaked:
        renewer.stop(timeout=5)
    assert not leaked, f"lease renewer threads left running: {[t.name for t in leaked]}"
