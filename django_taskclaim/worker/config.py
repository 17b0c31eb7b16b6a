"""The worker's configuration: every option validated once, before anything runs.

:meth:`WorkerConfig.build` turns user input (command-line text or Python values) into
a :class:`WorkerConfig` or raises :class:`~django_taskclaim.exceptions.ConfigurationError`
with one line naming the fix. It touches no table.
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
from django_taskclaim.config.options import claimable_models, get_options, resolve_model
from django_taskclaim.config.settings import taskclaim_settings
from django_taskclaim.exceptions import ConfigurationError


def _option(value: Any, name: str) -> Any:
    """A worker option (``None`` = not given) checked against :data:`~..bounds.WORKER`."""
    return None if value is None else bounds.number(value, name, bounds.WORKER[name], parse=True)


@dataclass
class WorkerConfig:
    """Validated settings of one worker process (see :meth:`WorkerConfig.build`)."""

    models: list[type[Model]]
    using: str = "default"
    concurrency: int = 1
    batch: int = 1
    lease: float | None = None
    poll: float = 1.0
    ack_window: float = 0.05
    grace: float = 30.0
    processes: int = 1
    burst: bool = False
    until_empty: bool = False
    max_tasks: int | None = None
    max_runtime: float | None = None
    worker_id: str | None = None
    reap: bool = True
    queue: str | None = None
    scheduler: bool = True
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
        cls,
        labels: Sequence[str] = (),
        *,
        using: str | None = None,
        concurrency: Any = 1,
        processes: Any = 1,
        batch: Any = 1,
        lease: Any = None,
        poll: Any = None,
        ack_window: Any = None,
        grace: Any = 30,
        burst: bool = False,
        max_tasks: Any = None,
        max_runtime: Any = None,
        worker_id: str | None = None,
        reap: bool = True,
        queue: str | None = None,
        until_empty: bool = False,
        scheduler: bool = True,
    ) -> WorkerConfig:
        """Validate user input; raise :class:`ConfigurationError` naming the fix.

        Touches no table: a refused configuration leaves the database unchanged.
        """
        using = using or "default"
        if using not in settings.DATABASES:
            raise ConfigurationError(
                f"--database {using!r} is not in settings.DATABASES; "
                f"choose one of {', '.join(settings.DATABASES)}"
            )
        if until_empty and not burst:
            raise ConfigurationError(
                "--until-empty goes with --burst (a worker without --burst never stops "
                "when the queue is empty)"
            )
        concurrency = _option(concurrency, "--concurrency")
        processes = _option(processes, "--processes")
        batch = _option(batch, "--batch")
        lease = _option(lease, "--lease")
        poll = _option(poll if poll is not None else taskclaim_settings.POLL_INTERVAL, "--poll")
        ack_window = _option(
            ack_window if ack_window is not None else taskclaim_settings.ACK_WINDOW,
            "--ack-window",
        )
        grace = _option(grace, "--grace")
        max_tasks = _option(max_tasks, "--max-tasks")
        max_runtime = _option(max_runtime, "--max-runtime")
        beat = heartbeat_setting()
        if worker_id is not None and (not worker_id.strip() or len(worker_id) > 200):
            raise ConfigurationError("--worker-id must be 1 to 200 characters")
        conn = connections[using]
        private = for_connection(conn).private_to_one_connection(conn.settings_dict)
        if private and (concurrency > 1 or processes > 1):
            raise ConfigurationError(
                "an in-memory SQLite database is private to one connection: use a "
                "database file, or --concurrency 1 --processes 1"
            )
        explicit = bool(labels)
        chosen: list[type[Model]] = []
        for label in labels:
            model = resolve_model(label)
            if model not in chosen:
                chosen.append(model)
        if not explicit:
            chosen = [m for m in claimable_models() if handler_or_none(m) is not None]
            if not chosen:
                raise ConfigurationError(
                    "no claimable model with a processing entry point is installed: give a "
                    "process(self) method or ClaimMeta.handler to a model using "
                    "ClaimableModel, or name models as app_label.ModelName"
                )
        if queue is not None:
            with_queue = [m for m in chosen if has_field(m, "queue_name")]
            if explicit and len(with_queue) != len(chosen):
                missing = [m._meta.label for m in chosen if m not in with_queue]
                raise ConfigurationError(
                    f"--queue needs a queue_name field; {', '.join(missing)} has none: "
                    "drop --queue or those models"
                )
            if not with_queue:
                raise ConfigurationError(
                    "--queue needs models with a queue_name field and none has one; drop --queue"
                )
            chosen = with_queue
        handlers: dict[type[Model], Callable[[Any], Any]] = {}
        strategies: dict[type[Model], str] = {}
        for model in chosen:
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
            if beat is not None and beat >= model_lease / 2:
                raise ConfigurationError(
                    f"TASKCLAIM_HEARTBEAT_INTERVAL ({beat:g}s) must be under half the lease "
                    f"of {model._meta.label} ({model_lease:g}s), or one late heartbeat "
                    "lets a live lease lapse: lower it or lengthen the lease"
                )
        return cls(
            models=chosen,
            using=using,
            concurrency=concurrency,
            processes=processes,
            batch=batch,
            lease=lease,
            poll=poll,
            ack_window=ack_window,
            grace=grace,
            burst=bool(burst),
            until_empty=bool(until_empty),
            max_tasks=max_tasks,
            max_runtime=max_runtime,
            worker_id=worker_id,
            reap=bool(reap),
            queue=queue,
            scheduler=bool(scheduler),
            handlers=handlers,
            strategies=strategies,
        )


def heartbeat_setting() -> float | None:
    """``TASKCLAIM_HEARTBEAT_INTERVAL`` validated (``None`` = a third of each lease)."""
    value = taskclaim_settings.HEARTBEAT_INTERVAL
    if value is None:
        return None
    name = "TASKCLAIM_HEARTBEAT_INTERVAL"
    return float(bounds.number(value, name, bounds.SETTINGS["HEARTBEAT_INTERVAL"]))


def has_field(model: type[Model], name: str) -> bool:
    return any(f.name == name for f in model._meta.concrete_fields)


def handler_or_none(model: type[Model]) -> Callable[[Any], Any] | None:
    return get_options(model).handler()
