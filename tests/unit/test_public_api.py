"""Every documented import works from its documented path, and the module paths that moved
(until 0.2) still resolve, with a ``DeprecationWarning`` naming the new one.

The documented imports are read from the docs themselves (every ``from django_taskclaim…
import …`` in README.md and docs/*.md), so a page that names a path the code no longer
has fails here. No database.
"""

from __future__ import annotations

import ast
import importlib
import re
import warnings
from pathlib import Path

import pytest

import django_taskclaim

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"```python\n(.*?)```", re.S)
#: ``from django_taskclaim... import a, b`` or ``import (a,\n b)``, as written in a page.
IMPORT = re.compile(r"^\s*(from django_taskclaim[\w.]* import (?:\([^)]*\)|[^\n]+))", re.M)


def documented_imports() -> list[tuple[str, str, str]]:
    """(page, module, name) for each name a page imports from the package."""
    found = []
    for page in PAGES:
        for block in FENCE.findall(page.read_text()):
            for statement in IMPORT.findall(block):
                node = ast.parse(statement.strip()).body[0]
                assert isinstance(node, ast.ImportFrom)
                for alias in node.names:
                    found.append((page.name, str(node.module), alias.name))
    return found


DOCUMENTED = documented_imports()


def _needs_missing_app(module: str) -> str | None:
    """The contrib app ``module`` belongs to when that app is not installed: importing
    its models would register them under this app and leave them there for every later
    test of the process (run it in the pass whose settings install the app)."""
    from django.apps import apps

    for app in ("django_taskclaim.contrib.tasks", "django_taskclaim.contrib.racelab"):
        if (module == app or module.startswith(app + ".")) and not apps.is_installed(app):
            return app
    return None


def _import(module: str) -> object:
    app = _needs_missing_app(module)
    if app is not None:
        pytest.skip(f"{app} is not installed in these settings (checked in its own pass)")
    return importlib.import_module(module)


#: The public paths users write (beside the names above), and a few names of each.
PUBLIC = {
    "django_taskclaim.models": ["ClaimableModel", "ClaimableMixin", "ClaimFieldsMixin"],
    "django_taskclaim.admin": ["ClaimableAdminMixin"],
    "django_taskclaim.locks": ["LeaseLock", "advisory", "singleton", "SKIPPED", "break_lease"],
    "django_taskclaim.worker": ["Worker", "WorkerConfig"],
    "django_taskclaim.contrib.tasks": ["enqueue_unique"],
    "django_taskclaim.contrib.tasks.backend": ["TaskClaimBackend"],
    "django_taskclaim.contrib.tasks.models": ["QueuedTask"],
    "django_taskclaim.outbox": ["OutboxMessage", "Publisher", "PublishError", "MessagesRejected"],
    "django_taskclaim.periodic": ["periodic"],
    "django_taskclaim.db": ["DbNow", "db_now"],
}

#: Old path → the names the docs showed there before the move.
MOVED = {
    "django_taskclaim.notify": ["notify"],
    "django_taskclaim.unique": ["ActiveKeyField", "insert_unique", "UniqueKeyRaceError"],
    "django_taskclaim.monitoring": ["db_now"],
    "django_taskclaim.concurrency": [
        "concurrency_constraint",
        "concurrency_slot",
        "processing_key",
    ],
    "django_taskclaim.archive": ["archive_of"],
}


def test_the_docs_import_something():
    assert len(DOCUMENTED) > 20
    assert ("README.md", "django_taskclaim.models", "ClaimableModel") in DOCUMENTED


@pytest.mark.parametrize(("page", "module", "name"), DOCUMENTED)
def test_each_documented_import_works(page, module, name):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # the docs name no moved path
        assert getattr(_import(module), name) is not None, f"{page}"


@pytest.mark.parametrize("name", django_taskclaim.__all__)
def test_every_name_of_the_package_resolves(name):
    assert getattr(django_taskclaim, name) is not None


@pytest.mark.parametrize(("module", "name"), [(m, n) for m, names in PUBLIC.items() for n in names])
def test_the_public_paths(module, name):
    assert getattr(_import(module), name) is not None


@pytest.mark.parametrize(("module", "name"), [(m, n) for m, names in MOVED.items() for n in names])
def test_moved_paths_still_resolve_with_a_warning(module, name):
    old = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=rf"from django_taskclaim import {name}\b"):
        value = getattr(old, name)
    assert value is getattr(importlib.import_module(django_taskclaim._LAZY[name]), name)


def test_the_old_notify_module_does_not_hide_the_function():
    """Importing the old path sets the package's ``notify`` attribute to that module (the
    import system does): it must still be the function users call."""
    importlib.import_module("django_taskclaim.notify")
    from django_taskclaim import notify
    from django_taskclaim.wakeup.notify import notify as function

    with pytest.warns(DeprecationWarning, match="deprecated"):
        assert notify.notify is function
    assert callable(notify)


def test_a_moved_module_names_its_new_home_for_other_names():
    old = importlib.import_module("django_taskclaim.concurrency")
    with pytest.raises(AttributeError, match=r"moved to django_taskclaim\.model\.concurrency_keys"):
        old.guard_of  # noqa: B018


@pytest.mark.parametrize(
    ("package", "allowed"), [("django_taskclaim", set()), ("django_taskclaim.locks", set())]
)
def test_no_submodule_hides_a_lazy_name(package, allowed):
    """Importing ``pkg.x`` sets the package's attribute ``x`` to that module: a lazily
    loaded public name ``x`` would then be the module. No module file shares a name (the
    deprecated ``django_taskclaim.notify`` has none: it is made on import, callable as the
    function, see the test above)."""
    import pkgutil

    module = importlib.import_module(package)
    submodules = {info.name for info in pkgutil.iter_modules(module.__path__)}
    assert set(module._LAZY) & submodules == allowed
