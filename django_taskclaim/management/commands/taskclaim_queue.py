"""``manage.py taskclaim_queue pause|resume|status [app_label.Model] [--queue NAME]
[--reason TEXT]``: pause and resume a model's queues across the fleet, and list what is
paused with its backlog (:mod:`django_taskclaim.flow.pause`, docs/pause.md)."""

from __future__ import annotations

import getpass
import json
import socket
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections, router

from django_taskclaim.config.discovery import resolve_model
from django_taskclaim.exceptions import ConfigurationError
from django_taskclaim.flow.pause import describe, is_paused, pause, paused, report, resume


def operator() -> str:
    """Who runs the command, as recorded in ``paused_by``: ``user@host``."""
    try:
        user = getpass.getuser()
    except Exception:  # no login name (a container without passwd entry)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"[:255]


class Command(BaseCommand):
    help = (
        "Pause or resume the claims of a model (every queue, or one queue_name value with "
        "--queue) on every worker, or show what is paused and how many ready rows wait."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["pause", "resume", "status"])
        parser.add_argument("model", nargs="?", metavar="app_label.Model")
        parser.add_argument("--queue", help="only the rows whose queue_name is NAME")
        parser.add_argument("--reason", default="", help="why (pause only; shown in status)")
        parser.add_argument("--by", default=None, help="who (default: user@host)")
        parser.add_argument(
            "--database", default=None, help="database alias (default: the model's)"
        )
        parser.add_argument("--json", action="store_true", help="status as one JSON document")

    def handle(self, *args: Any, **options: Any) -> None:
        action, label = options["action"], options["model"]
        using = options["database"]
        if using is not None and using not in connections:
            raise CommandError(
                f"unknown database alias {using!r}; configured: {', '.join(connections)}"
            )
        if action != "status" and label is None:
            raise CommandError(f"{action} needs a model: taskclaim_queue {action} app_label.Model")
        if options["reason"] and action != "pause":
            raise CommandError("--reason goes with pause")
        if options["queue"] is not None and label is None:
            raise CommandError("--queue needs a model: taskclaim_queue status app_label.Model")
        by = operator() if options["by"] is None else options["by"]
        try:
            model = resolve_model(label) if label is not None else None
            if action == "pause":
                before = {p.queue for p in paused(model, using=using)}
                row = pause(model, options["queue"], by=by, reason=options["reason"], using=using)
                again = "already paused: " if row.queue in before else "paused: "
                self.stdout.write(again + describe(row, using=using))
            elif action == "resume":
                what = f"{label} queue {options['queue']}" if options["queue"] else f"{label}"
                if resume(model, options["queue"], by=by, using=using):
                    self.stdout.write(f"resumed: {what}")
                else:
                    self.stdout.write(f"not paused: {what}")
            else:
                self._status(model, options["queue"], using, as_json=options["json"])
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from None

    def _status(self, model: Any, queue: str | None, using: str | None, *, as_json: bool) -> None:
        if model is not None:
            using = using or router.db_for_write(model)
            if queue is not None:
                is_paused(model, queue, using=using)  # refuses a queue the model cannot have
        rows = report(None if model is None else [model], using=using)
        if queue is not None:
            rows = [r for r in rows if r["queue"] in ("", queue)]
        if as_json:
            self.stdout.write(json.dumps({"paused": rows}, indent=2, sort_keys=True))
            return
        if not rows:
            self.stdout.write("no queue is paused")
            return
        for row in rows:
            self.stdout.write(row["text"])
