"""``ClaimableAdminMixin``: the claim columns, filters, read-only claim state, the
per-status summary, the pause form and the actions on the admin of a claimable model of
yours, and the task buttons of its change page."""

from __future__ import annotations

import functools
from typing import Any

from django import forms
from django.contrib import admin
from django.db import models
from django.http import HttpRequest, HttpResponse
from django.urls import NoReverseMatch, reverse
from django.utils import dateformat, timezone
from django.utils.html import format_html, format_html_join
from django.utils.text import Truncator
from django.utils.translation import gettext_lazy as _

from django_taskclaim.admin.actions import ClaimActionsMixin
from django_taskclaim.admin.attempts import attempt_table, event_waits, has_steps, step_table
from django_taskclaim.admin.display import (
    NOW_ANNOTATION,
    STYLESHEET,
    annotated_now,
    badge,
    humanize_seconds,
    state_label,
)
from django_taskclaim.admin.filters import ClaimStatusFilter, ErrorFilter, LeaseFilter
from django_taskclaim.admin.graph import dependents_text, prerequisites_text
from django_taskclaim.admin.pause import pause_form_context
from django_taskclaim.admin.runtime import RuntimeColumnMixin, held_since
from django_taskclaim.admin.task_page import TaskPageMixin
from django_taskclaim.admin.workers import running_since
from django_taskclaim.config.options import get_options
from django_taskclaim.db import DbNow
from django_taskclaim.exceptions import ConfigurationError
from django_taskclaim.ops.figures import model_stats
from django_taskclaim.row.status import UNKNOWN_STATE
from django_taskclaim.rules import lease_ended

__all__ = [
    "CLAIM_COLUMNS",
    "DEFAULT_STATUS_ORDERING",
    "HELD_ONLY_FIELDS",
    "READONLY_CLAIM_FIELDS",
    "ClaimableAdminMixin",
]

#: Ordering declared on ``status_badge``; each admin instance replaces it with the
#: model's ``ClaimMeta.status_field``.
DEFAULT_STATUS_ORDERING = "status"
#: Names of the columns the mixin adds to ``list_display``.
CLAIM_COLUMNS = (
    "status_badge",
    "attempts",
    "holder",
    "lease_remaining",
    "runtime",
    "scheduled",
    "short_error",
)
#: Claim bookkeeping shown read-only on the change form (when the model has them). A
#: ``processing`` row shows ``current_holder`` and one lease line (``lease_details``);
#: any other row shows ``last_holder`` and no lease (it holds none).
READONLY_CLAIM_FIELDS = (
    "status_badge",
    "version",
    "attempts",
    "current_holder",
    "last_holder",
    "lease_details",
    "created_at",
    "claimed_at",
    "finished_at",
    "error_details",
    "prerequisites",
    "dependent_rows",
    "attempt_history",
    "durable_steps",
    "awaited_events",
)
#: The fields of :data:`READONLY_CLAIM_FIELDS` shown only while a row is held.
HELD_ONLY_FIELDS = ("current_holder", "lease_details")


