"""The admin of periodic work: the schedules (next run, last run, outcome) above the slots
enqueued, and the runs of periodic functions as an ordinary claimable changelist.

The slots page shows the schedules and the slots of the models the user may view only
(a function's schedule: ``taskclaim.PeriodicRun``); a slot that created no row is shown
to everyone who may view the slots."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.db import models, router
from django.http import HttpRequest, HttpResponse
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html
from django.utils.text import Truncator
from django.utils.translation import gettext_lazy as _

from django_taskclaim.admin.dashboard import may_view_label
from django_taskclaim.admin.display import STYLESHEET, badge, dotted, humanize_seconds
from django_taskclaim.admin.mixin import ClaimableAdminMixin
from django_taskclaim.admin.own_models import ReadOnlyAdminMixin
from django_taskclaim.db import db_now
from django_taskclaim.models import PeriodicRun, PeriodicSlot
from django_taskclaim.periodic import discover, schedules
from django_taskclaim.periodic.reported import periodic_in_use, periodic_runs_in_use
from django_taskclaim.periodic.slots import ScheduleState, schedule_state

__all__ = ["PeriodicRunAdmin", "PeriodicSlotAdmin", "schedule_rows"]


def _change_url(label: str, pk: str, site_name: str) -> str:
    app_label, _dot, model_name = label.partition(".")
    try:
        return reverse(
            f"admin:{app_label}_{model_name.lower()}_change", args=[pk], current_app=site_name
        )
    except NoReverseMatch:
        return ""


def schedule_rows(
    site_name: str = "admin",
    using: str | None = None,
    *,
    shown: Callable[[str], bool] | None = None,
) -> list[dict[str, Any]]:
    """One row per schedule registered in this process (after discovering the apps'
    ``periodic`` modules) whose target model's label passes ``shown`` (default: all):
    what it runs, its next and last slot, and the state of the row its last slot
    created. Times are the database's."""
    discover()
    using = using or router.db_for_read(PeriodicSlot)
    now = db_now(using)
    return [
        _row(schedule_state(s, now, using=using), now, site_name)
        for s in schedules()
        if shown is None or shown(s.target_label)
    ]


def _row(state: ScheduleState, now: Any, site_name: str) -> dict[str, Any]:
    schedule = state.schedule
    policy = schedule.missed
    if policy == "catch_up":
        policy = f"catch_up (≤ {schedule.max_catch_up})"
    next_in = ""
    if state.next_slot is not None and not state.overdue:
        next_in = humanize_seconds((state.next_slot - now).total_seconds())
    return {
        "name": schedule.name,
        "text": schedule.text,
        "zone": schedule.zone_name,
        "missed": policy,
        "target": schedule.target,
        "next_slot": state.next_slot,
        "next_in": next_in,
        "overdue": state.overdue,
        "last_slot": state.last_slot,
        "last_enqueued_by": state.last_enqueued_by,
        "outcome": badge(state.outcome, None) if state.outcome else "",
        "last_error": Truncator(state.last_error.strip().splitlines()[-1]).chars(120)
        if state.last_error.strip()
        else "",
        "work_url": _change_url(schedule.target_label, state.target_pk, site_name)
        if state.target_pk
        else "",
    }


@admin.register(PeriodicSlot)
class PeriodicSlotAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """The slots enqueued, with the registered schedules above them. Rows are never
    edited or deleted here: a schedule resumes after its latest slot, so deleting it
    would let that slot be enqueued again."""

    list_display = ("schedule", "slot", "enqueued_by", "created_at", "work")
    list_filter = ("schedule",)
    search_fields = ("schedule",)
    date_hierarchy = None
    change_list_template = "django_taskclaim/admin/periodic_slots.html"

    class Media:
        css = {"all": [STYLESHEET]}

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Never: see the class docstring."""
        return False

    def get_model_perms(self, request: HttpRequest) -> dict[str, bool]:
        """As usual while periodic work is in use (a schedule is registered, or a slot
        or run exists); otherwise none, which leaves the slots out of the admin index
        and its sidebar (the page itself still opens)."""
        return super().get_model_perms(request) if periodic_in_use() else {}

    def get_queryset(self, request: HttpRequest) -> models.QuerySet:
        """The slots of the models the user may view, and those that created no row."""
        queryset = super().get_queryset(request)
        targets = set(queryset.order_by().values_list("target", flat=True).distinct())
        hidden = [t for t in sorted(targets) if t and not self._may_view(request, t)]
        return queryset.exclude(target__in=hidden) if hidden else queryset

    def _may_view(self, request: HttpRequest, label: str) -> bool:
        return may_view_label(request, self.admin_site, label)

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        """The changelist, with ``taskclaim_schedules`` (:func:`schedule_rows`: those of
        the models the user may view)."""
        context = {
            **(extra_context or {}),
            "taskclaim_schedules": schedule_rows(
                self.admin_site.name, shown=lambda label: self._may_view(request, label)
            ),
        }
        return super().changelist_view(request, context)

    @admin.display(description=_("work"))
    def work(self, obj: PeriodicSlot) -> str:
        """The row the slot created, linked to its admin page when it has one."""
        if not obj.target_pk:
            return "—"
        text = f"{obj.target} #{obj.target_pk}"
        url = _change_url(obj.target, obj.target_pk, self.admin_site.name)
        return format_html('<a href="{}">{}</a>', url, text) if url else text


@admin.register(PeriodicRun)
class PeriodicRunAdmin(ClaimableAdminMixin, admin.ModelAdmin):  # type: ignore[misc]
    """The runs of periodic functions: status, attempts, holder, lease, errors and the
    fenced actions, as for any claimable model. Runs are created by the scheduler only."""

    list_display = ("schedule_name", "slot", "function_path")
    #: Runs are created due: "run after" is left to the change page, so the list fits.
    claim_list_display = ("status_badge", "attempts", "holder", "lease_remaining", "short_error")
    list_filter = ("schedule",)
    search_fields = ("schedule", "function")
    readonly_fields = ("schedule", "slot", "function", "result")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Never: the scheduler creates runs, one per slot."""
        return False

    def get_model_perms(self, request: HttpRequest) -> dict[str, bool]:
        """As usual where a function is scheduled or a run exists
        (:func:`~django_taskclaim.periodic.reported.periodic_runs_in_use`); otherwise none,
        which leaves the runs out of the admin index and its sidebar, as the dashboard
        and ``taskclaim_stats`` leave them out of their figures."""
        return super().get_model_perms(request) if periodic_runs_in_use() else {}

    @admin.display(description=_("schedule"), ordering="schedule")
    def schedule_name(self, obj: PeriodicRun) -> str:
        """The schedule's name (often a dotted path), free to wrap after each dot."""
        return dotted(obj.schedule)

    @admin.display(description=_("function"), ordering="function")
    def function_path(self, obj: PeriodicRun) -> str:
        """The function's dotted path, free to wrap after each dot."""
        return dotted(obj.function)
