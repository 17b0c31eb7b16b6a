"""testapp's migration 0003_odd_keys, unchanged (see the package's docstring)."""

from importlib import import_module

Migration = import_module("tests.support.testapp.migrations.0003_odd_keys").Migration
