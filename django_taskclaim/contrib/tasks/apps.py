"""App configuration of the ``django.tasks`` backend (label ``taskclaim_tasks``)."""

from __future__ import annotations

from collections.abc import Iterable

import django
from django.apps import AppConfig
from django.core.exceptions import ImproperlyConfigured
from django.db.models import Model
from django.utils.translation import gettext_lazy as _

#: The first Django release that ships ``django.tasks``.
MIN_DJANGO = (6, 0)


def check_django_version(version: tuple[int, ...] | None = None) -> None:
    """Raise ``ImproperlyConfigured`` unless Django ships ``django.tasks`` (6.0+).

    The ``django-tasks`` backport for older Django versions is not supported: its
    module paths differ and this backend is tested against Django's own package only.
    """
    version = tuple(version or django.VERSION[:2])
    if version < MIN_DJANGO:
        raise ImproperlyConfigured(
            "django_taskclaim.contrib.tasks needs Django's Tasks framework (django.tasks), "
            f"added in Django 6.0; this project runs Django {'.'.join(map(str, version))}. "
            "Upgrade Django, or remove 'django_taskclaim.contrib.tasks' from INSTALLED_APPS "
            "and claim your own models with django_taskclaim instead."
        )


class TaskClaimTasksConfig(AppConfig):
    name = "django_taskclaim.contrib.tasks"
    label = "taskclaim_tasks"  # stable: the table name and migrations depend on it
    verbose_name = _("Django tasks")
    default_auto_field = "django.db.models.BigAutoField"

    def taskclaim_worker_refusal(
        self, models: Iterable[type[Model]], queue: str | None
    ) -> str | None:
        """Why ``manage.py worker`` must not serve ``models`` with ``--queue queue``, in one
        line, or ``None``: Django's check of ``TASKS`` and the queues of the backends
        (:func:`~django_taskclaim.contrib.tasks.preflight.worker_refusal`). The worker
        command asks every installed app config that has this hook."""
        from django_taskclaim.contrib.tasks.preflight import (
            worker_refusal,  # deferred: needs django.tasks (Django 6.0+)
        )

        return worker_refusal(models, queue)
