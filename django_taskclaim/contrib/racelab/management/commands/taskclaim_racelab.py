"""``manage.py taskclaim_racelab``: every claim technique raced, double claims counted."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS

from django_taskclaim.contrib.racelab.cli import build_lab, run_and_report
from django_taskclaim.contrib.racelab.techniques import technique_names
from django_taskclaim.exceptions import ConfigurationError


class Command(BaseCommand):
    help = (
        "Race N claimer processes over M lab rows with each claim technique (ours, "
        "lock tables, and the broken recipes) and print claims/s, double claims, rows "
        "never claimed and retried errors. Needs the app's tables (manage.py migrate); "
        "empties them before each technique and after the run."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "-n", "--processes", type=int, default=4, help="concurrent claimer processes (4)"
        )
        parser.add_argument("-m", "--rows", type=int, default=2000, help="rows to drain (2000)")
        parser.add_argument("--batch", type=int, default=1, help="rows per claim (1)")
        parser.add_argument(
            "-t",
            "--technique",
            action="append",
            dest="techniques",
            metavar="NAME",
            help=f"run only this technique (repeatable): {', '.join(technique_names())}",
        )
        parser.add_argument(
            "--work-ms", type=float, default=0.0, help="simulated work per claim, ms (0)"
        )
        parser.add_argument(
            "--window-ms",
            type=float,
            default=0.0,
            help="pause between a broken recipe's read and its write, ms (0)",
        )
        parser.add_argument(
            "--timeout", type=float, default=120.0, help="seconds allowed per technique (120)"
        )
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS, help="database alias")
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            lab = build_lab(
                using=options["database"],
                processes=options["processes"],
                rows=options["rows"],
                batch=options["batch"],
                work_ms=options["work_ms"],
                window_ms=options["window_ms"],
                timeout=options["timeout"],
                techniques=options["techniques"] or (),
            )
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from None
        unsafe = run_and_report(
            lab, options["techniques"], as_json=options["json"], write=self.stdout.write
        )
        if unsafe:
            raise CommandError(f"techniques that must be safe were not: {', '.join(unsafe)}")
