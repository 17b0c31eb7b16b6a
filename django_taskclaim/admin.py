"""Django admin support: a mixin for your own ModelAdmin, a dashboard, and the app's models.

The app registers nothing of yours. Add the mixin to the admin of a claimable model::

    from django.contrib import admin
    from django_taskclaim.admin import ClaimableAdminMixin

    @admin.register(Document)
    class DocumentAdmin(ClaimableAdminMixin, admin.ModelAdmin):
        list_display = ["title"]

and its changelist gains status badges, attempts, holder, lease remaining, the last error,
filters, a per-status summary and the actions requeue / retry failed / cancel / release
lease / reap now. Every action needs the change permission, narrows the selection to the
rows where it is legal, is fenced (a state-conditioned UPDATE that bumps the claim token,
so a worker holding a row loses its claim instead of overwriting the change), works in
bounded batches on "select all", and reports what it did and what it skipped.

The app's own models (lease locks and the worker registry) are registered on the default
admin site; the dashboard lives at ``admin:taskclaim_dashboard`` and on the app's index
page (``/admin/taskclaim/``), linked from the admin index.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import models
from django.db.models import Count, F, Q
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.text import Truncator
from django.utils.translation import gettext_lazy as _

from .conf import taskclaim_settings
from .db import DbNow
from .models import Lease, WorkerProcess
from .monitoring import ModelStats, db_now, live_workers, model_stats
from .options import ClaimOptions, claimable_models, get_options
from .querysets import ClaimQuerySet, ClaimQuerySetMixin
from .status import STATE_NAMES, Status

logger = logging.getLogger("django_taskclaim.admin")

#: Badge colours per logical state (background, text).
BADGE_COLOURS = {
    "ready": ("#dbeafe", "#1e3a8a"),
    "processing": ("#fef3c7", "#78350f"),
    "done": ("#dcfce7", "#14532d"),
    "failed": ("#fee2e2", "#7f1d1d"),
    "cancelled": ("#e5e7eb", "#374151"),
}
NOW_ANNOTATION = "taskclaim_db_now"
#: Ordering declared on ``status_badge``; each admin instance replaces it with the
#: model's ``ClaimMeta.status_field``.
DEFAULT_STATUS_ORDERING = "status"

#: Names of the columns the mixin adds to ``list_display``.
CLAIM_COLUMNS = (
    "status_badge",
    "attempts",
    "holder",
    "lease_remaining",
    "scheduled",
    "short_error",
)
#: Claim bookkeeping shown read-only on the change form (when the model has them).
READONLY_CLAIM_FIELDS = (
    "status_badge",
    "version",
    "attempts",
    "locked_by",
    "locked_until",
    "lease_remaining",
    "created_at",
    "finished_at",
    "error_details",
)


def state_label(state: str) -> str:
    """Translated label of a logical state."""
    try:
        return str(Status(state).label)
    except ValueError:
        return state


def humanize_seconds(seconds: float) -> str:
    """``75`` → ``"1m 15s"``; ``7300`` → ``"2h 01m"``; ``90000`` → ``"1d 01h"``."""
    s = int(abs(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {(s % 3600) // 60:02d}m"
    return f"{s // 86400}d {(s % 86400) // 3600:02d}h"


def badge(state: str | None, text: Any = None) -> str:
    """HTML of a coloured status badge."""
    bg, fg = BADGE_COLOURS.get(state or "", ("#f3f4f6", "#111827"))
    return format_html(
        '<span class="taskclaim-badge taskclaim-{}" style="display:inline-block;'
        "padding:1px 8px;border-radius:9px;font-size:11px;font-weight:600;"
        'background:{};color:{};white-space:nowrap">{}</span>',
        state or "unknown",
        bg,
        fg,
        text if text is not None else state_label(state or "?"),
    )


def _as_claim_queryset(queryset: models.QuerySet) -> Any:
    if isinstance(queryset, ClaimQuerySetMixin):
        return queryset
    return ClaimQuerySet(model=queryset.model, query=queryset.query.chain(), using=queryset.db)


def _site_by_name(name: str | None) -> admin.AdminSite:
    from django.contrib.admin.sites import all_sites

    for site in all_sites:
        if site.name == name:
            return site
    return admin.site


# -- list filters -----------------------------------------------------------------


class ClaimStatusFilter(admin.SimpleListFilter):
    """Filter by logical state; works for mapped (e.g. integer) status columns too."""

    title = _("task status")
    parameter_name = "taskclaim_status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        opts = get_options(model_admin.model)
        return [(s, state_label(s)) for s in STATE_NAMES if opts.statuses.get(s) is not None]

    def queryset(self, request: HttpRequest, queryset: models.QuerySet) -> models.QuerySet:
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
        return [("expired", _("lease expired")), ("running", _("lease running"))]

    def queryset(self, request: HttpRequest, queryset: models.QuerySet) -> models.QuerySet:
        opts = get_options(queryset.model)
        if self.value() == "expired":
            return queryset.filter(opts.status_q("processing"), locked_until__lt=DbNow())
        if self.value() == "running":
            return queryset.filter(opts.status_q("processing"), locked_until__gte=DbNow())
        return queryset


class ErrorFilter(admin.SimpleListFilter):
    """Rows that failed with an error message, or any row carrying one."""

    title = _("error")
    parameter_name = "taskclaim_error"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [
            ("failed", _("failed with error")),
            ("any", _("has an error")),
            ("none", _("no error")),
        ]

    def queryset(self, request: HttpRequest, queryset: models.QuerySet) -> models.QuerySet:
        opts = get_options(queryset.model)
        has_error = ~Q(last_error="") & Q(last_error__isnull=False)
        if self.value() == "failed":
            return queryset.filter(opts.status_q("failed")).filter(has_error)
        if self.value() == "any":
            return queryset.filter(has_error)
        if self.value() == "none":
            return queryset.filter(Q(last_error="") | Q(last_error__isnull=True))
        return queryset


# -- the mixin --------------------------------------------------------------------


class ClaimableAdminMixin:
    """Mix into the ``ModelAdmin`` of a claimable model (put it before ``ModelAdmin``).

    Guarantees: claim bookkeeping (status, token, lease, holder, attempts, timestamps,
    last error) is read-only on the change form — a plain ``save()`` never writes it, so
    an editable status would silently not be saved; every action requires the change
    permission, changes only the rows where it is legal with a state-conditioned UPDATE
    that bumps the claim token (fencing any worker holding the row), processes "select
    all" in batches of ``claim_action_batch_size`` primary keys without loading rows,
    and reports "N done, M skipped (why)".
    """

    #: Rows per UPDATE when an action runs (also on "select all" over huge tables).
    claim_action_batch_size: int = 1000
    #: Show the per-status summary above the changelist.
    claim_summary: bool = True
    #: Columns appended to ``list_display`` unless it already names one of them.
    claim_list_display: tuple[str, ...] = CLAIM_COLUMNS
    change_list_template = "django_taskclaim/admin/change_list.html"

    claim_action_names = (
        "taskclaim_requeue",
        "taskclaim_retry_failed",
        "taskclaim_cancel",
        "taskclaim_release",
        "taskclaim_reap",
    )

    # These come from ModelAdmin at runtime.
    model: type[models.Model]
    admin_site: admin.AdminSite
    actions: Any
    list_display: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.actions is not None:
            opts = get_options(self.model)
            ours = [
                name
                for name in self.claim_action_names
                if name != "taskclaim_cancel" or opts.statuses.get("cancelled") is not None
            ]
            self.actions = [*list(self.actions), *(n for n in ours if n not in self.actions)]
        self._order_status_badge_by_status_field()

    def _order_status_badge_by_status_field(self) -> None:
        """Make the status column sort by the model's own status field.

        ``@admin.display(ordering=...)`` is fixed when the class is defined, but the status
        field is per model (``ClaimMeta.status_field``): a model whose status lives in
        ``state`` would sort by a ``status`` it does not have (a 500). This instance gets
        its own ``status_badge`` ordered by the real field, unless a subclass chose an
        ordering of its own.
        """
        field = self.claim_options.status_field
        method = self.status_badge
        current = getattr(method, "admin_order_field", None)
        if current == field or current not in (None, DEFAULT_STATUS_ORDERING):
            return

        @functools.wraps(method)
        def status_badge(obj: Any) -> str:
            return method(obj)

        status_badge.admin_order_field = field  # type: ignore[attr-defined]
        self.status_badge = status_badge  # type: ignore[method-assign]

    @property
    def claim_options(self) -> ClaimOptions:
        """The resolved claim options of the administered model."""
        return get_options(self.model)

    # -- querysets / columns --------------------------------------------------------
    def get_queryset(self, request: HttpRequest) -> models.QuerySet:
        """The admin queryset, annotated with the database's ``now()`` for lease columns."""
        qs = super().get_queryset(request)  # type: ignore[misc]
        return qs.annotate(**{NOW_ANNOTATION: DbNow()})

    def _has(self, name: str) -> bool:
        need_of = {
            "status_badge": "status",
            "attempts": "attempts",
            "short_error": "last_error",
            "holder": "locked_by",
            "lease_remaining": "locked_until",
            "scheduled": "run_after",
        }
        if name in need_of:
            need = need_of[name]
            return need == "status" or self.claim_options.has(need)
        if name == "error_details":
            return self.claim_options.has("last_error")
        return self.claim_options.has(name) or name == "version"

    def get_list_display(self, request: HttpRequest) -> Any:
        """The model's ``list_display`` plus the claim columns the model supports."""
        base = list(super().get_list_display(request))  # type: ignore[misc]
        if any(c in base for c in CLAIM_COLUMNS):
            return base
        return base + [c for c in self.claim_list_display if self._has(c)]

    def get_list_filter(self, request: HttpRequest) -> Any:
        """Status, lease and error filters first, then the model's own."""
        ours: list[Any] = [ClaimStatusFilter, LeaseFilter]
        if self.claim_options.has("last_error"):
            ours.append(ErrorFilter)
        return ours + list(super().get_list_filter(request))  # type: ignore[misc]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        """The model's read-only fields plus the status and the claim bookkeeping."""
        base = list(super().get_readonly_fields(request, obj))  # type: ignore[misc]
        opts = self.claim_options
        extra = [f for f in READONLY_CLAIM_FIELDS if self._has(f)]
        # The status column and last_error must not be form fields: save() skips them.
        extra += [opts.status_field]
        if opts.has("last_error"):
            extra.append("last_error")
        return base + [f for f in extra if f not in base]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        """Default field list with the raw status / last_error replaced by their displays."""
        fields = list(super().get_fields(request, obj))  # type: ignore[misc]
        if getattr(self, "fields", None):
            return fields
        hidden = {self.claim_options.status_field, "last_error"}
        return [f for f in fields if f not in hidden]

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        """Without declared ``fieldsets``: the row's own fields, then a "Task" section."""
        if getattr(self, "fieldsets", None):
            return super().get_fieldsets(request, obj)  # type: ignore[misc]
        fields = list(self.get_fields(request, obj))
        task_fields = set(READONLY_CLAIM_FIELDS) | {"run_after", "priority"}
        own = [f for f in fields if f not in task_fields]
        task = [f for f in fields if f in task_fields]
        sets: list[tuple[Any, dict[str, Any]]] = [(None, {"fields": own})]
        if task:
            sets.append((_("Task"), {"fields": task}))
        return sets

    def _db_now(self, obj: Any) -> datetime:
        value = getattr(obj, NOW_ANNOTATION, None)
        if value is None:
            return db_now(obj._state.db or "default") if obj.pk else timezone.now()
        return value

    @admin.display(description=_("status"), ordering=DEFAULT_STATUS_ORDERING)
    def status_badge(self, obj: Any) -> str:
        """Coloured badge of the row's logical state."""
        opts = self.claim_options
        state = opts.state_of(getattr(obj, opts.status_field))
        return badge(state)

    @admin.display(description=_("held by"))
    def holder(self, obj: Any) -> str:
        """The worker holding a ``processing`` row, else a dash."""
        opts = self.claim_options
        if opts.state_of(getattr(obj, opts.status_field)) != "processing":
            return "—"
        return obj.locked_by or "?"

    @admin.display(description=_("lease"), ordering="locked_until")
    def lease_remaining(self, obj: Any) -> str:
        """Time left on a ``processing`` row's lease (database clock), or "expired"."""
        opts = self.claim_options
        if opts.state_of(getattr(obj, opts.status_field)) != "processing" or not obj.locked_until:
            return "—"
        left = (obj.locked_until - self._db_now(obj)).total_seconds()
        if left <= 0:
            return format_html(
                '<span class="taskclaim-expired" style="color:#b91c1c;font-weight:600">{}</span>'
                ' <small style="color:#6b7280">{}</small>',
                _("expired"),
                _("%(age)s ago") % {"age": humanize_seconds(-left)},
            )
        return humanize_seconds(left)

    @admin.display(description=_("run after"), ordering="run_after")
    def scheduled(self, obj: Any) -> str:
        """For a ready row deferred by ``run_after``: how long until it may run."""
        opts = self.claim_options
        if opts.state_of(getattr(obj, opts.status_field)) != "ready" or not obj.run_after:
            return "—"
        wait = (obj.run_after - self._db_now(obj)).total_seconds()
        if wait <= 0:
            return str(_("due"))
        return _("in %(wait)s") % {"wait": humanize_seconds(wait)}

    @admin.display(description=_("last error"))
    def short_error(self, obj: Any) -> str:
        """The last meaningful line of ``last_error``, shortened; full text as a tooltip."""
        text = (getattr(obj, "last_error", "") or "").strip()
        if not text:
            return "—"
        line = next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), text)
        head, sep, rest = line.partition(": ")
        if sep and "." in head and " " not in head:  # "pkg.module.SomeError: msg"
            line = f"{head.rsplit('.', 1)[1]}: {rest}"
        return format_html(
            '<span title="{}">{}</span>', Truncator(text).chars(500), Truncator(line).chars(60)
        )

    @admin.display(description=_("last error"))
    def error_details(self, obj: Any) -> str:
        """The full ``last_error`` (tracebacks keep their layout)."""
        text = getattr(obj, "last_error", "") or ""
        if not text:
            return "—"
        return format_html(
            '<pre class="taskclaim-error" style="white-space:pre-wrap;margin:0;'
            'max-height:40em;overflow:auto">{}</pre>',
            text,
        )

    # -- changelist summary ---------------------------------------------------------
    def claim_summary_context(self, request: HttpRequest) -> dict[str, Any]:
        """Counts per state (of what this admin's queryset can see) for the summary bar."""
        stats = model_stats(self.model, queryset=self.get_queryset(request))
        items = [
            {
                "state": state,
                "label": state_label(state),
                "count": n,
                "badge": badge(state, f"{state_label(state)} {n}"),
                "query": f"?{ClaimStatusFilter.parameter_name}={state}",
            }
            for state, n in stats.counts.items()
        ]
        try:
            dashboard_url = reverse("admin:taskclaim_dashboard", current_app=self.admin_site.name)
        except NoReverseMatch:
            dashboard_url = ""
        return {
            "stats": stats,
            "items": items,
            "expired_query": f"?{LeaseFilter.parameter_name}=expired",
            "oldest_ready": humanize_seconds(stats.oldest_ready_age)
            if stats.oldest_ready_age is not None
            else "",
            "dashboard_url": dashboard_url,
        }

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        """The changelist, with the per-status summary in ``taskclaim_summary``."""
        extra_context = dict(extra_context or {})
        if self.claim_summary and request.method == "GET":
            extra_context["taskclaim_summary"] = self.claim_summary_context(request)
        return super().changelist_view(request, extra_context)  # type: ignore[misc]

    # -- actions --------------------------------------------------------------------
    def _state_counts(self, queryset: Any) -> dict[str, int]:
        opts = self.claim_options
        counts: dict[str, int] = {}
        for row in queryset.order_by().values(opts.status_field).annotate(n=Count("pk")):
            state = opts.state_of(row[opts.status_field]) or "unknown"
            counts[state] = counts.get(state, 0) + row["n"]
        return counts

    def _run_claim_action(
        self,
        request: HttpRequest,
        queryset: models.QuerySet,
        *,
        title: str,
        legal: tuple[str, ...],
        rule: str,
        operation: Callable[[Any], int],
        legal_filter: Callable[[Any], Any] | None = None,
    ) -> None:
        if not self.has_change_permission(request):  # type: ignore[attr-defined]
            raise PermissionDenied
        qs = _as_claim_queryset(queryset)
        opts = self.claim_options
        before = self._state_counts(qs)
        total = sum(before.values())
        legal_before = (
            legal_filter(qs).count()
            if legal_filter
            else sum(n for s, n in before.items() if s in legal)
        )
        done = operation(qs)
        reasons = [f"{n} {state_label(s)}" for s, n in sorted(before.items()) if s not in legal]
        if legal_filter:
            unexpired = sum(n for s, n in before.items() if s in legal) - legal_before
            if unexpired > 0:
                reasons.insert(0, str(_("%(n)s with a running lease") % {"n": unexpired}))
        if legal_before > done:
            reasons.append(
                str(_("%(n)s changed by someone else meanwhile") % {"n": legal_before - done})
            )
        skipped = total - done
        text = _("%(title)s: %(done)s done, %(skipped)s skipped") % {
            "title": title,
            "done": done,
            "skipped": skipped,
        }
        if skipped:
            text += f" ({', '.join(reasons)}: {rule})"
        text += "."
        logger.info(
            "admin action model=%s action=%s user=%s done=%s skipped=%s",
            opts.label,
            title,
            getattr(request.user, "pk", None),
            done,
            skipped,
        )
        self.message_user(  # type: ignore[attr-defined]
            request, text, messages.SUCCESS if done else messages.WARNING
        )

    @admin.action(
        description=_("Requeue selected tasks (failed, cancelled or done → ready)"),
        permissions=("change",),
    )
    def taskclaim_requeue(self, request: HttpRequest, queryset: models.QuerySet) -> None:
        """Put failed / cancelled / done rows back to ready, attempts reset."""
        batch = self.claim_action_batch_size
        self._run_claim_action(
            request,
            queryset,
            title=str(_("Requeue")),
            legal=("failed", "cancelled", "done"),
            rule=str(_("only failed, cancelled or done tasks can be requeued")),
            operation=lambda qs: qs.requeue(batch_size=batch),
        )

    @admin.action(
        description=_("Retry selected failed tasks"),
        permissions=("change",),
    )
    def taskclaim_retry_failed(self, request: HttpRequest, queryset: models.QuerySet) -> None:
        """Put failed rows back to ready with a fresh retry budget."""
        batch = self.claim_action_batch_size
        self._run_claim_action(
            request,
            queryset,
            title=str(_("Retry failed")),
            legal=("failed",),
            rule=str(_("only failed tasks are retried")),
            operation=lambda qs: qs.failed().requeue(batch_size=batch),
        )

    @admin.action(
        description=_("Cancel selected tasks (ready or processing)"),
        permissions=("change",),
    )
    def taskclaim_cancel(self, request: HttpRequest, queryset: models.QuerySet) -> None:
        """Cancel ready and processing rows; a worker holding one loses its claim."""
        batch = self.claim_action_batch_size
        if self.claim_options.statuses.get("cancelled") is None:
            self.message_user(  # type: ignore[attr-defined]
                request,
                _("%(model)s has no cancelled status; nothing was changed.")
                % {"model": self.claim_options.label},
                messages.ERROR,
            )
            return
        self._run_claim_action(
            request,
            queryset,
            title=str(_("Cancel")),
            legal=("ready", "processing"),
            rule=str(_("only ready or processing tasks can be cancelled")),
            operation=lambda qs: qs.cancel(batch_size=batch),
        )

    @admin.action(
        description=_("Release the lease of selected tasks (processing → ready)"),
        permissions=("change",),
    )
    def taskclaim_release(self, request: HttpRequest, queryset: models.QuerySet) -> None:
        """Take processing rows back from their holders (who are fenced); ready now."""
        batch = self.claim_action_batch_size
        self._run_claim_action(
            request,
            queryset,
            title=str(_("Release lease")),
            legal=("processing",),
            rule=str(_("only processing tasks hold a lease")),
            operation=lambda qs: qs.release(batch_size=batch),
        )

    @admin.action(
        description=_("Reap selected tasks whose lease expired"),
        permissions=("change",),
    )
    def taskclaim_reap(self, request: HttpRequest, queryset: models.QuerySet) -> None:
        """Recover selected processing rows whose lease ran out (ready, or failed if spent)."""
        batch = self.claim_action_batch_size
        opts = self.claim_options
        self._run_claim_action(
            request,
            queryset,
            title=str(_("Reap now")),
            legal=("processing",),
            rule=str(_("only processing tasks with an expired lease are reaped")),
            operation=lambda qs: qs.reap(batch_size=batch).total,
            legal_filter=lambda qs: qs.filter(
                opts.status_q("processing"), locked_until__lt=DbNow()
            ),
        )


