from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class TaskClaimConfig(AppConfig):
    name = "django_taskclaim"
    label = "taskclaim"  # stable: table names and migrations depend on it
    verbose_name = _("Task claims")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks, lock_checks  # noqa: F401  (register the system checks)
        from .notify import connect_signals  # deferred: connected once the app registry is ready

        connect_signals()
