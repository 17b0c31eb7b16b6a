from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("taskclaim", "0007_history"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="rateslot",
            index=models.Index(fields=["model", "last_start"], name="taskclaim_rate_recent"),
        ),
    ]
