"""Settings of the ``django.tasks`` backend benchmark (``benchmarks/tasks_backend.py``):
the benchmark settings plus the backend, on a database of its own."""

from __future__ import annotations

import os

os.environ.setdefault("TASKCLAIM_BENCH_DB_NAME", "taskclaim_bench_tasks")
os.environ.setdefault("TASKCLAIM_BENCH_NO_MARIADB", "1")

from benchmarks.settings import *  # noqa: F403
from benchmarks.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "django_taskclaim.contrib.tasks"]
TASKS = {"default": {"BACKEND": "django_taskclaim.contrib.tasks.backend.TaskClaimBackend"}}
