"""testapp's migration 0004_result_types, unchanged (see the package's docstring)."""

from importlib import import_module

Migration = import_module("tests.support.testapp.migrations.0004_result_types").Migration
