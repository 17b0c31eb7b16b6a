from django.apps import AppConfig


class ArchiveAppConfig(AppConfig):
    name = "tests.support.archiveapp"
    label = "archiveapp"
    default_auto_field = "django.db.models.BigAutoField"
