"""``manage.py taskclaim_stats [app.Model ...] [--json]``: queue figures per model."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, connections

from django_taskclaim.config.discovery import resolve_model
from django_taskclaim.exceptions import ConfigurationError
from django_taskclaim.flow.pause import report
from django_taskclaim.flow.rate_view import rate_view
from django_taskclaim.ops.figures import format_snapshot, snapshot
from django_taskclaim.periodic.reported import reported_models


class Command(BaseCommand):
    help = (
        "Show, per claimable model, the rows in each state, expired leases, the age of the "
        "oldest ready row, rows done in the last 5 and 60 minutes, the live workers, and the "
        "paused queues with their ready backlog, and each rate limit's starts in its window."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("models", nargs="*", metavar="app_label.Model")
        parser.add_argument("--json", action="store_true", help="Print one JSON document.")
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS)
        parser.add_argument(
            "--exact",
            action="store_true",
            help="Count every row, the finished ones too (by default a large PostgreSQL "
            "table's finished states are the planner's estimates and the done-recently "
            "figures come from the workers' per-minute history, as on the dashboard).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        labels: list[str] = options["models"]
        if options["database"] not in connections:
            raise CommandError(
                f"unknown database alias {options['database']!r}; "
                f"configured: {', '.join(connections)}"
            )
        try:
            models_ = [resolve_model(label) for label in labels] if labels else None
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from None
        # Named models are always shown; the default leaves PeriodicRun out of a project
        # that schedules no function and has no run (ops.reported).
        shown = models_ if models_ is not None else reported_models(options["database"])
        snap = snapshot(shown, using=options["database"], fast=not options["exact"])
        pauses = report(models_, using=options["database"])  # paused queues and backlog
        rated = rate_view(models_, using=options["database"])  # rate-limited rings
        rates = [ring.as_dict() for model in rated for ring in model.rings]
        keys = [model.keys.as_dict() for model in rated if model.keys is not None]
        if options["json"]:
            doc = {**snap.as_dict(), "paused": pauses, "rate_limits": rates}
            doc["rate_limit_keys"] = keys
            self.stdout.write(json.dumps(doc, indent=2, sort_keys=True))
        else:
            self.stdout.write(format_snapshot(snap))
            self.stdout.write(f"\npaused queues: {len(pauses)}")
            for row in pauses:
                self.stdout.write(f"  {row['text']}")
            if rates:
                self.stdout.write(f"\nrate limits: {len(rates)}")
                for row in rates:
                    self.stdout.write(f"  {row['text']}")
                for row in keys:
                    self.stdout.write(f"  {row['text']}")
