"""``manage.py seed_documents N``: insert demo documents (and parser jobs)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from documents.seeding import seed


class Command(BaseCommand):
    help = "Insert N demo documents (and --jobs parser jobs) ready to be processed."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("count", type=int)
        parser.add_argument("--jobs", type=int, default=0)
        parser.add_argument("--seconds", type=float, default=None, help="processing time each")
        parser.add_argument("--fail-rate", type=float, default=None, help="0..1 per attempt")
        parser.add_argument("--batch", default=None, help="tag (default: a timestamp)")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["count"] < 0 or options["jobs"] < 0:
            raise CommandError("count and --jobs must be >= 0")
        rate = options["fail_rate"]
        if rate is not None and not 0 <= rate <= 1:
            raise CommandError(f"--fail-rate must be between 0 and 1, got {rate}")
        if options["seconds"] is not None and options["seconds"] < 0:
            raise CommandError("--seconds must be >= 0")
        batch = options["batch"] or timezone.now().strftime("seed-%Y%m%d-%H%M%S")
        docs, jobs = seed(
            options["count"],
            batch=batch,
            jobs=options["jobs"],
            seconds=options["seconds"],
            fail_rate=rate,
        )
        self.stdout.write(f"seeded {docs} documents and {jobs} parser jobs (batch {batch})")
