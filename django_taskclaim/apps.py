from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class TaskClaimConfig(AppConfig):
    name = "django_taskclaim"
    label = "taskclaim"  # stable: table names and migrations depend on it
    verbose_name = _("Task claims")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate, pre_migrate

        import django_taskclaim.checks  # noqa: F401  (registers the system checks)
        from django_taskclaim.wakeup.notify import (
            connect_signals,  # deferred: connected once the app registry is ready
        )
        from django_taskclaim.wakeup.trigger import on_post_migrate, on_pre_migrate

        connect_signals()
        # Triggers are set aside while migrations run (they pin the columns they read).
        pre_migrate.connect(
            on_pre_migrate, sender=self, dispatch_uid="django_taskclaim.wakeup.trigger.pre"
        )
        post_migrate.connect(
            on_post_migrate, sender=self, dispatch_uid="django_taskclaim.wakeup.trigger"
        )
