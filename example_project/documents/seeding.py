"""Creating demo rows in bulk."""

from __future__ import annotations

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet

from .models import Document, ParserJob

CHUNK = 1000


def job_url_prefix(batch: str) -> str:
    """Start of the URL of every parser job seeded with ``batch`` (the table has no batch)."""
    return f"https://example.com/{batch}/"


def batch_jobs(batch: str) -> QuerySet[ParserJob]:
    """The parser jobs seeded with ``batch``."""
    return ParserJob.objects.filter(url__startswith=job_url_prefix(batch))


def seed(
    count: int,
    *,
    batch: str,
    seconds: float | None = None,
    fail_rate: float | None = None,
    jobs: int = 0,
) -> tuple[int, int]:
    """Insert ``count`` documents tagged ``batch`` (and ``jobs`` parser jobs); return both counts.

    Each row's payload says how long its processing takes and how likely an attempt fails,
    defaulting to the ``DEMO_WORK_SECONDS`` / ``DEMO_FAIL_RATE`` settings. Workers are
    woken up (PostgreSQL ``NOTIFY``) once the rows are committed.
    """
    payload = {
        "seconds": settings.DEMO_WORK_SECONDS if seconds is None else seconds,
        "fail_rate": settings.DEMO_FAIL_RATE if fail_rate is None else fail_rate,
    }
    with transaction.atomic():
        for start in range(0, count, CHUNK):
            Document.objects.bulk_create(
                [
                    Document(title=f"{batch} document {i + 1}", batch=batch, payload=payload)
                    for i in range(start, min(count, start + CHUNK))
                ]
            )
        ParserJob.objects.bulk_create(
            [ParserJob(url=f"{job_url_prefix(batch)}{i + 1}", payload=payload) for i in range(jobs)]
        )
    _notify(Document)
    if jobs:
        _notify(ParserJob)
    return count, jobs


def _notify(model: type) -> None:
    try:
        from django_taskclaim.wakeup.notify import notify
    except ImportError:  # pragma: no cover - workers poll anyway
        return
    notify(model)
