"""The worker's options, each declared once: :data:`OPTIONS`.

One :class:`~django_taskclaim.config.commandline.Option` per option (its keyword, its
command-line spellings, type, default, bounds and help: the type every command's options
share) drives the command line of ``manage.py worker``
(:func:`add_arguments`, :func:`from_command_line`), the values of
:meth:`~django_taskclaim.worker.config.WorkerConfig.build` (:func:`resolve`: text or
Python values, checked with :func:`django_taskclaim.config.bounds.number`) and the
defaults of :class:`~django_taskclaim.worker.config.WorkerConfig` (:func:`default`).
``docs/worker.md`` lists them (``tests/config/test_settings_table.py`` keeps the two
equal). Imports only ``config/``; :mod:`.config` builds on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.core.management.base import CommandParser

from django_taskclaim.config import commandline
from django_taskclaim.config.bounds import DAY, MAX_LEASE, Bound
from django_taskclaim.config.commandline import Option
from django_taskclaim.config.settings import DEFAULTS

OPTIONS: tuple[Option, ...] = (
    Option(
        "concurrency", ("--concurrency", "-c"), int, 1, "threads (default 1)",
        Bound(1, 256, whole=True),
    ),
    Option(
        "processes", ("--processes", "-p"), int, 1,
        "worker processes under the supervisor that restarts them and releases a dead "
        "one's rows at once (default 1)",
        Bound(1, 256, whole=True),
    ),
    Option(
        "supervise", ("--no-supervisor",), bool, True,
        "run the worker in this one process, without the supervisor that kills it if it "
        "stalls past its leases: a body that stalls this process (a C call holding the "
        "GIL, SIGSTOP) may then run beside a second body of its row, unless your own "
        "supervisor kills a silent worker before its leases lapse",
    ),
    Option(
        "batch", ("--batch", "-b"), int, 1,
        "rows held per executor thread; one claim takes up to max(batch, concurrency)",
        Bound(1, 10_000, whole=True),
    ),
    Option(
        "lease", ("--lease",), float, None, "lease seconds (default: per model)",
        Bound(1.0, MAX_LEASE),
    ),
    Option(
        "poll", ("--poll",), float, None,
        "seconds between polls (default TASKCLAIM_POLL_INTERVAL)",
        Bound(0.01, 3600.0), setting="POLL_INTERVAL",
    ),
    Option(
        "ack_window", ("--ack-window",), float, None,
        "seconds completions may wait to be written together in one UPDATE "
        "(default TASKCLAIM_ACK_WINDOW; 0 = write each at once)",
        Bound(0.0, 60.0), setting="ACK_WINDOW",
    ),
    Option(
        "grace", ("--grace",), float, 30.0, "seconds running tasks get to finish on SIGTERM",
        Bound(0.0, DAY),
    ),
    Option("burst", ("--burst",), bool, False, "drain what is ready, then exit"),
    Option(
        "until_empty", ("--until-empty",), bool, False,
        "with --burst: also wait for rows scheduled later (retries) and rows other workers "
        "hold, and exit only when none is ready or processing",
    ),
    Option(
        "max_tasks", ("--max-tasks",), int, None, "exit after this many tasks",
        Bound(1, 10**12, whole=True),
    ),
    Option(
        "max_runtime", ("--max-runtime",), float, None, "exit after this many seconds",
        Bound(0.01, 366 * DAY),
    ),
    Option("worker_id", ("--worker-id",), str, None, "name recorded in locked_by"),
    Option(
        "using", ("--database",), str, "default",
        "database alias to drain; repeat for one fleet over several databases "
        "(default: TASKCLAIM_WORKER_DATABASES, else each model's router alias)",
        repeat=True,
    ),
    Option("reap", ("--no-reap",), bool, True, "do not reap periodically"),
    Option("queue", ("--queue",), str, None, "only rows whose queue_name is NAME"),
    Option(
        "scheduler", ("--no-scheduler",), bool, True,
        "do not enqueue the slots of @periodic schedules in this worker",
    ),
)  # fmt: skip

#: name -> :class:`Option`.
BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}


def default(name: str) -> Any:
    """The value of option ``name`` when it is not given: its setting's default, or its
    own (the defaults of :class:`~django_taskclaim.worker.config.WorkerConfig`)."""
    option = BY_NAME[name]
    return DEFAULTS[option.setting] if option.setting else option.default


def add_arguments(parser: CommandParser) -> None:
    """Every option on ``parser``. Values stay text (``None`` when not given) until
    :func:`resolve` checks them, so that every mistake gives one line naming the fix."""
    commandline.add_arguments(parser, OPTIONS)


def from_command_line(parsed: Mapping[str, Any]) -> dict[str, Any]:
    """The :meth:`WorkerConfig.build` keywords of the command's ``parsed`` options (a
    ``repeat`` option, ``--database``, goes to the fleet's plan instead)."""
    given: dict[str, Any] = {}
    for option in OPTIONS:
        if option.repeat:
            continue
        value = parsed[option.dest]
        if option.kind is bool:  # a switch: given, it turns the default over
            value = (not option.default) if value else None
        given[option.name] = value
    return given


def resolve(given: Mapping[str, Any], skip: Iterable[str] = ()) -> dict[str, Any]:
    """Every option but ``skip``, from ``given`` (text or Python values; missing or
    ``None``: not given) to its value: parsed and within its bounds, or its setting, or
    its default. A bad value raises
    :class:`~django_taskclaim.exceptions.ConfigurationError` naming the flag; an
    unknown name a ``TypeError``, as a keyword argument would."""
    skipped = set(skip)
    for name in given:
        if name not in BY_NAME or name in skipped:
            raise TypeError(f"WorkerConfig.build() got an unexpected keyword argument {name!r}")
    return {o.name: o.resolve(given.get(o.name)) for o in OPTIONS if o.name not in skipped}
