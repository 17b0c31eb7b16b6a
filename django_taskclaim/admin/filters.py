"""List filters of a claimable model's changelist: status, lease and error.

Each choice is one ``Q`` of the row's own columns (:meth:`ClaimFilter.choice_q`). The
changelist offers no facet counts ("Show counts": ``show_facets = ShowFacets.NEVER`` on
the admins, docs/admin.md); an admin that turns them back on gets, from these filters,
one ``COUNT(…) FILTER (WHERE <the choice's condition>)`` per choice in a single pass over
the listed rows, not Django's default ``pk IN (subquery)`` per choice, which PostgreSQL
runs as a subquery per row (quadratic in the rows)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db import models
from django.db.models import Count, Q
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from django_taskclaim.admin.display import state_label
from django_taskclaim.config.options import ClaimOptions, get_options
from django_taskclaim.row.status import STATE_NAMES
from django_taskclaim.rules import lease_expired_q, lease_running_q

__all__ = ["ClaimFilter", "ClaimStatusFilter", "ErrorFilter", "LeaseFilter"]


class ClaimFilter(admin.SimpleListFilter):
    """A filter whose choices are conditions on the row's columns (:meth:`choice_q`)."""

    def choice_q(self, value: str | None, opts: ClaimOptions) -> Q | None:
        """The condition of choice ``value``; ``None`` for no (or an unknown) choice."""
        raise NotImplementedError

    def queryset(self, request: HttpRequest, queryset: models.QuerySet) -> models.QuerySet:
        """The rows matching the chosen condition; all rows for no choice."""
        q = self.choice_q(self.value(), get_options(queryset.model))
        return queryset if q is None else queryset.filter(q)

    def get_facet_counts(self, pk_attname: str, filtered_qs: models.QuerySet) -> dict[str, Any]:
        """Facets (only where an admin turns ``show_facets`` back on): each choice's count
        as a conditional count over the listed rows, one pass for all choices."""
        opts = get_options(filtered_qs.model)
        counts: dict[str, Any] = {}
        for i, (value, _title) in enumerate(self.lookup_choices):
            q = self.choice_q(str(value), opts)
            if q is not None:
                counts[f"{i}__c"] = Count(pk_attname, filter=q)
        return counts


class ClaimStatusFilter(ClaimFilter):
    """Filter by logical state; works for mapped (e.g. integer) status columns too."""

    title = _("task status")
    parameter_name = "taskclaim_status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        """The logical states the model maps, with their labels."""
        opts = get_options(model_admin.model)
        return [(s, state_label(s)) for s in STATE_NAMES if opts.statuses.get(s) is not None]

    def choice_q(self, value: str | None, opts: ClaimOptions) -> Q | None:
        """The rows in state ``value``; ``None`` for no (or an unmapped) state."""
        if value and opts.statuses.get(value) is not None:
            return opts.status_q(value)
        return None


class LeaseFilter(ClaimFilter):
    """``processing`` rows whose lease ran out (by the database clock), or still runs."""

    title = _("lease")
    parameter_name = "taskclaim_lease"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        """``expired`` and ``running``."""
        return [("expired", _("lease expired")), ("running", _("lease running"))]

    def choice_q(self, value: str | None, opts: ClaimOptions) -> Q | None:
        """``expired``: the rows a reap would take back (:func:`lease_expired_q`);
        ``running``: the other ``processing`` rows with a lease."""
        if value == "expired":
            return lease_expired_q(opts)
        if value == "running":
            return lease_running_q(opts)
        return None


class ErrorFilter(ClaimFilter):
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

    def choice_q(self, value: str | None, opts: ClaimOptions) -> Q | None:
        """The rows matching choice ``value``."""
        has_error = ~Q(last_error="") & Q(last_error__isnull=False)
        if value == "failed":
            return opts.status_q("failed") & has_error
        if value == "any":
            return has_error
        if value == "none":
            return Q(last_error="") | Q(last_error__isnull=True)
        return None
