"""List filters of a claimable model's changelist: status, lease and error."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db import models
from django.db.models import Q
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from django_taskclaim.admin.display import state_label
from django_taskclaim.config.options import get_options
from django_taskclaim.row.status import STATE_NAMES
from django_taskclaim.rules import lease_expired_q, lease_running_q

__all__ = ["ClaimStatusFilter", "ErrorFilter", "LeaseFilter"]


class ClaimStatusFilter(admin.SimpleListFilter):
    """Filter by logical state; works for mapped (e.g. integer) status columns too."""

    title = _("task status")
    parameter_name = "taskclaim_status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        """The logical states the model maps, with their labels."""
        opts = get_options(model_admin.model)
        return [(s, state_label(s)) for s in STATE_NAMES if opts.statuses.get(s) is not None]

    def queryset(self, request: HttpRequest, queryset: models.QuerySet) -> models.QuerySet:
        """The rows in the chosen state; all rows for no (or an unmapped) choice."""
        value = self.value()
        opts = get_options(queryset.model)
        if value and opts.statuses.get(value) is not None:
            return queryset.filter(opts.status_q(value))
        return queryset


class LeaseFilter(admin.SimpleListFilter):
    """``processing`` rows whose lease ran out (by the database clock), or still runs."""

    title = _("lease")
    parameter_name = "taskclaim_lease"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        """``expired`` and ``running``."""
        return [("expired", _("lease expired")), ("running", _("lease running"))]

    def queryset(self, request: HttpRequest, queryset: models.QuerySet) -> models.QuerySet:
        """``expired``: the rows a reap would take back (:func:`lease_expired_q`);
        ``running``: the other ``processing`` rows with a lease."""
        opts = get_options(queryset.model)
        if self.value() == "expired":
            return queryset.filter(lease_expired_q(opts))
        if self.value() == "running":
            return queryset.filter(lease_running_q(opts))
        return queryset


class ErrorFilter(admin.SimpleListFilter):
    """Rows that failed with an error message, or any row carrying one."""

    title = _("error")
    parameter_name = "taskclaim_error"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        """``failed`` (failed with an error), ``any`` (has an error), ``none``."""
        return [
            ("failed", _("failed with error")),
            ("any", _("has an error")),
            ("none", _("no error")),
        ]

    def queryset(self, request: HttpRequest, queryset: models.QuerySet) -> models.QuerySet:
        """The rows matching the choice; all rows for no choice."""
        opts = get_options(queryset.model)
        has_error = ~Q(last_error="") & Q(last_error__isnull=False)
        if self.value() == "failed":
            return queryset.filter(opts.status_q("failed")).filter(has_error)
        if self.value() == "any":
            return queryset.filter(has_error)
        if self.value() == "none":
            return queryset.filter(Q(last_error="") | Q(last_error__isnull=True))
        return queryset
