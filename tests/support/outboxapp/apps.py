from django.apps import AppConfig


class OutboxAppConfig(AppConfig):
    name = "tests.support.outboxapp"
    label = "outboxapp"
    default_auto_field = "django.db.models.BigAutoField"