class ClaimableAdminMixin(TaskPageMixin, ClaimActionsMixin, RuntimeColumnMixin):
    """Mix into the ``ModelAdmin`` of a claimable model (put it before ``ModelAdmin``).

    Guarantees: claim bookkeeping (status, token, lease, holder, attempts, timestamps,
    last error) is read-only on the change form — a plain ``save()`` never writes it, so
    an editable status would silently not be saved; every action requires the change
    permission, changes only the rows where it is legal with a state-conditioned UPDATE
    that bumps the claim token (fencing any worker holding the row), processes "select
    all" in batches of ``claim_action_batch_size`` primary keys without loading rows,
    and reports "N done, M skipped (why)". A task's change page offers Retry / Requeue /
    Cancel where its state allows (fenced on the token the page showed,
    :class:`~django_taskclaim.admin.task_page.TaskPageMixin`), and the changelist a
    Pause / Resume form (the model, or one of its queues) to users with the change
    permission. Every change is written as an admin ``LogEntry``.
    """

    #: Show the per-status summary above the changelist.
    claim_summary: bool = True
    #: No "Show counts" link: Django's facets count every filter choice over the listed
    #: rows on each page load (a scan of the table per page). Setting ``ShowFacets.ALLOW``
    #: or ``ALWAYS`` on your admin brings them back; the claim filters then count in one
    #: pass (:class:`~django_taskclaim.admin.filters.ClaimFilter`), docs/admin.md.
    show_facets = admin.ShowFacets.NEVER
    #: Columns appended to ``list_display`` unless it already names one of them.
    claim_list_display: tuple[str, ...] = CLAIM_COLUMNS
    change_list_template = "django_taskclaim/admin/change_list.html"

    # These come from ModelAdmin at runtime.
    admin_site: admin.AdminSite
    actions: Any
    list_display: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        try:
            get_options(self.model)
        except ConfigurationError:
            # Registered while Django sets up (admin.autodiscover): an exception here would
            # stop every command with a traceback. The system check reports the error in
            # one line (taskclaim.E002) and stops the command before this admin serves.
            return
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
    def media(self) -> forms.Media:
        """The admin's media plus the app's stylesheet (badges, summary), on the
        changelist and the change form alike."""
        return super().media + forms.Media(css={"all": [STYLESHEET]})  # type: ignore[misc]

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
            "current_holder": "locked_by",
            "last_holder": "locked_by",
            "lease_remaining": "locked_until",
            "lease_details": "locked_until",
            "scheduled": "run_after",
            "runtime": "claimed_at",
        }
        if name in need_of:
            need = need_of[name]
            return need == "status" or self.claim_options.has(need)
        if name == "error_details":
            return self.claim_options.has("last_error")
        if name in ("attempt_history", "durable_steps", "awaited_events"):
            return True
        if name == "prerequisites":
            return self.claim_options.statuses.get("waiting") is not None
        if name == "dependent_rows":
            return self.claim_options.dependents
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
        extra = [f for f in self._claim_fields_for(obj) if self._has(f)]
        # The status column and last_error must not be form fields: save() skips them.
        extra += [opts.status_field]
        if opts.has("last_error"):
            extra.append("last_error")
        return base + [f for f in extra if f not in base]

    def _claim_fields_for(self, obj: Any) -> list[str]:
        """The read-only claim fields of ``obj``'s page: a held row's holder and lease, the
        last holder of any other row, neither on the add page."""
        if obj is None:
            skip = {"last_holder", "attempt_history", "prerequisites", "durable_steps"}
            skip.update(("awaited_events", "dependent_rows"))
            skip.update(HELD_ONLY_FIELDS)
        elif self._state(obj) == "processing":
            skip = {"last_holder", "prerequisites"}
        else:
            skip = set(HELD_ONLY_FIELDS)
        if obj is not None and self._state(obj) != "waiting":
            skip.add("prerequisites")  # only a waiting row waits for any
        if obj is not None and not has_steps(obj):
            skip.add("durable_steps")  # a body that uses no steps: nothing to show
        if obj is not None and (self._state(obj) != "ready" or not event_waits(obj)):
            skip.add("awaited_events")  # only a parked (ready) row waits for an event
        return [f for f in READONLY_CLAIM_FIELDS if f not in skip]

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

    def _state(self, obj: Any) -> str | None:
        opts = self.claim_options
        return opts.state_of(getattr(obj, opts.status_field))

    @admin.display(description=_("status"), ordering=DEFAULT_STATUS_ORDERING)
    def status_badge(self, obj: Any) -> str:
        """Coloured badge of the row's logical state."""
        return badge(self._state(obj))

    @admin.display(description=_("held by"))
    def holder(self, obj: Any) -> str:
        """The worker holding a ``processing`` row, else a dash."""
        if self._state(obj) != "processing":
            return "—"
        return obj.locked_by or "?"

    @admin.display(description=_("held by"))
    def current_holder(self, obj: Any) -> str:
        """The change page of a ``processing`` row: the worker holding it, and how long
        its attempt has run (its ``claimed_at``, else that worker's registry row)."""
        since = held_since(obj) or running_since(obj)
        holder = obj.locked_by or "?"
        return format_html("{} — {}", holder, since) if since else holder

    @admin.display(description=_("last holder"))
    def last_holder(self, obj: Any) -> str:
        """The change page of a row nobody holds: the worker that held it last, if any."""
        return obj.locked_by or "—"

    @admin.display(description=_("lease"))
    def lease_details(self, obj: Any) -> str:
        """The change page of a ``processing`` row, in one line: time left on the lease
        and when it ends, or "expired" and how long ago (by the database clock)."""
        if not obj.locked_until:
            return "—"
        left = (obj.locked_until - annotated_now(obj)).total_seconds()
        until = dateformat.format(timezone.localtime(obj.locked_until), "Y-m-d H:i:s e")
        if lease_ended(obj.locked_until, annotated_now(obj)):
            return format_html(
                '<span class="taskclaim-expired">{}</span> {}',
                _("expired %(age)s ago") % {"age": humanize_seconds(-left)},
                _("(at %(until)s)") % {"until": until},
            )
        return _("%(left)s left (until %(until)s)") % {
            "left": humanize_seconds(left),
            "until": until,
        }

    @admin.display(description=_("lease"), ordering="locked_until")
    def lease_remaining(self, obj: Any) -> str:
        """Time left on a ``processing`` row's lease, or "expired" exactly when a reap
        would take the row back (both by the database clock)."""
        if self._state(obj) != "processing" or not obj.locked_until:
            return "—"
        now = annotated_now(obj)
        left = (obj.locked_until - now).total_seconds()
        if lease_ended(obj.locked_until, now):
            return format_html(
                '<span class="taskclaim-expired">{}</span> <small class="taskclaim-ago">{}</small>',
                _("expired"),
                _("%(age)s ago") % {"age": humanize_seconds(-left)},
            )
        return humanize_seconds(left)

    @admin.display(description=_("run after"), ordering="run_after")
    def scheduled(self, obj: Any) -> str:
        """For a ready row deferred by ``run_after``: how long until it may run."""
        if self._state(obj) != "ready" or not obj.run_after:
            return "—"
        wait = (obj.run_after - annotated_now(obj)).total_seconds()
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
        return format_html('<pre class="taskclaim-error">{}</pre>', text)

    @admin.display(description=_("waiting for"))
    def prerequisites(self, obj: Any) -> str:
        """The prerequisites a waiting row still waits for (docs/workflows.md)."""
        return prerequisites_text(obj)

    @admin.display(description=_("rows waiting for it"))
    def dependent_rows(self, obj: Any) -> str:
        """The rows that wait, or waited, for this one (docs/workflows.md)."""
        return dependents_text(obj)

    @admin.display(description=_("waiting for event"))
    def awaited_events(self, obj: Any) -> str:
        """The events this row is parked for, each until its deadline (database clock)."""
        found = event_waits(obj)
        return (
            format_html_join(
                ", ",
                "<code>{}</code> (until {})",
                (
                    (name, timezone.localtime(when).strftime("%Y-%m-%d %H:%M:%S"))
                    for name, when in found
                ),
            )
            or "—"
        )

    @admin.display(description=_("completed steps"))
    def durable_steps(self, obj: Any) -> str:
        """The durable steps this row completed (docs/workflows.md, "Durable steps")."""
        return step_table(obj)

    @admin.display(description=_("attempts' story"))
    def attempt_history(self, obj: Any) -> str:
        """Each attempt the workers recorded for this row, newest first (one query)."""
        return attempt_table(obj)

    # -- changelist summary ---------------------------------------------------------
    def claim_summary_context(self, request: HttpRequest) -> dict[str, Any]:
        """Counts per state (of what this admin's queryset can see) for the summary bar;
        rows with a status no state maps are shown as ``unknown``, without a filter link.

        The dashboard's rule (``fast``): over all of a large PostgreSQL table's rows, a
        finished state no index covers is the planner's estimate, shown with "≈" (exact
        counts of it are a scan of the table); ``ready`` / ``processing`` / expired, and
        every state of a smaller table or of an admin that narrows its rows, are exact."""
        # throughput=False: the summary shows no "done in the last N minutes" (the
        # dashboard does), and over the rows each is a count of the finished ones
        stats = model_stats(
            self.model, queryset=self.get_queryset(request), fast=True, throughput=False
        )
        items = [
            {
                "state": state,
                "label": state_label(state),
                "count": n,
                "estimated": state in stats.estimated,
                "badge": badge(
                    state,
                    f"{state_label(state)} {'≈' if state in stats.estimated else ''}{n}",
                ),
                "query": ""
                if state == UNKNOWN_STATE
                else f"?{ClaimStatusFilter.parameter_name}={state}",
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
        """The changelist, with the per-status summary in ``taskclaim_summary`` and the
        pause form in ``taskclaim_pause``."""
        extra_context = dict(extra_context or {})
        if self.claim_summary and request.method == "GET":
            extra_context["taskclaim_summary"] = self.claim_summary_context(request)
        if request.method == "GET":
            extra_context["taskclaim_pause"] = pause_form_context(
                request, self.admin_site, self.model
            )
        return super().changelist_view(request, extra_context)  # type: ignore[misc]
