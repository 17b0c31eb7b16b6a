"""``manage.py taskclaim_relay <app_label.Model> --publisher rabbitmq|nats [--url URL]``:
publish an outbox model's committed rows to a broker.

The broker URL is ``--url``, else the environment variable ``TASKCLAIM_RELAY_URL``,
else the setting of that name (:func:`broker_url`): the last two keep a password out
of ``ps`` and ``/proc/<pid>/cmdline``. Wherever the URL is printed, its password is
hidden (:func:`~django_taskclaim.redact.redact`).

Thin: it parses and validates the options (:data:`OPTIONS`, each a
:class:`~django_taskclaim.config.commandline.Option`; the numeric ones are declared once,
with their bounds, in :data:`django_taskclaim.outbox.options.RELAY_OPTIONS`) and calls
:func:`django_taskclaim.outbox.runner.open_relay` and
:func:`~django_taskclaim.outbox.runner.serve`.
"""

from __future__ import annotations

import os
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_taskclaim.config.commandline import Option, add_arguments, parsed_values
from django_taskclaim.config.discovery import resolve_model
from django_taskclaim.config.settings import taskclaim_settings
from django_taskclaim.exceptions import ConfigurationError
from django_taskclaim.management.verbosity import configure_logging
from django_taskclaim.outbox.options import flag_options, validate
from django_taskclaim.outbox.runner import open_relay, serve
from django_taskclaim.outbox.write import outbox_model

#: The publishers the command offers (Kafka's is untested: code only).
PUBLISHERS = ("rabbitmq", "nats")

#: The environment variable (and the setting) a broker URL is read from without ``--url``.
ENV_URL = "TASKCLAIM_RELAY_URL"

#: Every option of the command, in the order ``--help`` lists them.
OPTIONS: tuple[Option, ...] = (
    Option("publisher", ("--publisher",), str, None, "rabbitmq or nats", required=True),
    Option(
        "url",
        ("--url",),
        str,
        None,
        "broker URL (amqp://…, nats://…); default: the environment variable "
        f"{ENV_URL}, else the setting of that name (a password given here shows in ps)",
    ),
    *flag_options(),
    Option("exchange", ("--exchange",), str, "", "RabbitMQ exchange (default '')"),
    Option("burst", ("--burst",), bool, False, "drain, then exit"),
    Option("database", ("--database",), str, None, "database alias"),
)


def broker_url(given: str | None) -> str:
    """The broker URL: ``given`` (``--url``), else the environment variable
    :data:`ENV_URL`, else the setting ``TASKCLAIM_RELAY_URL``; a :class:`CommandError`
    saying where to put it when none is set."""
    url = given or os.environ.get(ENV_URL) or taskclaim_settings.RELAY_URL
    if not url:
        raise CommandError(
            f"no broker URL: set the environment variable {ENV_URL} (or the setting of that "
            "name), or pass --url (a password on the command line shows in ps)"
        )
    return str(url)


class Command(BaseCommand):
    help = (
        "Publish the committed rows of an outbox model to RabbitMQ or NATS JetStream, at "
        "least once and in order per key. Several relays share the key-hash partitions "
        "(one holder each, by lease); SIGTERM finishes the batch in hand and stops."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("model", metavar="app_label.Model")
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
        publisher = given["publisher"]
        if publisher not in PUBLISHERS:
            raise CommandError(f"--publisher {publisher!r} is not one of {', '.join(PUBLISHERS)}")
        url = broker_url(given["url"])
        try:
            model = outbox_model(resolve_model(options["model"]))
            values = validate({o.name: given[o.name] for o in flag_options()}, flags=True)
            relay = open_relay(
                model, publisher, url, values, exchange=given["exchange"], using=using
            )
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from None
        serve(relay, publisher, burst=given["burst"], write=self._line)

    def _line(self, text: str) -> None:
        self.stdout.write(text)
        self.stdout.flush()
