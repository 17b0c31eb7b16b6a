"""``manage.py reaper [app_label.Model ...]``: recover rows stuck in processing (also
``manage.py taskclaim_reap``).

Its options are :data:`OPTIONS`, each a :class:`~django_taskclaim.config.commandline.Option`
(the type every command's options share), bounds included."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, router

from django_taskclaim.config.bounds import DAY, Bound
from django_taskclaim.config.commandline import Option, add_arguments, parsed_values
from django_taskclaim.config.discovery import claimable_models, resolve_model
from django_taskclaim.config.options import get_options
from django_taskclaim.exceptions import ConfigurationError
from django_taskclaim.management.verbosity import configure_logging
from django_taskclaim.recovery.reap import recover_and_release, repeat_until_signalled
from django_taskclaim.rules import lease_running_q

#: Every option of the command, in the order ``--help`` lists them.
OPTIONS: tuple[Option, ...] = (
    Option("once", ("--once",), bool, False, "one pass, then exit (default)"),
    Option(
        "interval", ("--interval",), float, None, "loop, one pass every N seconds",
        Bound(0.1, DAY),
    ),
    Option("dry_run", ("--dry-run",), bool, False, "count only, change nothing"),
    Option(
        "batch", ("--batch",), int, None, "rows per statement",
        Bound(1, 100_000, whole=True),
    ),
    Option("database", ("--database",), str, None, "database alias"),
    Option(
        "release_worker", ("--release-worker",), str, None,
        "also release, at once, every row held by this worker (repeatable). Only for a "
        "worker you know is dead: a live one keeps running its task while another worker "
        "starts the same row.",
        repeat=True, metavar="WORKER_ID",
    ),
)  # fmt: skip
BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}


class Command(BaseCommand):
    help = (
        "Put rows whose lease expired back to ready, or to failed once their attempts are "
        "used up. Runs once, or every --interval seconds. Rows with a valid lease are never "
        "touched, unless --release-worker names a worker you know is dead."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("models", nargs="*", metavar="app_label.Model")
        add_arguments(parser, OPTIONS)

    def handle(self, *args: Any, **options: Any) -> None:
        configure_logging(int(options["verbosity"]))
        given = parsed_values(options, OPTIONS)
        using = given["database"]
        if using is not None and using not in settings.DATABASES:
            raise CommandError(
                f"--database {using!r} is not in settings.DATABASES; "
                f"choose one of {', '.join(settings.DATABASES)}"
            )
        interval = BY_NAME["interval"].resolve(given["interval"], error=CommandError)
        batch = BY_NAME["batch"].resolve(given["batch"], error=CommandError)
        released: list[str] = given["release_worker"] or []
        if any(not w.strip() for w in released):
            raise CommandError("--release-worker needs a worker id (see taskclaim_stats)")
        if given["once"] and interval is not None:
            raise CommandError("--once and --interval contradict each other: give one of them")
        try:
            targets = [resolve_model(label) for label in options["models"]]
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from None
        if not targets:
            targets = list(claimable_models())
        if not targets:
            raise CommandError("no claimable model is installed: nothing to reap")

        def one_pass() -> None:
            result = recover_and_release(
                targets,
                release_workers=released,
                using=using,
                dry_run=given["dry_run"],
                batch_size=batch,
            )
            dry = given["dry_run"]
            verb, fail_verb = ("would requeue", "would fail") if dry else ("requeued", "failed")
            if dry:
                also = ", and release the named workers' rows" if released else ""
                self.stdout.write(
                    "dry run: nothing is changed. One pass would put these rows back to "
                    f"ready (lease expired) or to failed (attempts used up){also}:"
                )
            for model in targets:
                counts = result.per_model.get(model._meta.label, {"requeued": 0, "failed": 0})
                label = model._meta.label
                line = f"{label}: {verb}={counts['requeued']} {fail_verb}={counts['failed']}"
                if dry:
                    held = held_with_valid_lease(model, using, released)
                    line += f"; {held} held with a valid lease (left alone)"
                self.stdout.write(line)
            self.stdout.write(f"total: {verb}={result.requeued} {fail_verb}={result.failed}")
            self.stdout.flush()

        if interval is None:
            try:
                one_pass()
            except DatabaseError as exc:
                raise CommandError(f"database error: {str(exc).strip().splitlines()[0]}") from None
            return
        repeat_until_signalled(
            interval,
            one_pass,
            lambda exc: self.stderr.write(f"reap failed: {str(exc).strip().splitlines()[0]}"),
        )


def held_with_valid_lease(model: Any, using: str | None, released: list[str]) -> int:
    """Rows of ``model`` in processing whose lease runs (database clock), not held by a
    worker named for release: what a pass leaves alone."""
    opts = get_options(model)
    qs = model._base_manager.db_manager(using or router.db_for_write(model)).filter(
        lease_running_q(opts)
    )
    if released and opts.has("locked_by"):
        qs = qs.exclude(locked_by__in=released)
    return int(qs.count())
