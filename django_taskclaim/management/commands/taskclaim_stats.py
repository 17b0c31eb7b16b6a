"""``manage.py taskclaim_stats [app.Model ...] [--json]``: queue figures per model."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, connections

from django_taskclaim.exceptions import ConfigurationError
from django_taskclaim.monitoring import Snapshot, humanize_seconds, snapshot
from django_taskclaim.options import resolve_model
from django_taskclaim.status import STATE_NAMES


class Command(BaseCommand):
    help = (
        "Show, per claimable model, the rows in each state, expired leases, the age of the "
        "oldest ready row, rows done in the last 5 and 60 minutes, and the live workers."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("models", nargs="*", metavar="app_label.Model")
        parser.add_argument("--json", action="store_true", help="Print one JSON document.")
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS)

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
        snap = snapshot(models_, using=options["database"])
        if options["json"]:
            self.stdout.write(json.dumps(snap.as_dict(), indent=2, sort_keys=True))
        else:
            self.stdout.write(render_text(snap))


def _fmt_age(seconds: float | None) -> str:
    return "-" if seconds is None else humanize_seconds(seconds)


def render_text(snap: Snapshot) -> str:
    """A fixed-width table of the snapshot."""
    cols = [*STATE_NAMES, "expired", "oldest_ready", "done_5m", "done_60m", "total"]
    rows = []
    for m in snap.models:
        rows.append(
            [
                m.label,
                *[("-" if m.counts.get(s) is None else str(m.counts[s])) for s in STATE_NAMES],
                str(m.expired),
                _fmt_age(m.oldest_ready_age),
                "-" if m.done_last.get(5) is None else str(m.done_last[5]),
                "-" if m.done_last.get(60) is None else str(m.done_last[60]),
                str(m.total),
            ]
        )
    header = ["model", *cols]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for r in [header, *rows]:
        cells = [
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append("  ".join(cells))
    if not rows:
        lines.append("(no claimable models)")
    lines.append("")
    lines.append(f"live workers: {len(snap.workers)}")
    for w in snap.workers:
        lines.append(
            f"  {w.worker_id}  host={w.hostname} pid={w.pid} threads={w.concurrency} "
            f"in_flight={w.in_flight} processed={w.processed} seen={_fmt_age(w.seen_ago)} ago"
        )
    return "\n".join(lines)
