"""Pause and resume from the admin: the forms of the dashboard and of each claimable
model's changelist, the view they post to (``admin:taskclaim_pause``), and the paused
queues the dashboard lists. Every change goes through :mod:`django_taskclaim.flow.pause`
(which enforces the pause in the claim and wakes idle workers on resume).

A pause is a control over the whole model, while a ``ModelAdmin`` may narrow the rows a
user sees (``get_queryset()``, per tenant). So beside the model's change permission
(:func:`may_change`), :func:`may_pause` asks: a queue by name only if the user sees
every row of the model or at least one row of that queue; every queue of the model
only if she sees every row. A user sees the pauses of the queues she may pause, and
the pause of the whole model (docs/admin.md, docs/security.md)."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.apps import apps
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import models
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import NoReverseMatch, reverse
from django.utils import dateformat
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext as _

from django_taskclaim.admin.audit import log_model_action
from django_taskclaim.claim.scope import QUEUE_FIELD, has_queues
from django_taskclaim.config.options import get_options
from django_taskclaim.exceptions import TaskClaimError
from django_taskclaim.flow.pause import is_paused, pause, paused, resume
from django_taskclaim.model.queryset import as_claim_queryset
from django_taskclaim.ops.history import recent_queues, whole_table

__all__ = [
    "ALL_QUEUES",
    "QUEUE_PREFIX",
    "may_change",
    "may_pause",
    "pause_form_context",
    "pause_url",
    "pause_view",
    "paused_rows",
    "queue_text",
    "sees_every_row",
    "visible_pauses",
]

logger = logging.getLogger("django_taskclaim.admin")

#: Form value of "every queue of the model" (the whole model).
ALL_QUEUES = "all"
#: Prefix of a form value naming one queue: ``queue:<name>`` (any name, even "all").
QUEUE_PREFIX = "queue:"
#: Most queue names offered in a form's list (distinct values of the table).
MAX_QUEUE_CHOICES = 200


def _model_admin(site: admin.AdminSite, model: type[models.Model]) -> Any:
    return site._registry.get(model)


def may_change(request: HttpRequest, site: admin.AdminSite, model: type[models.Model]) -> bool:
    """Whether the user may pause / resume ``model``: its ``ModelAdmin``'s change
    permission on ``site``, else the model's ``change`` permission."""
    model_admin = _model_admin(site, model)
    if model_admin is not None:
        return bool(model_admin.has_change_permission(request))
    meta = model._meta
    return bool(request.user.has_perm(f"{meta.app_label}.change_{meta.model_name}"))


def _rows(request: HttpRequest, site: admin.AdminSite, model: type[models.Model]) -> Any:
    """The rows of ``model`` the user sees: its admin's queryset, else every row."""
    model_admin = _model_admin(site, model)
    if model_admin is not None:
        return as_claim_queryset(model_admin.get_queryset(request))
    return as_claim_queryset(model._default_manager.all())


def sees_every_row(request: HttpRequest, site: admin.AdminSite, model: type[models.Model]) -> bool:
    """Whether the user's queryset of ``model`` on ``site`` (its ``ModelAdmin``'s
    ``get_queryset(request)``) is not narrowed: it selects every row."""
    return whole_table(_rows(request, site, model))


def _queues_seen(rows: Any, names: set[str]) -> set[str]:
    """Those of the queue ``names`` that have at least one row in ``rows`` (one query)."""
    if not names:
        return set()
    found = rows.filter(**{f"{QUEUE_FIELD}__in": sorted(names)}).order_by()
    return set(found.values_list(QUEUE_FIELD, flat=True).distinct())


def may_pause(
    request: HttpRequest, site: admin.AdminSite, model: type[models.Model], queue: str | None
) -> bool:
    """Whether the user may pause or resume ``queue`` of ``model`` (``None``: every queue
    of the model): she has the change permission (:func:`may_change`) and either sees
    every row of the model (:func:`sees_every_row`), or ``queue`` is a queue by name of
    which she sees at least one row. Every queue of the model needs every row."""
    if not may_change(request, site, model):
        return False
    rows = _rows(request, site, model)
    if whole_table(rows):
        return True
    if queue is None or not has_queues(model):
        return False
    return bool(_queues_seen(rows, {queue}))


