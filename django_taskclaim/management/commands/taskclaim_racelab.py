"""``manage.py taskclaim_racelab``: every claim technique raced, double claims counted."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, connections

from django_taskclaim.racelab import RaceLab, format_table, technique_names


class Command(BaseCommand):
    help = (
        "Race N claimer processes over M scratch rows with each claim technique (ours, "
        "lock tables, and the broken recipes) and print claims/s, double claims, rows "
        "never claimed and retried errors. Creates and drops its own scratch tables."
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
        for name in ("processes", "rows", "batch"):
            if options[name] < 1:
                raise CommandError(f"--{name} must be at least 1, got {options[name]}")
        for name in ("work_ms", "window_ms"):
            if options[name] < 0:
                raise CommandError(f"--{name.replace('_', '-')} must be >= 0")
        if options["timeout"] <= 0:
            raise CommandError("--timeout must be a positive number of seconds")
        using = options["database"]
        if using not in connections:
            raise CommandError(f"unknown database {using!r}; configured: {', '.join(connections)}")
        known = technique_names()
        for name in options["techniques"] or ():
            if name not in known:
                raise CommandError(f"unknown technique {name!r}; choose from {', '.join(known)}")
        lab = RaceLab(
            using=using,
            processes=options["processes"],
            rows=options["rows"],
            batch=options["batch"],
            work=options["work_ms"] / 1000,
            window=options["window_ms"] / 1000,
            timeout=options["timeout"],
        )
        conn = connections[using]
        if not options["json"]:
            self.stdout.write(
                f"race lab on {conn.display_name} (database {using!r}): "
                f"{lab.processes} processes, {lab.rows} rows, batch {lab.batch}"
            )
        results = lab.run(options["techniques"])
        if options["json"]:
            self.stdout.write(json.dumps([r.as_dict() for r in results], indent=2))
            return
        self.stdout.write(format_table(results))
        unsafe = [r.technique for r in results if r.kind != "broken" and r.verdict != "ok"]
        if unsafe and not all(r.skipped for r in results if r.technique in unsafe):
            raise CommandError(f"techniques that must be safe were not: {', '.join(unsafe)}")
