from django.db import migrations, models


class Migration(migrations.Migration):
    """Each attempt's story: the workers' journal of attempts (TASKCLAIM_ATTEMPT_LOG)."""

    dependencies = [
        ("taskclaim", "0010_worker_steering"),
    ]

    operations = [
        migrations.CreateModel(
            name="TaskAttempt",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("model", models.CharField(max_length=100, verbose_name="model")),
                ("row", models.CharField(max_length=191, verbose_name="row")),
                ("number", models.PositiveIntegerField(verbose_name="attempt")),
                (
                    "worker",
                    models.CharField(blank=True, default="", max_length=255, verbose_name="worker"),
                ),
                ("started_at", models.DateTimeField(verbose_name="started at")),
                ("runtime", models.FloatField(verbose_name="runtime (s)")),
                ("outcome", models.CharField(max_length=16, verbose_name="outcome")),
                ("error", models.TextField(blank=True, default="", verbose_name="error")),
            ],
            options={
                "verbose_name": "task attempt",
                "verbose_name_plural": "task attempts",
                "ordering": ["model", "row", "-number"],
                "indexes": [
                    models.Index(fields=["model", "row", "number"], name="taskclaim_attempt_row"),
                    models.Index(fields=["started_at"], name="taskclaim_attempt_age"),
                ],
            },
        ),
    ]
