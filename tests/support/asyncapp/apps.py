from django.apps import AppConfig


class AsyncAppConfig(AppConfig):
    name = "tests.support.asyncapp"
    label = "asyncapp"
    default_auto_field = "django.db.models.BigAutoField"
