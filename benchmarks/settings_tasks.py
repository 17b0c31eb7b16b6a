"""Settings of the ``django.tasks`` backend benchmark (``benchmarks/tasks_backend.py``):
the benchmark settings plus the backend, on a database of its own.
``TASKCLAIM_BENCH_TASKS_LOG_LEVEL`` sets the level of the ``django.tasks`` logger (where
Django's own signal receivers log each task's start and end)."""

from __future__ import annotations

import os

os.environ.setdefault("TASKCLAIM_BENCH_DB_NAME", "taskclaim_bench_tasks")
os.environ.setdefault("TASKCLAIM_BENCH_NO_MARIADB", "1")

from benchmarks.settings import *  # noqa: F403
from benchmarks.settings import INSTALLED_APPS, LOGGING

INSTALLED_APPS = [*INSTALLED_APPS, "django_taskclaim.contrib.tasks"]
if os.environ.get("TASKCLAIM_BENCH_TASKS_LOG_LEVEL"):
    LOGGING = {
        **LOGGING,
        "loggers": {
            **LOGGING["loggers"],
            "django.tasks": {"level": os.environ["TASKCLAIM_BENCH_TASKS_LOG_LEVEL"]},
        },
    }
TASKS = {"default": {"BACKEND": "django_taskclaim.contrib.tasks.backend.TaskClaimBackend"}}
