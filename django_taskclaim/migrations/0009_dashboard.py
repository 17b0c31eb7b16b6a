from django.db import migrations


class Migration(migrations.Migration):
    """The admin index's "Dashboard" entry: a proxy model, no table and no permission."""

    dependencies = [
        ("taskclaim", "0008_rate_slot_recent"),
    ]

    operations = [
        migrations.CreateModel(
            name="Dashboard",
            fields=[],
            options={
                "verbose_name": "dashboard",
                "verbose_name_plural": "dashboard",
                "proxy": True,
                "default_permissions": (),
                "indexes": [],
                "constraints": [],
            },
            bases=("taskclaim.workerprocess",),
        ),
    ]
