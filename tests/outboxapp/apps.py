from django.apps import AppConfig


class OutboxAppConfig(AppConfig):
    name = "tests.outboxapp"
    label = "outboxapp"
    default_auto_field = "django.db.models.BigAutoField"
