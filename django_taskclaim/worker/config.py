"""The worker's configuration: every option validated once, before anything runs.

:meth:`WorkerConfig.build` turns user input (command-line text or Python values) into
a :class:`WorkerConfig` or raises :class:`~django_taskclaim.exceptions.ConfigurationError`
with one line naming the fix. It touches no table. The options themselves (type,
default, bounds, help) are declared once in :mod:`django_taskclaim.worker.options`; this
module adds the rules that join them, the models served and their entry points.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import connections
from django.db.models import Model

from django_taskclaim.backends import for_connection
from django_taskclaim.claim import STRATEGIES
from django_taskclaim.config import bounds
from django_taskclaim.config.discovery import claimable_models, resolve_model
from django_taskclaim.config.options import get_options
from django_taskclaim.config.settings import BOUNDS, taskclaim_settings
from django_taskclaim.exceptions import ConfigurationError
from django_taskclaim.settle.deadline import grace, uses_deadlines
from django_taskclaim.worker.options import default, resolve


@dataclass
class WorkerConfig:
    """Validated settings of one worker process (see :meth:`WorkerConfig.build`); the
    defaults are those of :data:`~django_taskclaim.worker.options.OPTIONS`."""

    models: list[type[Model]]
    using: str = default("using")
    concurrency: int = default("concurrency")
    batch: int = default("batch")
    lease: float | None = default("lease")
    poll: float = default("poll")
    ack_window: float = default("ack_window")
    grace: float = default("grace")
    processes: int = default("processes")
    supervise: bool = default("supervise")
    burst: bool = default("burst")
    until_empty: bool = default("until_empty")
    max_tasks: int | None = default("max_tasks")
    max_runtime: float | None = default("max_runtime")
    worker_id: str | None = default("worker_id")
    reap: bool = default("reap")
    queue: str | None = default("queue")
    scheduler: bool = default("scheduler")
    handlers: dict[type[Model], Callable[[Any], Any]] = field(default_factory=dict)
    strategies: dict[type[Model], str] = field(default_factory=dict)

    def lease_for(self, model: type[Model]) -> float:
        """Seconds the rows of ``model`` are leased for (``--lease`` or its ``ClaimMeta``)."""
        return float(self.lease or get_options(model).lease)

    @property
    def shortest_lease(self) -> float:
        """The shortest lease of the models served (what the heartbeat must keep up with)."""
        return min(self.lease_for(m) for m in self.models)

    @property
    def heartbeat_interval(self) -> float:
        """Seconds between lease extensions: ``TASKCLAIM_HEARTBEAT_INTERVAL`` or a third
        of the shortest lease; never more than half of it, so one missed beat does not
        lose a row."""
        configured = heartbeat_setting()
        if configured:
            return min(configured, self.shortest_lease / 2)
        return self.shortest_lease / 3

    @classmethod
    def build(
        cls, labels: Sequence[str] = (), *, using: str | None = None, **options: Any
    ) -> WorkerConfig:
        """Validate user input; raise :class:`ConfigurationError` naming the fix.

        ``labels`` name the models (``app_label.Model``; none: every claimable model with
        a processing entry point), ``using`` the database; ``options`` are the other
        options of :data:`~django_taskclaim.worker.options.OPTIONS` by name
        (``concurrency=4``, ``burst=True``, ``lease="30"`` …), each optional.
        Touches no table: a refused configuration leaves the database unchanged.
        """
        using = _database(using)
        _check_until_empty(options)
        _check_supervision(options)
        values = resolve(options, skip=["using"])
        beat = heartbeat_setting()
        _check_worker_id(values["worker_id"])
        _check_connection_sharing(using, values["concurrency"], values["processes"])
        models = _models(labels, values["queue"])
        handlers, strategies = _entry_points(models, values["lease"], beat)
        return cls(models=models, using=using, handlers=handlers, strategies=strategies, **values)


def _database(using: str | None) -> str:
    """The alias to claim from (``default`` when none is given), one of ``DATABASES``."""
    using = using or "default"
    if using not in settings.DATABASES:
        raise ConfigurationError(
            f"--database {using!r} is not in settings.DATABASES; "
            f"choose one of {', '.join(settings.DATABASES)}"
        )
    return using


def _check_until_empty(options: dict[str, Any]) -> None:
    if options.get("until_empty") and not options.get("burst"):
        raise ConfigurationError(
            "--until-empty goes with --burst (a worker without --burst never stops "
            "when the queue is empty)"
        )


def _check_supervision(options: dict[str, Any]) -> None:
    if options.get("supervise") is False and options.get("processes") is not None:
        raise ConfigurationError(
            "--processes runs worker processes under the supervisor, which --no-supervisor "
            "turns off: give one of them (--no-supervisor runs the worker in one process)"
        )


def _check_worker_id(worker_id: str | None) -> None:
    if worker_id is not None and (not worker_id.strip() or len(worker_id) > 200):
        raise ConfigurationError("--worker-id must be 1 to 200 characters")


def _check_connection_sharing(using: str, concurrency: int, processes: int) -> None:
    """An in-memory SQLite database is seen by one connection only: one thread, one process."""
    conn = connections[using]
    private = for_connection(conn).private_to_one_connection(conn.settings_dict)
    if private and (concurrency > 1 or processes > 1):
        raise ConfigurationError(
            "an in-memory SQLite database is private to one connection: use a "
            "database file, or --concurrency 1 --processes 1"
        )


def _models(labels: Sequence[str], queue: str | None) -> list[type[Model]]:
    """The models served: those named (each once, in order), else every claimable model
    with a processing entry point (``PeriodicRun`` only where periodic functions are used:
    :func:`~django_taskclaim.periodic.reported.reported_models`); with ``--queue``, those with
    a ``queue_name`` field."""
    chosen: list[type[Model]] = []
    for label in labels:
        model = resolve_model(label)
        if model not in chosen:
            chosen.append(model)
    if not labels:
        from django_taskclaim.periodic.reported import without_unused  # needs the app registry

        chosen = without_unused(m for m in claimable_models() if handler_or_none(m) is not None)
        if not chosen:
            raise ConfigurationError(
                "no claimable model with a processing entry point is installed: give a "
                "process(self) method or ClaimMeta.handler to a model using "
                "ClaimableModel, or name models as app_label.ModelName"
            )
    if queue is None:
        return chosen
    with_queue = [m for m in chosen if has_field(m, "queue_name")]
    if labels and len(with_queue) != len(chosen):
        missing = [m._meta.label for m in chosen if m not in with_queue]
        raise ConfigurationError(
            f"--queue needs a queue_name field; {', '.join(missing)} has none: "
            "drop --queue or those models"
        )
    if not with_queue:
        raise ConfigurationError(
            "--queue needs models with a queue_name field and none has one; drop --queue"
        )
    return with_queue


def _entry_points(
    models: list[type[Model]], lease: float | None, beat: float | None
) -> tuple[dict[type[Model], Callable[[Any], Any]], dict[type[Model], str]]:
    """The handler and the strategy of each model, refused where the worker cannot run
    it: no entry point, a strategy that needs the caller's transaction, a lease that
    ``TASKCLAIM_HEARTBEAT_INTERVAL`` (``beat``) cannot keep alive."""
    handlers: dict[type[Model], Callable[[Any], Any]] = {}
    strategies: dict[type[Model], str] = {}
    for model in models:
        handler = handler_or_none(model)
        if handler is None:
            raise ConfigurationError(
                f"{model._meta.label} has no processing entry point: define a "
                "process(self) method on it or set ClaimMeta.handler"
            )
        handlers[model] = handler
        opts = get_options(model)
        name = opts.strategy
        if name in STRATEGIES and STRATEGIES[name].needs_caller_atomic:
            raise ConfigurationError(
                f"{model._meta.label} uses strategy {name!r}, which keeps a transaction "
                "open around the task body; the worker runs tasks outside transactions: "
                "set ClaimMeta.strategy to 'auto'"
            )
        strategies[model] = name
        model_lease = float(lease or opts.lease)  # validates the model's lease now
        if uses_deadlines(model):  # validates its timeout now, and the grace
            grace(model_lease)
        if beat is not None and beat >= model_lease / 2:
            raise ConfigurationError(
                f"TASKCLAIM_HEARTBEAT_INTERVAL ({beat:g}s) must be under half the lease "
                f"of {model._meta.label} ({model_lease:g}s), or one late heartbeat "
                "lets a live lease lapse: lower it or lengthen the lease"
            )
    return handlers, strategies


def heartbeat_setting() -> float | None:
    """``TASKCLAIM_HEARTBEAT_INTERVAL`` validated (``None`` = a third of each lease)."""
    value = taskclaim_settings.HEARTBEAT_INTERVAL
    if value is None:
        return None
    name = "TASKCLAIM_HEARTBEAT_INTERVAL"
    return float(bounds.number(value, name, BOUNDS["HEARTBEAT_INTERVAL"]))


def has_field(model: type[Model], name: str) -> bool:
    return any(f.name == name for f in model._meta.concrete_fields)


def handler_or_none(model: type[Model]) -> Callable[[Any], Any] | None:
    return get_options(model).handler()
