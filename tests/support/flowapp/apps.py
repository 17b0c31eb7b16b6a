from django.apps import AppConfig


class FlowAppConfig(AppConfig):
    name = "tests.support.flowapp"
    label = "flowapp"
    default_auto_field = "django.db.models.BigAutoField"
