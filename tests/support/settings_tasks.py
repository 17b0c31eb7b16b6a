"""Test settings with the ``django.tasks`` backend installed
(``--ds=tests.support.settings_tasks``)."""

import os

from tests.support.settings import *  # noqa: F403
from tests.support.settings import INSTALLED_APPS, LOGGING

INSTALLED_APPS = [*INSTALLED_APPS, "django_taskclaim.contrib.tasks"]

TASKS = {
    "default": {
        "BACKEND": "django_taskclaim.contrib.tasks.backend.TaskClaimBackend",
        "QUEUES": ["default", "emails", "other"],
        "OPTIONS": {"max_attempts": 3, "retry_backoff": 0, "retry_jitter": 0},
    },
}

# The examples of Django's Tasks documentation send mail: keep it in memory.
MAILERS = {"default": {"BACKEND": "django.core.mail.backends.locmem.EmailBackend"}}

# Worker subprocesses of the recovery tests reap often.
TASKCLAIM_REAP_INTERVAL = float(os.environ.get("TASKCLAIM_TEST_REAP_INTERVAL", "30"))

# Worker subprocesses that must show the lines Django's task signal receivers log.
if os.environ.get("TASKCLAIM_TEST_TASKS_LOG"):
    LOGGING = {
        **LOGGING,
        "handlers": {**LOGGING["handlers"], "tasks_stderr": {"class": "logging.StreamHandler"}},
        "loggers": {
            **LOGGING["loggers"],
            "django.tasks": {"handlers": ["tasks_stderr"], "level": "INFO", "propagate": False},
        },
    }
