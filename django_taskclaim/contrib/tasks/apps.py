"""App configuration of the ``django.tasks`` backend (label ``taskclaim_tasks``)."""

from __future__ import annotations

import django
from django.apps import AppConfig
from django.core.exceptions import ImproperlyConfigured
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
