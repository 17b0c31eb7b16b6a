# Queue names longer than the history's column (tests/worker/test_history.py).

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("flowapp", "0001_initial"),
    ]

    operations = [
        migrations.AlterField(
            model_name="errand",
            name="queue_name",
            field=models.CharField(default="default", max_length=400),
        ),
        migrations.AlterField(
            model_name="errandrun",
            name="queue",
            field=models.CharField(max_length=400),
        ),
    ]