# -- dashboard --------------------------------------------------------------------


def _can_see(request: HttpRequest, model: type[models.Model]) -> bool:
    meta = model._meta
    user = request.user
    return any(
        user.has_perm(f"{meta.app_label}.{action}_{meta.model_name}")
        for action in ("view", "change")
    )


def _model_admin(site: admin.AdminSite, model: type[models.Model]) -> Any:
    return site._registry.get(model)


def _may_view(request: HttpRequest, site: admin.AdminSite, model: type[models.Model]) -> bool:
    model_admin = _model_admin(site, model)
    if model_admin is not None:
        return bool(model_admin.has_view_or_change_permission(request))
    return _can_see(request, model)


def dashboard_context(request: HttpRequest, site: admin.AdminSite | None = None) -> dict[str, Any]:
    """Figures shown on the dashboard, limited to what the user may see.

    A model registered on ``site`` is shown when its ``ModelAdmin`` grants the view or
    change permission, and its figures are computed over that admin's
    ``get_queryset(request)``, so an admin that narrows its queryset (per tenant, per
    owner) never shows counts of rows it hides. A claimable model not registered on
    ``site`` is shown, over all its rows, to users with its view or change permission.
    """
    site = site or _site_by_name(getattr(request, "current_app", None))
    visible = sorted(
        (m for m in claimable_models() if _may_view(request, site, m)),
        key=lambda m: m._meta.label,
    )
    now = db_now()
    rows = []
    for model in visible:
        model_admin = _model_admin(site, model)
        url = ""
        if model_admin is not None:
            queryset = model_admin.get_queryset(request)
            stats = model_stats(model, using=queryset.db, queryset=queryset)
            try:
                url = reverse(
                    f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist",
                    current_app=site.name,
                )
            except NoReverseMatch:
                url = ""
        else:
            stats = model_stats(model)
        rows.append(_dashboard_row(stats, url))
    can_see_workers = _can_see(request, WorkerProcess)
    workers = [
        {**w.as_dict(), "seen_ago_text": humanize_seconds(w.seen_ago)}
        for w in (live_workers() if can_see_workers else [])
    ]
    try:
        workers_url = reverse("admin:taskclaim_workerprocess_changelist", current_app=site.name)
    except NoReverseMatch:
        workers_url = ""
    return {
        "taskclaim_states": [(s, state_label(s)) for s in STATE_NAMES],
        "taskclaim_rows": rows,
        "taskclaim_workers": workers,
        "taskclaim_can_see_workers": can_see_workers,
        "taskclaim_workers_url": workers_url,
        "taskclaim_now": now,
        "taskclaim_dead_after": taskclaim_settings.WORKER_SILENT_AFTER,
    }


