"""``manage.py demo``: the whole example in one command (see docs/example.md)."""

from __future__ import annotations

import os
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from documents.demo import Demo, DemoOptions


def _env_number(name: str, kind: type, default: Any) -> Any:
    raw = os.environ.get(name, "")
    if not raw:
        return default
    try:
        return kind(raw)
    except ValueError:
        raise CommandError(f"{name}={raw!r} is not a valid {kind.__name__}") from None


class Command(BaseCommand):
    help = (
        "Migrate, create the admin user, seed documents, run workers and the reaper until "
        "every document is done or failed, with a live progress bar and a summary. "
        "Defaults come from DEMO_DOCS, DEMO_JOBS, DEMO_WORKERS, DEMO_CONCURRENCY, DEMO_TIMEOUT."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--docs", type=int, default=None)
        parser.add_argument("--jobs", type=int, default=None)
        parser.add_argument("--workers", type=int, default=None)
        parser.add_argument("--concurrency", type=int, default=None)
        parser.add_argument("--timeout", type=float, default=None)
        parser.add_argument(
            "--setup-only", action="store_true", help="migrate and create the admin user only"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        docs = (
            options["docs"] if options["docs"] is not None else _env_number("DEMO_DOCS", int, 1000)
        )
        o = DemoOptions(
            docs=docs,
            jobs=options["jobs"]
            if options["jobs"] is not None
            else _env_number("DEMO_JOBS", int, max(1, docs // 10)),
            workers=options["workers"] or _env_number("DEMO_WORKERS", int, 3),
            concurrency=options["concurrency"] or _env_number("DEMO_CONCURRENCY", int, 4),
            timeout=options["timeout"] or _env_number("DEMO_TIMEOUT", float, 600.0),
        )
        if o.docs < 1 or o.jobs < 0 or o.workers < 1 or o.concurrency < 1:
            raise CommandError("--docs, --workers and --concurrency must be >= 1, --jobs >= 0")
        demo = Demo(o, sys.stdout)
        if options["setup_only"]:
            username, password = demo.prepare()
            self.stdout.write(f"admin user {username!r} password {password!r}")
            return
        code = demo.run()
        if code:
            sys.exit(code)
