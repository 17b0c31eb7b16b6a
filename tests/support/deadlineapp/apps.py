from django.apps import AppConfig


class DeadlineAppConfig(AppConfig):
    name = "tests.support.deadlineapp"
    label = "deadlineapp"
    default_auto_field = "django.db.models.BigAutoField"
