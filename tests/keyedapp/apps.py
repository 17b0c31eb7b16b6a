from django.apps import AppConfig


class KeyedAppConfig(AppConfig):
    name = "tests.keyedapp"
    label = "keyedapp"
    default_auto_field = "django.db.models.BigAutoField"
