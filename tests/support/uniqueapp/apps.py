from django.apps import AppConfig


class UniqueAppConfig(AppConfig):
    name = "tests.support.uniqueapp"
    label = "uniqueapp"
    default_auto_field = "django.db.models.BigAutoField"
