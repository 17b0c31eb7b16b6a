"""The queue dashboard: every claimable model's figures and the live workers, limited to
what the user may see (``admin:taskclaim_dashboard`` and the app's index page)."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.contrib import admin
from django.db import models
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, reverse
from django.utils.translation import gettext_lazy as _

from django_taskclaim.admin.display import humanize_seconds, site_by_name, state_label
from django_taskclaim.admin.filters import ClaimStatusFilter, LeaseFilter
from django_taskclaim.admin.pause import pause_form_context, pause_url, paused_rows
from django_taskclaim.db import db_now
from django_taskclaim.flow.rate_view import RatedModel, rate_view
from django_taskclaim.models import WorkerProcess
from django_taskclaim.ops.figures import ModelStats, live_workers, model_stats
from django_taskclaim.periodic.reported import reported_models
from django_taskclaim.row.status import STATE_NAMES
from django_taskclaim.rules import silent_after

__all__ = ["RING_ROWS", "dashboard_context", "dashboard_view", "may_view", "may_view_label"]

#: The most rings of one model the dashboard lists (a per-key limit has one per key).
RING_ROWS = 20


def _can_see(request: HttpRequest, model: type[models.Model]) -> bool:
    meta = model._meta
    user = request.user
    return any(
        user.has_perm(f"{meta.app_label}.{action}_{meta.model_name}")
        for action in ("view", "change")
    )


def _model_admin(site: admin.AdminSite, model: type[models.Model]) -> Any:
    return site._registry.get(model)


def may_view(request: HttpRequest, site: admin.AdminSite, model: type[models.Model]) -> bool:
    """Whether the user may view ``model``: its ``ModelAdmin``'s view or change
    permission on ``site``, else the model's own ``view`` or ``change`` permission."""
    model_admin = _model_admin(site, model)
    if model_admin is not None:
        return bool(model_admin.has_view_or_change_permission(request))
    return _can_see(request, model)


def may_view_label(request: HttpRequest, site: admin.AdminSite, label: str) -> bool:
    """:func:`may_view` of the model called ``label`` (``app_label.Model``); ``False``
    for a label that names no installed model."""
    try:
        model = apps.get_model(label)
    except (LookupError, ValueError):
        return False
    return may_view(request, site, model)


def dashboard_context(request: HttpRequest, site: admin.AdminSite | None = None) -> dict[str, Any]:
    """Figures shown on the dashboard, limited to what the user may see.

    A model registered on ``site`` is shown when its ``ModelAdmin`` grants the view or
    change permission, and its figures are computed over that admin's
    ``get_queryset(request)``, so an admin that narrows its queryset (per tenant, per
    owner) never shows counts of rows it hides. A claimable model not registered on
    ``site`` is shown, over all its rows, to users with its view or change permission.
    ``PeriodicRun`` is left out where no function is scheduled and no run exists
    (:func:`~django_taskclaim.periodic.reported.reported_models`). Paused queues are listed
    with their ready backlog; the pause / resume form is offered only to users with the
    change permission of a model. The rate limits of the models shown are listed, per
    ring, with the starts in the window (database clock), busiest first, at most
    :data:`RING_ROWS` rings per model.

    Over all of a model's rows, no figure scans its finished rows
    (:func:`~django_taskclaim.ops.figures.model_stats` with ``fast``): "done, last N
    min" comes from the workers' per-minute history, and a large PostgreSQL table's
    finished states are the planner's estimates (``cell["estimated"]``, shown with
    "≈"), except a state an index of the model covers (the failed rows' partial index);
    ``ready`` / ``processing`` / expired are always exact (docs/admin.md).
    """
    site = site or site_by_name(getattr(request, "current_app", None))
    visible = sorted(
        (m for m in reported_models() if may_view(request, site, m)),
        key=lambda m: m._meta.label,
    )
    now = db_now()
    pauses, paused_list = paused_rows(request, site, visible)
    rows = [_model_row(request, site, model, pauses) for model in visible]
    can_see_workers = _can_see(request, WorkerProcess)
    workers = [
        {**w.as_dict(), "seen_ago_text": humanize_seconds(w.seen_ago)}
        for w in (live_workers() if can_see_workers else [])
    ]
    workers_url = _admin_url("admin:taskclaim_workerprocess_changelist", site)
    return {
        "taskclaim_states": [(s, state_label(s)) for s in STATE_NAMES],
        "taskclaim_rows": rows,
        "taskclaim_workers": workers,
        "taskclaim_can_see_workers": can_see_workers,
        "taskclaim_workers_url": workers_url,
        "taskclaim_now": now,
        "taskclaim_dead_after": silent_after(),
        "taskclaim_paused": paused_list,
        "taskclaim_pause_url": pause_url(site),
        "taskclaim_can_pause": any(row["pause"]["can_pause_all"] for row in rows),
        "taskclaim_rates": _rate_rows(rate_view(visible)),
        "taskclaim_next": request.get_full_path(),
    }


