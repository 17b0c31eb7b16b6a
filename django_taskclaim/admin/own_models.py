"""The admin of the app's own models: the dashboard's index entry, the lease locks and
the paused queues (the worker registry, which also serves the dashboard: :mod:`.workers`)."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import models
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import path, reverse
from django.utils.translation import gettext_lazy as _

from django_taskclaim.admin.audit import log_model_action
from django_taskclaim.admin.dashboard import may_view
from django_taskclaim.admin.display import (
    NOW_ANNOTATION,
    STYLESHEET,
    annotated_now,
    badge,
    humanize_seconds,
)
from django_taskclaim.admin.pause import may_change, may_pause, queue_text, visible_pauses
from django_taskclaim.config.discovery import claimable_models
from django_taskclaim.db import DbNow
from django_taskclaim.exceptions import TaskClaimError
from django_taskclaim.flow.pause import resume
from django_taskclaim.locks import break_lease
from django_taskclaim.models import Dashboard, Lease, QueuePause

__all__ = [
    "DashboardAdmin",
    "LeaseAdmin",
    "QueuePauseAdmin",
    "ReadOnlyAdminMixin",
]


class ReadOnlyAdminMixin:
    """Rows written only by the library: viewable and deletable, never edited by hand;
    no facet counts ("Show counts" counts every filter choice over the whole table)."""

    show_facets = admin.ShowFacets.NEVER

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Never: the library writes these rows."""
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Never: the library writes these rows."""
        return False


@admin.register(Dashboard)
class DashboardAdmin(admin.ModelAdmin):
    """The admin index's link to the dashboard: an entry "Dashboard" under "Task claims"
    for users who may view a claimable model (the dashboard shows those), whose page
    is the dashboard itself. Nothing to add, change or delete."""

    def get_model_perms(self, request: HttpRequest) -> dict[str, bool]:
        """View only, for a user the dashboard has a model to show; else no entry."""
        return {"view": True} if self.has_view_permission(request) else {}

    def has_module_permission(self, request: HttpRequest) -> bool:
        """Listed under "Task claims" even for a user with no permission on the app's own
        models (one who may view a claimable model of another app)."""
        return self.has_view_permission(request)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """The dashboard's rule: the user may view at least one claimable model."""
        return any(may_view(request, self.admin_site, m) for m in claimable_models())

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[Any]:
        """Only the entry's own URL, which opens the dashboard."""
        view = self.admin_site.admin_view(self.changelist_view)
        name = f"{self.opts.app_label}_{self.opts.model_name}_changelist"
        return [path("", view, name=name)]

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        """The dashboard (``admin:taskclaim_dashboard``)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        return HttpResponseRedirect(
            reverse("admin:taskclaim_dashboard", current_app=self.admin_site.name)
        )


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

    class Media:
        css = {"all": [STYLESHEET]}

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Never: a deleted row would restart its key's fencing token at 1."""
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
        done = break_lease(queryset)
        text = _("Break leases: %(done)s done, %(skipped)s skipped") % {
            "done": done,
            "skipped": total - done,
        }
        if total - done:
            text += " (" + str(_("already expired")) + ")"
        self.message_user(request, text + ".", messages.SUCCESS if done else messages.WARNING)

    def get_queryset(self, request: HttpRequest) -> models.QuerySet:
        """The lease rows, annotated with the database's ``now()``."""
        return super().get_queryset(request).annotate(**{NOW_ANNOTATION: DbNow()})

    @admin.display(description=_("held"))
    def held(self, obj: Lease) -> str:
        """Held with time left, or expired (database clock)."""
        left = (obj.locked_until - annotated_now(obj)).total_seconds()
        if left <= 0:
            return badge("cancelled", _("expired"))
        return badge("processing", humanize_seconds(left))


@admin.register(QueuePause)
class QueuePauseAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Paused queues: read-only, with a "resume" action that goes through
    :func:`django_taskclaim.flow.pause.resume` (which wakes idle workers).

    Rows are not deleted by hand: deleting one would resume without waking the workers
    and without a ``LogEntry``. The list holds the pauses the user may see (of the models
    she may view; of one queue only where her admin queryset of the model holds rows of
    it: :func:`~django_taskclaim.admin.pause.visible_pauses`). Resuming a row needs what
    a resume from the dashboard needs (:func:`~django_taskclaim.admin.pause.may_pause`);
    rows she may not resume are skipped, and said so.
    """

    list_display = ("model", "queue_shown", "paused_at", "paused_by", "reason")
    list_filter = ("model",)
    search_fields = ("model", "queue", "paused_by", "reason")
    actions = ["resume_selected"]

    class Media:
        css = {"all": [STYLESHEET]}

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Never: resume instead (it wakes the workers and is logged)."""
        return False

    def get_queryset(self, request: HttpRequest) -> models.QuerySet:
        """The pauses the user may see (the class docstring)."""
        queryset = super().get_queryset(request)
        viewable = {
            m._meta.label: m for m in claimable_models() if may_view(request, self.admin_site, m)
        }
        pauses = list(queryset.filter(model__in=sorted(viewable)).order_by())
        shown = visible_pauses(request, self.admin_site, viewable, pauses)
        return queryset.filter(pk__in=[p.pk for p in shown])

    def has_resume_permission(self, request: HttpRequest) -> bool:
        """Whether the user may change at least one claimable model (each row is
        checked again against its own model when the action runs)."""
        return any(may_change(request, self.admin_site, m) for m in claimable_models())

    @admin.display(description=_("queue"), ordering="queue")
    def queue_shown(self, obj: QueuePause) -> str:
        """The paused queue, or "all queues" for a pause of the whole model."""
        return obj.queue or str(_("all queues"))

    @admin.action(description=_("Resume selected paused queues"), permissions=("resume",))
    def resume_selected(self, request: HttpRequest, queryset: models.QuerySet) -> None:
        """Resume each selected pause the user may change; report resumed / skipped."""
        done, skipped, reasons = 0, 0, []
        username = request.user.get_username()
        for row in list(queryset):
            try:
                model = apps.get_model(row.model)
            except (LookupError, ValueError):
                skipped += 1
                reasons.append(_("%(model)s: unknown model") % {"model": row.model})
                continue
            if not may_pause(request, self.admin_site, model, row.queue or None):
                skipped += 1
                reasons.append(_("%(model)s: no change permission") % {"model": row.model})
                continue
            try:
                changed = resume(model, row.queue or None, by=username)
            except TaskClaimError as exc:
                skipped += 1
                reasons.append(f"{row.model}: {exc}")
                continue
            if changed:
                done += 1
                what = f"{row.model}, {queue_text(row.queue or None)}"
                log_model_action(request, model, str(_("Resumed %(what)s.") % {"what": what}))
            else:
                skipped += 1
                reasons.append(_("%(pause)s: already resumed") % {"pause": row})
        text = _("Resume: %(done)s resumed, %(skipped)s skipped") % {
            "done": done,
            "skipped": skipped,
        }
        if reasons:
            text += " (" + "; ".join(str(r) for r in reasons) + ")"
        self.message_user(request, text + ".", messages.SUCCESS if done else messages.WARNING)
