"""Models for the archive tests: claimable models whose finished rows move to an
archive table built by :func:`~django_taskclaim.recovery.archive.archive_of`.

``Report`` has an auto-increment key, a renamed column and a foreign key; ``Receipt``
a text primary key whose column name needs quoting and a generated column (left out of
its archive).
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Upper

from django_taskclaim.models import ClaimableModel
from django_taskclaim.recovery.archive import archive_of


class Shelf(models.Model):
    name = models.CharField(max_length=40)


class Report(ClaimableModel):
    title = models.CharField(max_length=100, db_column="report_title")
    shelf = models.ForeignKey(Shelf, null=True, on_delete=models.CASCADE)
    payload = models.JSONField(default=dict)

    class ClaimMeta:
        archive = "archiveapp.ReportArchive"

    def process(self) -> None:
        pass


class Receipt(ClaimableModel):
    code = models.CharField(primary_key=True, max_length=40, db_column="receipt code")
    shouted = models.GeneratedField(
        expression=Upper("code"), output_field=models.CharField(max_length=40), db_persist=True
    )

    class ClaimMeta:
        archive = "archiveapp.ReceiptArchive"

    def process(self) -> None:
        pass


ReportArchive = archive_of(Report)
ReceiptArchive = archive_of(Receipt, db_table="archiveapp_receipt_history")
