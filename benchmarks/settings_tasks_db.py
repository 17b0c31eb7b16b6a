"""Settings of the django-tasks-db side of ``benchmarks/tasks_backend.py``: the same
database, with django-tasks-db's ``DatabaseBackend`` as the default task backend."""

from __future__ import annotations

from benchmarks.settings_tasks import *  # noqa: F403
from benchmarks.settings_tasks import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "django_tasks_db"]
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
