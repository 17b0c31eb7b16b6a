"""``manage.py taskclaim_relay <app_label.Model> --publisher rabbitmq|nats --url URL``:
publish an outbox model's committed rows to a broker."""

from __future__ import annotations

import os
import signal
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_taskclaim.config import bounds
from django_taskclaim.config.options import resolve_model
from django_taskclaim.exceptions import ConfigurationError
from django_taskclaim.management.verbosity import configure_logging
from django_taskclaim.outbox import PublishError, Relay, make_publisher, outbox_model
from django_taskclaim.outbox.relay import MAX_PARTITIONS

#: The publishers the command offers (Kafka's is untested: code only).
PUBLISHERS = ("rabbitmq", "nats")


class Command(BaseCommand):
    help = (
        "Publish the committed rows of an outbox model to RabbitMQ or NATS JetStream, at "
        "least once and in order per key. Several relays share the key-hash partitions "
        "(one holder each, by lease); SIGTERM finishes the batch in hand and stops."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("model", metavar="app_label.Model")
        parser.add_argument("--publisher", required=True, help="rabbitmq or nats")
        parser.add_argument("--url", required=True, help="broker URL (amqp://…, nats://…)")
        parser.add_argument(
            "--partitions",
            default="1",
            help="key-hash partitions; every relay of the model must use the same number",
        )
        parser.add_argument(
            "--max-partitions", default=None, help="hold at most this many (default: all)"
        )
        parser.add_argument("--batch", default="100", help="rows claimed per batch")
        parser.add_argument(
            "--lease", default="30", help="partition and row lease in seconds (default 30)"
        )
        parser.add_argument("--poll", default="0.5", help="seconds between idle passes")
        parser.add_argument("--exchange", default="", help="RabbitMQ exchange (default '')")
        parser.add_argument(
            "--timeout",
            default="10",
            help="seconds to wait for the broker: connecting, confirming a batch (default 10)",
        )
        parser.add_argument("--burst", action="store_true", help="drain, then exit")
        parser.add_argument("--database", default=None, help="database alias")

    def handle(self, *args: Any, **options: Any) -> None:
        configure_logging(int(options["verbosity"]))
        using = options["database"]
        if using is not None and using not in settings.DATABASES:
            raise CommandError(
                f"--database {using!r} is not in settings.DATABASES; "
                f"choose one of {', '.join(settings.DATABASES)}"
            )
        if options["publisher"] not in PUBLISHERS:
            raise CommandError(
                f"--publisher {options['publisher']!r} is not one of {', '.join(PUBLISHERS)}"
            )
        try:
            model = outbox_model(resolve_model(options["model"]))
            partitions = bounds.number(
                options["partitions"],
                "--partitions",
                bounds.Bound(1, MAX_PARTITIONS, whole=True),
                parse=True,
            )
            max_partitions = (
                None
                if options["max_partitions"] is None
                else bounds.number(
                    options["max_partitions"],
                    "--max-partitions",
                    bounds.Bound(1, partitions, whole=True),
                    parse=True,
                )
            )
            batch = bounds.number(options["batch"], "--batch", bounds.CLAIM_SIZE, parse=True)
            lease = bounds.number(options["lease"], "--lease", bounds.Bound(1, 3600), parse=True)
            poll = bounds.number(options["poll"], "--poll", bounds.Bound(0.01, 60), parse=True)
            timeout = bounds.number(
                options["timeout"], "--timeout", bounds.Bound(0.1, 300), parse=True
            )
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from None
        extra: dict[str, Any] = {"timeout": float(timeout)}
        if options["publisher"] == "rabbitmq":
            extra["exchange"] = options["exchange"]
        try:
            publisher = make_publisher(options["publisher"], options["url"], **extra)
            publisher.connect()
        except ImportError as exc:
            raise CommandError(str(exc)) from None
        except (PublishError, ValueError) as exc:
            raise CommandError(
                f"{options['publisher']} broker at {options['url']} is unreachable: {exc}"
            ) from None
        relay = Relay(
            model,
            publisher,
            partitions=partitions,
            max_partitions=max_partitions,
            batch=batch,
            lease=lease,
            poll=poll,
            using=using,
        )

        def on_signal(signum: int, _frame: Any) -> None:
            if relay.stopping:  # second signal: exit now (leases end by themselves)
                os._exit(128 + signum)
            relay.stop()

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, on_signal)
        self.stdout.write(
            f"taskclaim relay {relay.owner} model={model._meta.label} "
            f"publisher={options['publisher']} partitions={partitions}"
        )
        self.stdout.flush()
        published = relay.run(burst=options["burst"])
        self.stdout.write(f"taskclaim relay stopped: {published} message(s) published")
