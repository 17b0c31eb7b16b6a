"""``manage.py taskclaim_metrics [app.Model ...] [--database ALIAS]``: the gauges the
metrics view serves, printed as Prometheus text (docs/observability.md)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connections

from django_taskclaim.config.discovery import resolve_model
from django_taskclaim.exceptions import ConfigurationError
from django_taskclaim.ops.metrics.exposition import render
from django_taskclaim.ops.metrics.gauges import collect


class Command(BaseCommand):
    help = (
        "Print the queue gauges (rows ready, processing, failed, expired leases, oldest "
        "ready age, paused queues, live workers) in the Prometheus text format."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("models", nargs="*", metavar="app_label.Model")
        parser.add_argument(
            "--database", default=None, help="Read this alias (default: each model's router's)."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        using = options["database"]
        if using is not None and using not in connections:
            raise CommandError(
                f"unknown database alias {using!r}; configured: {', '.join(connections)}"
            )
        labels: list[str] = options["models"]
        try:
            targets = [resolve_model(label) for label in labels] if labels else None
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from None
        try:
            gauges = collect(targets, using=using)
        except DatabaseError as exc:
            raise CommandError(f"database error: {str(exc).strip().splitlines()[0]}") from None
        self.stdout.write(render(gauges), ending="")
