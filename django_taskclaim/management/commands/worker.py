"""``manage.py worker [app_label.Model ...]``: run workers for claimable models.

Parse (the options of :data:`django_taskclaim.worker.options.OPTIONS`), validate
(:func:`django_taskclaim.worker.fleet.plan`, an installed app's :data:`REFUSAL_HOOK`, the
schema), call (the supervisor and its one worker process by default, or ``--processes
N`` of them; one :class:`~django_taskclaim.worker.Worker` in this process with
``--no-supervisor``).
``manage.py taskclaim_worker`` is an alias of this command. It imports no contrib app.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from django.apps import apps
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connections
from django.db.models import Model

from django_taskclaim import contrib
from django_taskclaim.backends import for_connection
from django_taskclaim.checks.core import TAG
from django_taskclaim.exceptions import ConfigurationError
from django_taskclaim.management.suggest import suggest_options
from django_taskclaim.management.verbosity import configure_logging
from django_taskclaim.worker import EXIT_GRACE_EXPIRED, EXIT_OK, Worker
from django_taskclaim.worker.fleet import plan
from django_taskclaim.worker.options import add_arguments, from_command_line
from django_taskclaim.worker.preflight import check_now
from django_taskclaim.worker.supervisor import supervise

#: The hook an installed app's config may define to refuse a worker of some models:
#: ``taskclaim_worker_refusal(models, queue) -> str | None`` (one line, or ``None``).
REFUSAL_HOOK = "taskclaim_worker_refusal"


def missing_contrib_app(label: str) -> str | None:
    """For ``label`` of a contrib app that is not installed (``taskclaim_tasks.QueuedTask``
    without ``django_taskclaim.contrib.tasks``), one line naming the app to add; else
    ``None``. The contrib apps are those of :data:`django_taskclaim.contrib.APPS`."""
    app = contrib.APPS.get(label.partition(".")[0]) if isinstance(label, str) else None
    if app is None or apps.is_installed(app):
        return None
    return (
        f"{label} is the model of {app!r}, which is not installed: add {app!r} to "
        "INSTALLED_APPS, then run python manage.py migrate"
    )


def app_refusal(models: list[type[Model]], queue: str | None) -> str | None:
    """The first line of an installed app's :data:`REFUSAL_HOOK` refusing a worker of
    ``models`` with ``--queue queue`` (the tasks backend: Django's check of ``TASKS``,
    ``--queue`` against its ``QUEUES``), or ``None``."""
    for config in apps.get_app_configs():
        hook = getattr(config, REFUSAL_HOOK, None)
        refused = hook(models, queue) if hook is not None else None
        if refused is not None:
            return str(refused)
    return None


def shareable(using: str) -> bool:
    """Whether the supervisor can run the worker of database ``using`` in a child: it
    forks (POSIX), and the child must see the rows (not SQLite in memory, which only the
    connection that made it sees)."""
    conn = connections[using]
    private = for_connection(conn).private_to_one_connection(conn.settings_dict)
    return hasattr(os, "fork") and not private


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

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        """Django's parser; a mistyped option names the closest one (``--concurency``:
        did you mean ``--concurrency``?)."""
        return suggest_options(super().create_parser(prog_name, subcommand, **kwargs))

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("models", nargs="*", metavar="app_label.Model")
        add_arguments(parser)  # every option of worker.options.OPTIONS

    def handle(self, *args: Any, **options: Any) -> None:
        configure_logging(int(options["verbosity"]))
        self.check(tags=[TAG])  # settings, claim options, poolers: SystemCheckError if wrong
        supervised = options["processes"] is not None
        for label in options["models"]:
            missing = missing_contrib_app(label)
            if missing is not None:
                raise CommandError(missing)
        try:
            configs = plan(options["models"], options["database"], **from_command_line(options))
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from None
        refused = app_refusal([m for c in configs for m in c.models], options["queue"])
        if refused is not None:  # an app's own refusal (the tasks backend's check of TASKS)
            raise CommandError(refused)
        # The schema checked once here, before any process starts (each worker checks
        # again once its database answers, which covers a database down just now).
        problem = check_now(configs)
        if problem is not None:
            raise CommandError(problem)
        config = configs[0]
        if not config.supervise and len(configs) > 1:
            raise CommandError(
                "a fleet over several databases runs one supervised worker per database, "
                "which --no-supervisor turns off: give one --database with it"
            )
        if supervised or len(configs) > 1:
            code = supervise(configs, config.processes, self._say)
        elif config.supervise and shareable(config.using):
            # The default: one worker process under the supervisor, which kills it before
            # its leases can lapse if a body stalls it (ONE BODY AT A TIME).
            code = supervise(configs, 1, self._say, single=True)
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
