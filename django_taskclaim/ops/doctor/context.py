"""What the per-model checks share: the model, its options, its database, its figures."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections

from django_taskclaim.backends import DatabaseSQL, for_connection
from django_taskclaim.config.options import ClaimOptions, get_options
from django_taskclaim.model.queryset import as_claim_queryset
from django_taskclaim.ops.doctor.findings import Thresholds
from django_taskclaim.ops.figures import ModelStats, model_stats


@dataclass
class ModelContext:
    """One claimable model on one database, for the checks that look at its rows."""

    model: Any
    alias: str
    limits: Thresholds = field(default_factory=Thresholds)
    #: The database of the worker registry (``WorkerProcess``); default: :attr:`alias`.
    registry: str | None = None

    @cached_property
    def opts(self) -> ClaimOptions:
        """The model's claim options."""
        return get_options(self.model)

    @property
    def label(self) -> str:
        """``app_label.Model``."""
        return str(self.model._meta.label)

    @property
    def table(self) -> str:
        """The model's table name, unquoted."""
        return str(self.model._meta.db_table)

    @property
    def conn(self) -> Any:
        """The Django connection of :attr:`alias`."""
        return connections[self.alias]

    @property
    def sql(self) -> DatabaseSQL:
        """The vendor's statements for :attr:`alias`."""
        return for_connection(self.conn)

    def rows(self) -> Any:
        """Every row of the model on :attr:`alias`, as a claim queryset."""
        return as_claim_queryset(self.model._base_manager.using(self.alias).all())

    @cached_property
    def stats(self) -> ModelStats:
        """The queue figures of ``taskclaim_stats`` (read once)."""
        return model_stats(self.model, using=self.alias)

    def command(self, name: str, *args: str) -> str:
        """``python manage.py <name> <args> <label>`` with ``--database`` when the alias is
        not the default one."""
        parts = ["python manage.py", name, *args, self.label]
        if self.alias != DEFAULT_DB_ALIAS:
            parts += ["--database", self.alias]
        return " ".join(parts)
