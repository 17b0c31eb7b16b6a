from django.db import migrations, models


class Migration(migrations.Migration):
    """Workers an operator can steer: the bodies each one runs, and a graceful stop asked
    from the admin (every new column nullable or with a database default, so workers of
    the previous version keep writing their rows during a rolling upgrade)."""

    dependencies = [
        ("taskclaim", "0009_dashboard"),
    ]

    operations = [
        migrations.AddField(
            model_name="workerprocess",
            name="running",
            field=models.JSONField(blank=True, null=True, verbose_name="running tasks"),
        ),
        migrations.AddField(
            model_name="workerprocess",
            name="stop_requested_at",
            field=models.DateTimeField(blank=True, null=True, verbose_name="stop requested at"),
        ),
        migrations.AddField(
            model_name="workerprocess",
            name="stop_requested_by",
            field=models.CharField(
                blank=True,
                db_default="",
                default="",
                max_length=150,
                verbose_name="stop requested by",
            ),
        ),
    ]
