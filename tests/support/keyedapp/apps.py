from django.apps import AppConfig


class KeyedAppConfig(AppConfig):
    name = "tests.support.keyedapp"
    label = "keyedapp"
    default_auto_field = "django.db.models.BigAutoField"
