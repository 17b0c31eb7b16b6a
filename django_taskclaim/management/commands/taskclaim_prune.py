"""``manage.py taskclaim_prune --older-than 7d [app.Model ...]``: delete old finished rows."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, connections

from django_taskclaim import bounds
from django_taskclaim.exceptions import ConfigurationError
from django_taskclaim.monitoring import prune
from django_taskclaim.options import claimable_models, get_options, resolve_model
from django_taskclaim.status import TERMINAL_STATES

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")


def parse_duration(text: str) -> timedelta:
    """``"90s"``, ``"15m"``, ``"12h"``, ``"7d"``, ``"2w"`` → ``timedelta``; ValueError otherwise."""
    match = _DURATION.match(text or "")
    if not match:
        raise ValueError(text)
    return timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2)])


class Command(BaseCommand):
    help = (
        "Delete finished rows (done and cancelled by default) whose finished_at is older "
        "than --older-than, in short batches. Use --dry-run to only count them."
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
        labels: list[str] = options["models"]
        try:
            age = parse_duration(options["older_than"])
        except ValueError:
            raise CommandError(
                f"--older-than {options['older_than']!r} is not a duration; use a number and "
                "a unit (s, m, h, d, w), e.g. --older-than 7d"
            ) from None
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
            targets = [resolve_model(label) for label in labels]
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from None
        explicit = bool(targets)
        if not explicit:
            targets = list(claimable_models())
        verb = "would delete" if options["dry_run"] else "deleted"
        total = 0
        for model in targets:
            opts = get_options(model)
            if not opts.has("finished_at"):
                if explicit:
                    raise CommandError(
                        f"{opts.label} has no finished_at field, so the age of its finished "
                        "rows is unknown; add TimestampFieldsMixin to it, or leave it out"
                    )
                self.stdout.write(f"{opts.label}: skipped (no finished_at field)")
                continue
            try:
                n = prune(
                    model,
                    older_than=age,
                    states=states,
                    batch_size=batch_size,
                    dry_run=options["dry_run"],
                    using=options["database"],
                )
            except ConfigurationError as exc:
                raise CommandError(str(exc)) from None
            total += n
            self.stdout.write(f"{opts.label}: {verb} {n} row(s)")
        self.stdout.write(
            f"total: {verb} {total} row(s) finished more than {options['older_than']} ago"
        )
