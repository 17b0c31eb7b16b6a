"""What one worker serves: its models' rows on its database, ``--queue`` applied, what
is left of them (``--burst``'s summary, ``--until-empty``'s test), the strategy each
resolves to and whether the worker can be woken by ``LISTEN``."""

from __future__ import annotations

import os
from typing import Any

from django.db import connections
from django.db.models import Min, Model

from django_taskclaim.backends import for_alias, for_connection
from django_taskclaim.claim import resolve
from django_taskclaim.claim.scope import on_queue
from django_taskclaim.config.options import get_options
from django_taskclaim.config.settings import taskclaim_settings
from django_taskclaim.db import db_now
from django_taskclaim.model.queryset import ClaimQuerySet
from django_taskclaim.worker.config import WorkerConfig


class Scope:
    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.using = config.using
        self.labels = {m: m._meta.label for m in config.models}

    def queryset(self, model: type[Model]) -> Any:
        """The rows of ``model`` this worker serves (``--queue`` applied)."""
        qs = model._default_manager.db_manager(self.using).all()
        if not hasattr(qs, "claim"):
            qs = ClaimQuerySet(model=model, using=self.using)
        if self.config.queue is not None:
            qs = on_queue(qs, self.config.queue)  # compiled once, not per claim
        return qs

    def describe(self, worker_id: str, lease: float) -> str:
        """The worker's startup line: what runs where (never credentials)."""
        conn = connections[self.using]
        strategies = ",".join(f"{label}={self.strategy(m)}" for m, label in self.labels.items())
        c = self.config
        return (
            f"taskclaim worker id={worker_id} pid={os.getpid()} "
            f"models={','.join(self.labels.values())} strategy={strategies} "
            f"concurrency={c.concurrency} batch={c.batch} "
            f"lease={lease:g}s database={self.using} vendor={for_connection(conn).vendor} "
            f"wakeup={'listen+poll' if self.use_listen() else 'poll'} poll={c.poll:g}s "
            f"ack-window={c.ack_window:g}s reap={'on' if c.reap else 'off'}"
            + (" burst" if c.burst else "")
            + (f" queue={c.queue}" if c.queue else "")
        )

    def leftover(self) -> str:
        """One line for the end of a ``--burst`` run: what is left, by state, and when the
        next scheduled row comes due (database clock)."""

        parts = []
        now = db_now(self.using)
        for model in self.config.models:
            opts = get_options(model)
            qs = self.queryset(model)
            stats = qs.stats()  # one GROUP BY, counts per state
            counts = {k: stats.get(k, 0) for k in ("ready", "processing", "failed")}
            text = " ".join(f"{k}={v}" for k, v in counts.items())
            if counts["ready"] and opts.has("run_after"):
                ready = qs.filter(opts.status_q("ready"))
                due = ready.filter(run_after__gt=now).aggregate(m=Min("run_after"))["m"]
                if due is not None:
                    text += f" (next due in {(due - now).total_seconds():.1f}s)"
                else:
                    text += " (due now)"
            parts.append(f"{self.labels[model]}: {text}")
        return "burst finished; left: " + "; ".join(parts)

    def work_left(self) -> bool:
        """``--until-empty``: whether any served row is still ``ready`` (scheduled for
        later, e.g. a retry) or ``processing`` (held by a worker)."""
        for model in self.config.models:
            opts = get_options(model)
            rows = self.queryset(model).filter(opts.status_q("ready") | opts.status_q("processing"))
            if rows.exists():
                return True
        return False

    def use_listen(self) -> bool:
        """LISTEN on PostgreSQL unless no model notifies or a transaction pooler is in
        front (a pgBouncer in transaction mode does not keep a LISTEN session)."""
        if taskclaim_settings.POOLER_MODE == "transaction":
            return False
        return for_alias(self.using).supports_notify and any(
            get_options(m).notify for m in self.config.models
        )

    def strategy(self, model: type[Model]) -> str:
        """The claim strategy ``model`` resolves to on this database (for the startup line)."""
        name = self.config.strategies.get(model) or "auto"
        try:
            return resolve(name, self.using).name
        except Exception:
            return name