def _admin_url(name: str, site: admin.AdminSite) -> str:
    """The URL of the admin view ``name`` on ``site``; ``""`` where it has none."""
    try:
        return reverse(name, current_app=site.name)
    except NoReverseMatch:
        return ""


def _model_row(
    request: HttpRequest, site: admin.AdminSite, model: type[models.Model], pauses: list[Any]
) -> dict[str, Any]:
    """The dashboard's row of ``model``: its figures over what its admin on ``site``
    shows (over all its rows where it has none), its changelist's URL and its pause form."""
    model_admin = _model_admin(site, model)
    url = ""
    if model_admin is not None:
        queryset = model_admin.get_queryset(request)
        stats = model_stats(model, using=queryset.db, queryset=queryset, fast=True)
        meta = model._meta
        url = _admin_url(f"admin:{meta.app_label}_{meta.model_name}_changelist", site)
    else:
        stats = model_stats(model, fast=True)
    row = _dashboard_row(stats, url)
    row["pause"] = pause_form_context(request, site, model, pauses=pauses)
    return row


def _dashboard_row(stats: ModelStats, url: str) -> dict[str, Any]:
    cells = []
    for state in STATE_NAMES:
        n = stats.counts.get(state)
        cells.append(
            {
                "state": state,
                "count": n,
                "url": f"{url}?{ClaimStatusFilter.parameter_name}={state}" if url else "",
                "estimated": state in stats.estimated,
                "parked": stats.parked if state == "ready" else 0,
            }
        )
    return {
        "label": stats.label,
        "name": stats.verbose_name,
        "url": url,
        "cells": cells,
        "total": stats.total,
        "expired": stats.expired,
        "expired_url": f"{url}?{LeaseFilter.parameter_name}=expired" if url else "",
        "oldest_ready": humanize_seconds(stats.oldest_ready_age)
        if stats.oldest_ready_age is not None
        else "—",
        "done_5": stats.done_last.get(5),
        "done_60": stats.done_last.get(60),
        "done_source": stats.done_source,
        "estimated": bool(stats.estimated),
    }


def _rate_rows(rated: list[RatedModel]) -> list[dict[str, Any]]:
    """Per rate-limited model: its limits as written, and its busiest rings."""
    out = []
    for model in rated:
        rings = sorted(model.rings, key=lambda r: (not r.at_limit, -r.starts))[:RING_ROWS]
        # every ring the view left out: the shown ones' rest, and the busy keys not listed
        listed_keys = sum(1 for r in model.rings if r.per == "key")
        hidden = len(model.rings) - len(rings)
        if model.keys is not None:
            hidden += model.keys.busy - listed_keys
        out.append(
            {
                "label": model.model,
                "name": model.name,
                "limits": [
                    f"{lim.text} per {lim.per}" if lim.field else lim.text for lim in model.limits
                ],
                "rings": [
                    {
                        **ring.as_dict(),
                        "next_free_text": humanize_seconds(ring.next_free)
                        if ring.next_free >= 60
                        else f"{ring.next_free:.1f}s",
                    }
                    for ring in rings
                ],
                "more": hidden,
                "keys": model.keys.as_dict() if model.keys is not None else None,
            }
        )
    return out


def dashboard_view(request: HttpRequest, site: admin.AdminSite) -> HttpResponse:
    """The dashboard page: every claimable model's queue figures and the live workers."""
    context = {
        **site.each_context(request),
        **dashboard_context(request, site),
        "title": _("Task queues"),
        "refresh": _refresh_seconds(request),
    }
    request.current_app = site.name
    return TemplateResponse(request, "django_taskclaim/admin/dashboard.html", context)


def _refresh_seconds(request: HttpRequest) -> int | None:
    try:
        value = int(request.GET.get("refresh", ""))
    except ValueError:
        return None
    return min(max(value, 2), 3600)
