"""testapp's migration 0002_utc_db_clock, unchanged (see the package's docstring)."""

from importlib import import_module

Migration = import_module("tests.support.testapp.migrations.0002_utc_db_clock").Migration
