"""App configuration of the race lab (label ``taskclaim_racelab``)."""

from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _

#: The app's label: the lab models' ``app_label``, the prefix of their table names.
LABEL = "taskclaim_racelab"


class RaceLabConfig(AppConfig):
    """The race lab app: its models, their migration, ``manage.py taskclaim_racelab``.

    Its models are registered like any app's and ``migrate`` creates their (empty)
    tables. ``LabTask`` is claimable, but it is the lab's scratch queue, not one of the
    project's: :attr:`taskclaim_discover` keeps it out of
    :func:`~django_taskclaim.config.discovery.claimable_models` (the admin dashboard,
    ``taskclaim_stats``, ``taskclaim_reap``, ``taskclaim_prune``, ``taskclaim_doctor``,
    the worker without model labels and the ``taskclaim`` system checks).
    """

    name = "django_taskclaim.contrib.racelab"
    label = LABEL
    verbose_name = _("Race lab")
    default_auto_field = "django.db.models.BigAutoField"
    #: Read by :func:`~django_taskclaim.config.discovery.claimable_models`: ``False`` leaves this
    #: app's claimable models out of every "all claimable models" listing; they are
    #: claimed only where named (``claim()`` on their queryset, a worker given the label).
    taskclaim_discover = False
