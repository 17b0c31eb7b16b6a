"""App configuration of the race lab (label ``taskclaim_racelab``)."""

from __future__ import annotations

from collections.abc import Iterator

from django.apps import AppConfig
from django.db import models
from django.utils.translation import gettext_lazy as _

#: The app's label: the scratch models' ``app_label``, the prefix of their table names.
LABEL = "taskclaim_racelab"


class RaceLabConfig(AppConfig):
    """The race lab app: registers the scratch models, keeps them out of the project.

    The scratch tables exist only while a lab run lasts, so the app's models are left
    out of every "all installed models" listing (:meth:`get_models`): the library's
    :func:`~django_taskclaim.options.claimable_models` (admin dashboard,
    ``taskclaim_stats``, ``taskclaim_reap``, the worker, the system checks), Django's
    model checks, content types, permissions, ``makemigrations`` and ``dumpdata`` never
    see them. ``apps.get_model("taskclaim_racelab", "LabTask")`` still finds them.
    """

    name = "django_taskclaim.contrib.racelab"
    label = LABEL
    verbose_name = _("Race lab")
    default_auto_field = "django.db.models.BigAutoField"

    def get_models(
        self, include_auto_created: bool = False, include_swapped: bool = False
    ) -> Iterator[type[models.Model]]:
        """Yield nothing: the scratch models have no table outside a lab run."""
        return iter(())
