"""A ``django.tasks`` backend built on a claimable model (Django 6.0 and later).

Add ``"django_taskclaim.contrib.tasks"`` to ``INSTALLED_APPS`` and point ``TASKS`` at
:class:`django_taskclaim.contrib.tasks.backend.TaskClaimBackend`; run the tasks with
``manage.py worker taskclaim_tasks.QueuedTask``. See ``docs/tasks-backend.md``.

Unique enqueue: :func:`enqueue_unique` (``enqueue_unique(task, key, *args, **kwargs)``)
enqueues unless a ready or processing task has the same key; see ``docs/unique.md``.

Workflows (``docs/workflows.md``): ``my_task.after(*results).enqueue(...)`` waits for
other tasks; inside a task body :func:`step`, :func:`wait_for_event`, :func:`fan_in` and
:func:`prerequisite_results` work on the running task's row.

On Django < 6.0 importing this package raises ``ImproperlyConfigured`` with the reason:
``django.tasks`` does not exist there, and the ``django-tasks`` backport is not supported.
"""

from importlib import import_module
from typing import Any

from django_taskclaim.contrib.tasks.apps import check_django_version

check_django_version()

#: Names loaded from their module on first use (importing this package stays cheap).
_LAZY = {
    "enqueue_unique": "django_taskclaim.contrib.tasks.backend",
    "aenqueue_unique": "django_taskclaim.contrib.tasks.backend",
    "unique_key_for": "django_taskclaim.contrib.tasks.arguments",
    **{
        name: "django_taskclaim.contrib.tasks.workflows"
        for name in (
            "astep",
            "await_event",
            "completed_steps",
            "fan_in",
            "forget_steps",
            "prerequisite_results",
            "step",
            "wait_for_event",
        )
    },
}

__all__ = [
    "aenqueue_unique",
    "astep",
    "await_event",
    "completed_steps",
    "enqueue_unique",
    "fan_in",
    "forget_steps",
    "prerequisite_results",
    "step",
    "unique_key_for",
    "wait_for_event",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        # deferred: loaded on first use, importing the app stays cheap
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
