"""Module paths that moved before 0.1, kept importable until 0.2 with a warning.

Until the restructuring the package was flat and the docs showed, for example,
``from django_taskclaim.notify import notify``. Those names are now imported from
``django_taskclaim`` itself. Each old module (``notify``, ``unique``, ``monitoring``,
``concurrency``, ``archive``) is a few lines that call :func:`moved_names`: the names the
docs showed still resolve, with a ``DeprecationWarning`` naming the new import; any other
name raises ``AttributeError`` saying where the module went. Nothing in the package
imports these modules; they are removed in 0.2.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from importlib import import_module
from typing import Any


def moved_names(old: str, new_home: str, names: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for the deprecated module ``old``: each of ``names``
    (name → the module that defines it) resolves with a ``DeprecationWarning`` telling to
    import it from ``django_taskclaim``; other names fail, pointing at ``new_home``."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(
                f"module {old!r} has no attribute {name!r}: {old} moved to {new_home}"
            )
        warnings.warn(
            f"{old}.{name} is deprecated: use `from django_taskclaim import {name}` "
            f"({old} is removed in 0.2)",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(import_module(module), name)

    return __getattr__
