"""``manage.py taskclaim_doctor [app_label.Model ...] [--database ALIAS] [--json]``: check
the real database (indexes and plans, pooler, clock, queue health, finished rows) and
say how to fix what is wrong. Exit code 0: all ok; 1: warnings; 2: errors."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from django_taskclaim.config.discovery import resolve_model
from django_taskclaim.exceptions import TaskClaimError
from django_taskclaim.ops.doctor import diagnose, exit_code, format_findings


class Command(BaseCommand):
    help = (
        "Check the database itself: claim and lease indexes present and used (EXPLAIN), "
        "pooler mode, clock offset, lease against heartbeat, queue health (oldest ready "
        "row, leases not reaped, failed rows, silent workers) and finished rows to prune. "
        "Every warning and error names its fix. Exit code 0: all ok, 1: warnings, 2: errors."
    )
    # The doctor examines broken setups too: the system checks must not stop it (the
    # ones about claims are among its findings; manage.py check --tag taskclaim has all).
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("models", nargs="*", metavar="app_label.Model")
        parser.add_argument(
            "--database",
            default=None,
            help="database alias (default: each model's database for writes)",
        )
        parser.add_argument(
            "--json", action="store_true", help='print {"findings": [...], "exit": N}'
        )
        parser.add_argument(
            "--fail-on",
            choices=("warning", "error"),
            default="warning",
            help="lowest severity that makes the exit code non-zero (default: warning)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        using = options["database"]
        if using is not None and using not in connections:
            raise CommandError(
                f"unknown database alias {using!r}; configured: {', '.join(connections)}"
            )
        try:
            targets = [resolve_model(label) for label in options["models"]] or None
        except TaskClaimError as exc:
            raise CommandError(str(exc)) from None
        findings = diagnose(targets, using=using)
        code = exit_code(findings, fail_on=options["fail_on"])
        if options["json"]:
            document = {"findings": [f.as_dict() for f in findings], "exit": code}
            self.stdout.write(json.dumps(document, indent=2))
        else:
            self.stdout.write(format_findings(findings, code))
        if code:
            self.stdout.flush()
            raise SystemExit(code)
