"""``manage.py taskclaim_worker [app_label.Model ...]``: run workers for claimable models."""

from __future__ import annotations

import os
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from django_taskclaim.checks.core import TAG
from django_taskclaim.exceptions import ConfigurationError
from django_taskclaim.management.verbosity import configure_logging
from django_taskclaim.worker import EXIT_GRACE_EXPIRED, EXIT_OK, Worker
from django_taskclaim.worker.fleet import plan
from django_taskclaim.worker.preflight import check_now
from django_taskclaim.worker.supervisor import supervise


class Command(BaseCommand):
    help = (
        "Run a worker that claims and processes rows of claimable models "
        "(default: every claimable model with a processing entry point). "
        "Exit codes: 0 stopped cleanly, 1 invalid configuration, 2 usage error, "
        "3 tasks still running after --grace, 4 second signal, 5 executors kept crashing, "
        "6 --burst gave up on a database that kept failing."
    )
    # Only django-taskclaim's own checks run at start (see handle()): the whole project's
    # load the migration machinery and every configured database backend, which a
    # long-running worker would then carry for nothing (about 3 MB, and start-up time).
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        # Numbers are parsed as text and validated in handle(), so that every mistake
        # gives one line naming the fix.
        parser.add_argument("models", nargs="*", metavar="app_label.Model")
        parser.add_argument("--concurrency", "-c", default="1", help="threads (default 1)")
        parser.add_argument(
            "--processes",
            "-p",
            default=None,
            help="worker processes under a supervisor that restarts them and releases a "
            "dead one's rows at once (default: one process, no supervisor; give -p 1 for "
            "one supervised process)",
        )
        parser.add_argument(
            "--batch",
            "-b",
            default="1",
            help="rows held per executor thread; one claim takes up to max(batch, concurrency)",
        )
        parser.add_argument("--lease", default=None, help="lease seconds (default: per model)")
        parser.add_argument(
            "--poll", default=None, help="seconds between polls (default TASKCLAIM_POLL_INTERVAL)"
        )
        parser.add_argument(
            "--ack-window",
            default=None,
            help="seconds completions may wait to be written together in one UPDATE "
            "(default TASKCLAIM_ACK_WINDOW; 0 = write each at once)",
        )
        parser.add_argument(
            "--grace", default="30", help="seconds running tasks get to finish on SIGTERM"
        )
        parser.add_argument("--burst", action="store_true", help="drain what is ready, then exit")
        parser.add_argument(
            "--until-empty",
            action="store_true",
            help="with --burst: also wait for rows scheduled later (retries) and rows other "
            "workers hold, and exit only when none is ready or processing",
        )
        parser.add_argument("--max-tasks", default=None, help="exit after this many tasks")
        parser.add_argument("--max-runtime", default=None, help="exit after this many seconds")
        parser.add_argument("--worker-id", default=None, help="name recorded in locked_by")
        parser.add_argument(
            "--database",
            action="append",
            default=None,
            help="database alias to drain; repeat for one fleet over several databases "
            "(default: TASKCLAIM_WORKER_DATABASES, else each model's router alias)",
        )
        parser.add_argument("--no-reap", action="store_true", help="do not reap periodically")
        parser.add_argument("--queue", default=None, help="only rows whose queue_name is NAME")
        parser.add_argument(
            "--no-scheduler",
            action="store_true",
            help="do not enqueue the slots of @periodic schedules in this worker",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        configure_logging(int(options["verbosity"]))
        self.check(tags=[TAG])  # settings, claim options, poolers: SystemCheckError if wrong
        supervised = options["processes"] is not None
        try:
            configs = plan(
                options["models"],
                options["database"],
                concurrency=options["concurrency"],
                processes=options["processes"] or 1,
                batch=options["batch"],
                lease=options["lease"],
                poll=options["poll"],
                ack_window=options["ack_window"],
                grace=options["grace"],
                burst=options["burst"],
                until_empty=options["until_empty"],
                max_tasks=options["max_tasks"],
                max_runtime=options["max_runtime"],
                worker_id=options["worker_id"],
                reap=not options["no_reap"],
                queue=options["queue"],
                scheduler=not options["no_scheduler"],
            )
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from None
        # The schema checked once here, before any process starts (each worker checks
        # again once its database answers, which covers a database down just now).
        problem = check_now(configs)
        if problem is not None:
            raise CommandError(problem)
        config = configs[0]
        if supervised or len(configs) > 1:
            code = supervise(configs, config.processes, self._say)
        else:
            worker = Worker(config)
            code = worker.run(lambda: self._say(worker.describe()))
            if config.burst and code == EXIT_OK:
                try:
                    self._say(worker.leftover())
                except DatabaseError:
                    pass  # the summary is a courtesy; the run itself succeeded
        if code == EXIT_GRACE_EXPIRED:
            # Threads still run user code: do not wait for them at interpreter exit.
            self.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        if code != EXIT_OK:
            sys.exit(code)

    def _say(self, line: str) -> None:
        self.stdout.write(line)
        self.stdout.flush()
