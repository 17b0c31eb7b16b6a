"""The active-unique-key constraint indexes only rows that have a key (a partial unique
index on PostgreSQL and SQLite; unchanged on MariaDB / MySQL). Written by hand: Django
sees the two constraints as equal."""

from django.db import migrations

import django_taskclaim.model.unique


class Migration(migrations.Migration):
    dependencies = [
        ("taskclaim_tasks", "0003_queuedtask_unique_key"),
    ]

    operations = [
        migrations.RemoveConstraint(model_name="queuedtask", name="tctask_active_unique_key"),
        migrations.AddConstraint(
            model_name="queuedtask",
            constraint=django_taskclaim.model.unique.SparseUniqueConstraint(
                fields=("active_unique_key",), name="tctask_active_unique_key"
            ),
        ),
    ]
