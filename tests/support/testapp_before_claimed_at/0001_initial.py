"""testapp's migration 0001_initial, unchanged (see the package's docstring)."""

from importlib import import_module

Migration = import_module("tests.support.testapp.migrations.0001_initial").Migration