def pause_url(site: admin.AdminSite) -> str:
    """The URL the pause forms post to on ``site``, or ``""`` where it is not mounted."""
    try:
        return reverse("admin:taskclaim_pause", current_app=site.name)
    except NoReverseMatch:
        return ""


def queue_text(queue: str | None) -> str:
    """The words "all queues" for ``None`` (a pause of the whole model), else "queue “name”"."""
    return _("all queues") if queue is None else _("queue “%(queue)s”") % {"queue": queue}


def pause_form_context(
    request: HttpRequest,
    site: admin.AdminSite,
    model: type[models.Model],
    *,
    pauses: list[Any] | None = None,
) -> dict[str, Any]:
    """What a model's pause form shows: whether the user may use it (``can_change``: a
    queue of hers, or every queue; ``can_pause_all``: every queue), the queues to pick
    from (``None`` for a model without queues), and the model's current pauses that
    she may see (:func:`may_pause`; the pause of the whole model always)."""
    label = model._meta.label
    own = [p for p in (paused(model) if pauses is None else pauses) if p.model == label]
    whole = next((p for p in own if p.queue == ""), None)
    url = pause_url(site)
    can_change = bool(url) and may_change(request, site, model)
    rows = _rows(request, site, model)
    every_row = whole_table(rows)
    if not every_row:  # a narrowed queryset: the pauses of the queues she sees
        seen = _queues_seen(rows, {p.queue for p in own if p.queue}) if has_queues(model) else set()
        own = [p for p in own if not p.queue or p.queue in seen]
    choices: list[tuple[str, str]] | None = None
    if has_queues(model):
        names: set[str] = {p.queue for p in own if p.queue}
        if can_change:
            # The queues of the rows not finished (their status indexes serve it) and,
            # over all the rows, the queues workers finished tasks of lately (the
            # history): never a DISTINCT over every finished row.
            if every_row:
                names.update(recent_queues(label, using=rows.db))
            for state in ("ready", "processing"):  # one partial index each
                values = (
                    rows.filter(get_options(model).status_q(state))
                    .order_by(QUEUE_FIELD)
                    .values_list(QUEUE_FIELD, flat=True)
                    .distinct()[:MAX_QUEUE_CHOICES]
                )
                names.update(v for v in values if v)
        choices = [(ALL_QUEUES, _("all queues"))] if every_row else []
        choices += [(f"{QUEUE_PREFIX}{name}", name) for name in sorted(names)]
    can_pause_all = can_change and every_row
    return {
        "model": label,
        "url": url,
        "can_change": can_pause_all or (can_change and bool(choices)),
        "can_pause_all": can_pause_all,
        "choices": choices,
        "paused_whole": whole,
        "paused_queues": [p for p in own if p.queue],
        "next": request.get_full_path(),
    }


def visible_pauses(
    request: HttpRequest,
    site: admin.AdminSite,
    models_by_label: dict[str, type[models.Model]],
    pauses: list[Any],
    *,
    every: dict[str, bool] | None = None,
) -> list[Any]:
    """Those of ``pauses`` (``QueuePause`` rows) the user may see: of a model of
    ``models_by_label`` (those she may view), the pause of the whole model, and a pause
    of one queue where her queryset of the model holds a row of that queue or is not
    narrowed. One query per model with a pause, and one per narrowed one. ``every``,
    when given, receives per label whether she sees every row."""
    every = {} if every is None else every
    seen: dict[str, set[str]] = {}  # label -> the paused queues she sees rows of
    for label in sorted({p.model for p in pauses if p.model in models_by_label}):
        model = models_by_label[label]
        mine = _rows(request, site, model)
        every[label] = whole_table(mine)
        theirs = {p.queue for p in pauses if p.model == label and p.queue}
        if theirs and not every[label] and has_queues(model):
            seen[label] = _queues_seen(mine, theirs)
    return [
        p
        for p in pauses
        if p.model in models_by_label
        and (not p.queue or every[p.model] or p.queue in seen.get(p.model, set()))
    ]


