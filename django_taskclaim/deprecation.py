"""Import paths that earlier docs showed and that moved, kept importable until 0.2 with a
warning — all of them in :data:`MOVED`, this one place.

Until the restructuring the package was flat and the docs showed, for example,
``from django_taskclaim.notify import notify`` or ``django_taskclaim.archive.archive_finished()``.
The old modules (``notify``, ``unique``, ``monitoring``, ``concurrency``, ``archive``,
``doctor``, ``lifecycle``, ``notify_trigger``, ``options``) have no file any more: an import
finder (:func:`install`, called when the package is imported) makes each one on its first
import, a module whose ``__getattr__`` is :func:`moved_names`; a name that
left a package that is still there (``django_taskclaim.worker.recover``) is resolved by that
package's ``__getattr__`` the same way. The names the docs showed resolve with a
``DeprecationWarning`` naming the new import; any other name of an old module raises
``AttributeError`` saying where the module went. Nothing in the package imports the old
modules; they are removed in 0.2.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Callable, Sequence
from importlib import import_module
from types import ModuleType
from typing import Any

#: Old module → (where it went, {name the docs showed there → the module defining it now}).
#: ``tests/unit/test_earlier_imports.py`` imports every one of them.
MOVED: dict[str, tuple[str, dict[str, str]]] = {
    "django_taskclaim.notify": (
        "django_taskclaim.wakeup.notify",
        {"notify": "django_taskclaim.wakeup.notify"},
    ),
    "django_taskclaim.unique": (
        "django_taskclaim.model.unique",
        {
            "ActiveKeyField": "django_taskclaim.model.unique",
            "SparseUniqueConstraint": "django_taskclaim.model.unique",
            "insert_unique": "django_taskclaim.model.unique_insert",
            "UniqueKeyRaceError": "django_taskclaim.model.unique_insert",
        },
    ),
    "django_taskclaim.monitoring": (
        "django_taskclaim.ops.figures",
        {"db_now": "django_taskclaim.db"},
    ),
    "django_taskclaim.concurrency": (
        "django_taskclaim.model.concurrency_keys",
        {
            "concurrency_constraint": "django_taskclaim.model.concurrency_keys",
            "concurrency_slot": "django_taskclaim.model.concurrency_keys",
            "processing_key": "django_taskclaim.model.concurrency_keys",
        },
    ),
    "django_taskclaim.archive": (
        "django_taskclaim.recovery.archive",
        {
            "archive_of": "django_taskclaim.recovery.archive",
            "archive_finished": "django_taskclaim.recovery.archive",
        },
    ),
    "django_taskclaim.doctor": (
        "django_taskclaim.ops.doctor",
        {"diagnose": "django_taskclaim.ops.doctor", "Thresholds": "django_taskclaim.ops.doctor"},
    ),
    "django_taskclaim.lifecycle": (
        "django_taskclaim.settle",
        {"BatchableResult": "django_taskclaim.settle.outcome"},
    ),
    "django_taskclaim.notify_trigger": (
        "django_taskclaim.wakeup.trigger",
        {"sync_notify_triggers": "django_taskclaim.wakeup.trigger"},
    ),
    "django_taskclaim.options": (
        "django_taskclaim.config.options",
        {"retry_delay": "django_taskclaim.config.options"},
    ),
    # a package still there, one name of which moved
    "django_taskclaim.worker": ("", {"recover": "django_taskclaim.recovery.reap"}),
}


#: The package's own exports (name → defining module), handed over by :func:`install`.
_EXPORTS: dict[str, str] = {}


def new_import(name: str, module: str) -> str:
    """The import to write now: from the package itself where it exports ``name``."""
    if _EXPORTS.get(name) == module:
        return f"from django_taskclaim import {name}"
    return f"from {module} import {name}"


def moved_names(old: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``old`` (a key of :data:`MOVED`): each name the docs
    showed there resolves with a ``DeprecationWarning`` naming the new import; other names
    fail, pointing at where the module went."""
    new_home, names = MOVED[old]

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            where = f": {old} moved to {new_home}" if new_home else ""
            raise AttributeError(f"module {old!r} has no attribute {name!r}{where}")
        warnings.warn(
            f"{old}.{name} is deprecated: use `{new_import(name, module)}` "
            f"({old}.{name} is removed in 0.2)",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(import_module(module), name)

    return __getattr__


class _CallableModule(ModuleType):
    """An old module named like the function it held (``django_taskclaim.notify``):
    importing it makes it the package's attribute of that name (the import system does),
    hiding the function ``from django_taskclaim import notify`` gives, so calling the
    module calls the function and that import keeps working."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        short = self.__name__.rpartition(".")[2]
        return getattr(import_module(MOVED[self.__name__][1][short]), short)(*args, **kwargs)


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old modules of :data:`MOVED` (those with no package left in their place)
    once the ordinary finders found no file, and makes each a module of deprecated names."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        moved = MOVED.get(fullname)
        if moved is None or not moved[0]:  # not an old module, or a package still there
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        short = spec.name.rpartition(".")[2]
        if short in MOVED[spec.name][1]:
            return _CallableModule(spec.name)
        return None  # the default module object

    def exec_module(self, module: ModuleType) -> None:
        new_home = MOVED[module.__name__][0]
        module.__doc__ = f"Deprecated (removed in 0.2): moved to {new_home}."
        module.__getattr__ = moved_names(module.__name__)  # type: ignore[method-assign]


_FINDER = _MovedModules()


def install(exports: dict[str, str]) -> None:
    """Make the old module paths of :data:`MOVED` importable (idempotent). The finder goes
    last, so a real module of the same name would always win over it. ``exports`` is the
    package's table of the names it exports (name → defining module): a warning then
    points at ``from django_taskclaim import name`` where it can."""
    _EXPORTS.update(exports)
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)
