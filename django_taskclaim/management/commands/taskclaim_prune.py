"""``manage.py taskclaim_prune --older-than 7d [app.Model ...]``: delete old finished rows."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, connections

from django_taskclaim.config import bounds
from django_taskclaim.config.discovery import resolve_model
from django_taskclaim.exceptions import ConfigurationError
from django_taskclaim.recovery.prune import parse_age, prune_models
from django_taskclaim.row.status import TERMINAL_STATES


class Command(BaseCommand):
    help = (
        "Delete finished rows (done and cancelled by default) whose finished_at is older "
        "than --older-than, in short batches; a model that declares ClaimMeta.archive has "
        "them moved to its archive table instead; with no model named, events emitted "
        "more than --older-than ago that no row waits for go too. Use --dry-run to only "
        "count them."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("models", nargs="*", metavar="app_label.Model")
        parser.add_argument(
            "--older-than",
            required=True,
            metavar="AGE",
            help="Minimum age since finished_at: a number and a unit, e.g. 90s, 30m, 12h, 7d, 2w.",
        )
        parser.add_argument(
            "--states",
            default="done,cancelled",
            help="Comma-separated finished states to delete (done, cancelled, failed). "
            "Default: done,cancelled (failed rows are kept for inspection).",
        )
        parser.add_argument("--batch-size", default="1000", metavar="N")
        parser.add_argument("--dry-run", action="store_true", help="Only count what would go.")
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS)

    def handle(self, *args: Any, **options: Any) -> None:
        states = [s.strip() for s in options["states"].split(",") if s.strip()]
        bad = [s for s in states if s not in TERMINAL_STATES]
        if bad or not states:
            raise CommandError(
                f"--states {options['states']!r}: only finished states can be pruned; "
                f"choose from {', '.join(TERMINAL_STATES)}"
            )
        batch_size = bounds.number(
            options["batch_size"], "--batch-size", bounds.BATCH_SIZE, parse=True, error=CommandError
        )
        if options["database"] not in connections:
            raise CommandError(
                f"unknown database alias {options['database']!r}; "
                f"configured: {', '.join(connections)}"
            )
        try:
            result = prune_models(
                [resolve_model(label) for label in options["models"]],
                older_than=parse_age(options["older_than"]),
                states=states,
                batch_size=batch_size,
                dry_run=options["dry_run"],
                using=options["database"],
            )
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from None
        dry = options["dry_run"]
        for label in result.skipped:
            self.stdout.write(f"{label}: skipped (no finished_at field)")
        for label, n in result.per_model.items():
            archive = result.archived.get(label)
            if archive is None:
                self.stdout.write(f"{label}: {'would delete' if dry else 'deleted'} {n} row(s)")
            else:
                verb = "would move" if dry else "moved"
                self.stdout.write(f"{label}: {verb} {n} row(s) to {archive}")
        if result.archived:
            verb = "would prune" if dry else "pruned"
        else:
            verb = "would delete" if dry else "deleted"
        self.stdout.write(
            f"total: {verb} {result.total} row(s) finished more than {options['older_than']} ago"
        )
        if result.events is not None:
            self.stdout.write(
                f"events: {'would delete' if dry else 'deleted'} {result.events} emitted more "
                f"than {options['older_than']} ago that no row waits for"
            )