def paused_rows(
    request: HttpRequest, site: admin.AdminSite, visible: list[type[models.Model]]
) -> tuple[list[Any], list[dict[str, Any]]]:
    """The pauses (``QueuePause`` rows) and, for the dashboard, one entry per pause the
    user may see (of a model of ``visible``: the pause of the whole model, and a pause of
    a queue of which her queryset holds a row, or any where it is not narrowed): since
    when, by whom, why, and the ready backlog (rows of that queue, or of the whole
    model, in the ``ready`` state)."""
    by_label = {m._meta.label: m for m in visible}
    pauses = paused()
    every: dict[str, bool] = {}
    rows = []
    for p in visible_pauses(request, site, by_label, pauses, every=every):
        model = by_label[p.model]
        ready = _rows(request, site, model).ready()
        if p.queue:
            ready = ready.filter(**{QUEUE_FIELD: p.queue})
        rows.append(
            {
                "pause": p,
                "model": p.model,
                "name": model._meta.verbose_name_plural,
                "queue": p.queue,
                "queue_value": f"{QUEUE_PREFIX}{p.queue}" if p.queue else ALL_QUEUES,
                "backlog": ready.count(),
                # a queue listed is one she may pause; every queue needs every row
                "can_change": may_change(request, site, model)
                and (bool(p.queue) or every[p.model]),
            }
        )
    return pauses, rows


def _parse_queue(value: str) -> str | None:
    if value == ALL_QUEUES or value == "":
        return None
    if value.startswith(QUEUE_PREFIX):
        return value[len(QUEUE_PREFIX) :]
    raise ValueError(value)


def _back(request: HttpRequest, site: admin.AdminSite) -> HttpResponse:
    target = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        try:
            target = reverse("admin:taskclaim_dashboard", current_app=site.name)
        except NoReverseMatch:
            target = reverse("admin:index", current_app=site.name)
    return HttpResponseRedirect(target)


def pause_view(request: HttpRequest, site: admin.AdminSite) -> HttpResponse:
    """POST ``model`` (a label), ``queue`` (``all`` or ``queue:<name>``), ``op``
    (``pause`` / ``resume``), optional ``reason`` and ``next``: pause or resume that
    queue, report the outcome as an admin message, log it (``LogEntry``) and go back
    to ``next``. Needs the model's change permission and, where the user's queryset is
    narrowed, rows of hers in that queue (:func:`may_pause`; 403 otherwise)."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    label = request.POST.get("model", "")
    try:
        model = apps.get_model(label)
    except (LookupError, ValueError):
        messages.error(request, _("Unknown model “%(model)s”; nothing done.") % {"model": label})
        return _back(request, site)
    if not may_change(request, site, model):
        raise PermissionDenied
    op = request.POST.get("op", "")
    try:
        queue = _parse_queue(request.POST.get("queue", ALL_QUEUES))
    except ValueError:
        messages.error(request, _("Pick a queue or “all queues”; nothing done."))
        return _back(request, site)
    if op not in ("pause", "resume"):
        messages.error(request, _("Unknown operation; nothing done."))
        return _back(request, site)
    if not may_pause(request, site, model, queue):
        raise PermissionDenied
    username = request.user.get_username()
    what = f"{label}, {queue_text(queue)}"
    try:
        if op == "pause":
            reason = request.POST.get("reason", "").strip()[:255]
            # pause() keeps an existing pause unchanged: say so, log nothing
            already = any(p.queue == (queue or "") for p in paused(model))
            row = pause(model, queue, by=username, reason=reason)
            since = row.paused_at
            text = (
                _("%(what)s was already paused (since %(since)s, by %(by)s); nothing done.")
                if already
                else _("Paused %(what)s (since %(since)s, by %(by)s).")
            ) % {
                "what": what,
                "since": dateformat.format(since, "Y-m-d H:i:s e")
                if isinstance(since, datetime)
                else "now",
                "by": row.paused_by or "?",
            }
            changed = not already
        else:
            changed = resume(model, queue, by=username)
            text = (
                _("Resumed %(what)s.") if changed else _("%(what)s was not paused; nothing done.")
            ) % {"what": what}
            if queue is not None and is_paused(model, None):
                text += " " + _("Every queue of %(model)s is still paused.") % {"model": label}
    except TaskClaimError as exc:
        messages.error(
            request, _("%(what)s: %(error)s Nothing done.") % {"what": what, "error": exc}
        )
        return _back(request, site)
    logger.info(
        "admin %s model=%s queue=%r user=%r changed=%s", op, label, queue, username, changed
    )
    if changed:
        log_model_action(request, model, text)
    messages.add_message(request, messages.SUCCESS if changed else messages.WARNING, text)
    return _back(request, site)
