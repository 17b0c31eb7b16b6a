"""Markers shared by test files (test processes only: the subprocesses tests start never
import this, so they do not load pytest)."""

from __future__ import annotations

import pytest
from django.db import connection

#: For a test whose subject does not depend on the database under the suite (a scratch
#: project with its own SQLite file, a command line refused before any query): it runs
#: once, in the SQLite pass, and says so in the others.
ONCE_ON_SQLITE = pytest.mark.skipif(
    connection.vendor != "sqlite",
    reason="independent of the database under the suite: checked once, in the SQLite pass",
)
