"""Deprecated (removed in 0.2): ``from django_taskclaim import notify``
(:mod:`django_taskclaim.deprecation`)."""

import sys
from types import ModuleType
from typing import Any

from django_taskclaim.deprecation import moved_names

__getattr__ = moved_names(__name__)


class _CallableModule(ModuleType):
    """Importing this module makes it the package's ``notify`` attribute (the import
    system does), hiding the function ``from django_taskclaim import notify`` gives:
    calling the module calls the function, so that import keeps working."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from django_taskclaim.wakeup.notify import notify

        return notify(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