def _dashboard_row(stats: ModelStats, url: str) -> dict[str, Any]:
    cells = []
    for state in STATE_NAMES:
        n = stats.counts.get(state)
        cells.append(
            {
                "state": state,
                "count": n,
                "url": f"{url}?{ClaimStatusFilter.parameter_name}={state}" if url else "",
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
    }


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


# -- the app's own models ---------------------------------------------------------


class ReadOnlyAdminMixin:
    """Rows written only by the library: viewable and deletable, never edited by hand."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class _AliveFilter(admin.SimpleListFilter):
    title = _("state")
    parameter_name = "alive"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [
            ("live", _("live")),
            ("silent", _("silent (presumed dead)")),
            ("stopped", _("stopped")),
        ]

    def queryset(self, request: HttpRequest, queryset: models.QuerySet) -> models.QuerySet:
        cutoff = DbNow() - timedelta(seconds=float(taskclaim_settings.WORKER_SILENT_AFTER))
        if self.value() == "live":
            return queryset.filter(stopped_at__isnull=True, last_seen__gte=cutoff)
        if self.value() == "silent":
            return queryset.filter(stopped_at__isnull=True, last_seen__lt=cutoff)
        if self.value() == "stopped":
            return queryset.filter(stopped_at__isnull=False)
        return queryset


@admin.register(WorkerProcess)
class WorkerProcessAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """The worker registry; also serves the dashboard page."""

    list_display = (
        "worker_id",
        "state_badge",
        "hostname",
        "pid",
        "concurrency",
        "in_flight",
        "processed",
        "seen",
        "started_at",
    )
    list_filter = (_AliveFilter, "hostname")
    search_fields = ("worker_id", "hostname")

    def get_queryset(self, request: HttpRequest) -> models.QuerySet:
        return super().get_queryset(request).annotate(**{NOW_ANNOTATION: DbNow()})

    def get_urls(self) -> list[Any]:
        """Adds ``dashboard/`` (``admin:taskclaim_dashboard``) in front of the usual URLs."""
        view = self.admin_site.admin_view(self.dashboard)
        return [path("dashboard/", view, name="taskclaim_dashboard"), *super().get_urls()]

    def dashboard(self, request: HttpRequest) -> HttpResponse:
        """The dashboard page (staff only; shows the models the user may view)."""
        return dashboard_view(request, self.admin_site)

    @admin.display(description=_("state"))
    def state_badge(self, obj: WorkerProcess) -> str:
        """live / silent / stopped, judged by the database clock."""
        if obj.stopped_at is not None:
            return badge("cancelled", _("stopped"))
        now = getattr(obj, NOW_ANNOTATION, None) or timezone.now()
        silent = (now - obj.last_seen).total_seconds()
        if silent > float(taskclaim_settings.WORKER_SILENT_AFTER):
            return badge("failed", _("silent"))
        return badge("done", _("live"))

    @admin.display(description=_("last heartbeat"), ordering="last_seen")
    def seen(self, obj: WorkerProcess) -> str:
        """How long ago the worker's last heartbeat was."""
        now = getattr(obj, NOW_ANNOTATION, None) or timezone.now()
        return _("%(age)s ago") % {"age": humanize_seconds((now - obj.last_seen).total_seconds())}


@admin.register(Lease)
class LeaseAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Lease locks: who holds which key until when, and a fenced "break" action.

    Rows are never edited or deleted by hand: deleting one would restart its fencing
    token at 1, so tokens would no longer grow. Breaking a lease expires it and bumps the
    token in one UPDATE, so the holder's renew / release fail and the next acquirer wins.
    """

    list_display = ("key", "owner", "held", "token", "locked_until", "acquired_at")
    search_fields = ("key", "owner")
    actions = ["break_leases"]

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_break_permission(self, request: HttpRequest) -> bool:
        """Breaking a lease needs the model's change permission."""
        return bool(request.user.has_perm("taskclaim.change_lease"))

    @admin.action(
        description=_("Break selected leases (expire now; the holder is fenced)"),
        permissions=("break",),
    )
    def break_leases(self, request: HttpRequest, queryset: models.QuerySet) -> None:
        """Expire the selected leases that are still held and bump their tokens."""
        if not self.has_break_permission(request):
            raise PermissionDenied
        total = queryset.count()
        held = queryset.filter(locked_until__gt=DbNow())
        pks = list(held.values_list("pk", flat=True)[:10_000])
        done = Lease.objects.filter(pk__in=pks, locked_until__gt=DbNow()).update(
            locked_until=DbNow(), token=F("token") + 1
        )
        text = _("Break leases: %(done)s done, %(skipped)s skipped") % {
            "done": done,
            "skipped": total - done,
        }
        if total - done:
            text += " (" + str(_("already expired")) + ")"
        self.message_user(request, text + ".", messages.SUCCESS if done else messages.WARNING)

    def get_queryset(self, request: HttpRequest) -> models.QuerySet:
        return super().get_queryset(request).annotate(**{NOW_ANNOTATION: DbNow()})

    @admin.display(description=_("held"))
    def held(self, obj: Lease) -> str:
        """Held with time left, or expired (database clock)."""
        now = getattr(obj, NOW_ANNOTATION, None) or timezone.now()
        left = (obj.locked_until - now).total_seconds()
        if left <= 0:
            return badge("cancelled", _("expired"))
        return badge("processing", humanize_seconds(left))
