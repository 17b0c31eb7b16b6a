"""The worker registry's admin: every worker process on every host (live, silent,
stopping, stopped), the bodies each one runs and since when, and a graceful "Stop"
action — all through the database, so it works whichever host a worker runs on. The
registry's admin also serves the dashboard and its pause view.

A worker's page lists the bodies it runs only of the models the user may view (the
others are counted, not named). Stopping needs the registry's change permission and is
logged as an admin ``LogEntry``, like pause: the worker sees the request at its next
registry refresh (within ``min(heartbeat, 10 s)``), claims nothing more, finishes what
it runs within its ``--grace``, gives back what it had not started, and exits 0 (a
supervised process is not replaced)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.apps import apps
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import models
from django.http import HttpRequest, HttpResponse
from django.urls import NoReverseMatch, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.timezone import localtime
from django.utils.translation import gettext_lazy as _

from django_taskclaim.admin.audit import log_model_action
from django_taskclaim.admin.dashboard import dashboard_view, may_view_label
from django_taskclaim.admin.display import (
    NOW_ANNOTATION,
    STYLESHEET,
    annotated_now,
    badge,
    humanize_seconds,
)
from django_taskclaim.admin.own_models import ReadOnlyAdminMixin
from django_taskclaim.admin.pause import pause_view
from django_taskclaim.db import DbNow
from django_taskclaim.models import WorkerProcess
from django_taskclaim.rules import (
    heard_from_recently,
    live_worker_q,
    silent_after,
    silent_worker_q,
)
from django_taskclaim.worker.maintenance.registry import request_stop

__all__ = ["WorkerProcessAdmin", "running_since"]

#: The attribute of a registry row (as its change page shows it) holding the labels of
#: the models the user may view, of those whose bodies it runs.
VIEWABLE_ATTR = "_taskclaim_viewable_labels"


#: How many asked workers the Stop message names one by one.
NAMED = 5


def stop_outlook(asked: list[str], ages: dict[str, float]) -> str:
    """What the Stop action knows about the workers it asked (``ages``: seconds since
    each one's last heartbeat, by the database clock): only when each was last heard
    from. A request reaches a running worker at its next registry refresh; a worker that
    was killed a second ago looks the same until it fails to beat again, so nothing is
    promised: a worker that never beats again is shown silent, and its rows come back
    when their leases end (the reaper), not before (silence is not proof of death)."""
    parts = []
    for worker_id in asked[:NAMED]:
        age = max(0.0, ages.get(worker_id, 0.0))
        part = _("%(worker)s: last heartbeat %(age)s ago") % {
            "worker": worker_id,
            "age": humanize_seconds(age),
        }
        if age > silent_after():
            part += " (" + str(_("silent: presumed gone unless it beats again")) + ")"
        parts.append(str(part))
    if len(asked) > NAMED:
        parts.append(str(_("%(count)s more") % {"count": len(asked) - NAMED}))
    return (
        "; ".join(parts)
        + ". "
        + str(
            _(
                "A worker that is running sees the request at its next registry refresh "
                "(within 10s), claims nothing more, finishes the tasks it runs and exits. "
                "One that does not beat again (killed, its host down) is shown silent "
                "%(silent)s after its last heartbeat, and its rows come back when their "
                "leases end (sooner only if its supervisor saw it exit), not before."
            )
            % {"silent": humanize_seconds(silent_after())}
        )
    )


class _AliveFilter(admin.SimpleListFilter):
    title = _("state")
    parameter_name = "alive"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [
            ("live", _("live")),
            ("stopping", _("asked to stop")),
            ("silent", _("silent (presumed dead)")),
            ("stopped", _("stopped")),
        ]

    def queryset(self, request: HttpRequest, queryset: models.QuerySet) -> models.QuerySet:
        if self.value() == "live":
            return queryset.filter(live_worker_q())
        if self.value() == "stopping":
            return queryset.filter(stopped_at__isnull=True, stop_requested_at__isnull=False)
        if self.value() == "silent":
            return queryset.filter(silent_worker_q())
        if self.value() == "stopped":
            return queryset.filter(stopped_at__isnull=False)
        return queryset


def _task_link(site_name: str, label: str, pk: str) -> str:
    """HTML of one running body: a link to its row's admin page where there is one."""
    text = f"{label} #{pk}"
    try:
        model = apps.get_model(label)
        url = reverse(
            f"admin:{model._meta.app_label}_{model._meta.model_name}_change",
            args=[pk],
            current_app=site_name,
        )
    except (LookupError, ValueError, NoReverseMatch):
        return format_html("{}", text)
    return format_html('<a href="{}">{}</a>', url, text)


def running_since(obj: Any) -> str | None:
    """For a held row's page: how long its body had run at its holder's last registry
    refresh, and since when (that refresh's database time less the age), e.g. "running
    for 1m 35s (since 14:22:48)"; ``None`` when its holder's registry row does not list
    it (its body not started yet, the refresh not come yet, or an older worker). One
    query."""
    holder = getattr(obj, "locked_by", None)
    if not holder:
        return None
    found = (
        WorkerProcess.objects.using(obj._state.db or "default")
        .filter(worker_id=holder, stopped_at__isnull=True)
        .values_list("running", "last_seen")
        .first()
    )
    if found is None:
        return None
    running, seen = found
    label, pk = type(obj)._meta.label, str(obj.pk)
    for entry in running or []:
        if entry.get("model") == label and entry.get("pk") == pk:
            age = float(entry.get("age") or 0)
            since = localtime(seen - timedelta(seconds=age)).strftime("%Y-%m-%d %H:%M:%S")
            return str(
                _("running for %(age)s at its worker's last heartbeat (since %(since)s)")
                % {"age": humanize_seconds(age), "since": since}
            )
    return None


@admin.register(WorkerProcess)
class WorkerProcessAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """The worker registry, with the bodies each worker runs and a graceful stop; also
    serves the dashboard page."""

    # Six columns fit beside the filter at 1400 px: the host and pid are in the worker
    # id (and the host filter), the threads beside the tasks in flight.
    list_display = ("worker_id", "state_badge", "load", "done", "seen", "up_for")
    list_filter = (_AliveFilter, "hostname")
    search_fields = ("worker_id", "hostname")
    actions = ["stop_workers"]
    fields = (
        "worker_id",
        "hostname",
        "pid",
        "state_badge",
        "started_at",
        "last_seen",
        "model_labels",
        "concurrency",
        "in_flight",
        "processed",
        "running_tasks",
        "stop_request",
    )
    readonly_fields = fields

    class Media:
        css = {"all": [STYLESHEET]}

    def get_queryset(self, request: HttpRequest) -> models.QuerySet:
        """The registry rows, annotated with the database's ``now()``."""
        return super().get_queryset(request).annotate(**{NOW_ANNOTATION: DbNow()})

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        """The registry row, with the labels of the models of its running bodies that the
        user may view (:data:`VIEWABLE_ATTR`, read by :meth:`running_tasks`)."""
        obj = super().get_object(request, object_id, from_field)
        if obj is not None:
            labels = {str(e.get("model")) for e in obj.running or [] if e.get("model")}
            viewable = {x for x in labels if may_view_label(request, self.admin_site, x)}
            setattr(obj, VIEWABLE_ATTR, frozenset(viewable))
        return obj

    def get_urls(self) -> list[Any]:
        """Adds ``dashboard/`` (``admin:taskclaim_dashboard``) and ``dashboard/pause/``
        (``admin:taskclaim_pause``, where the pause forms post) in front of the usual URLs."""
        view = self.admin_site.admin_view(self.dashboard)
        pause = self.admin_site.admin_view(self.pause)
        return [
            path("dashboard/", view, name="taskclaim_dashboard"),
            path("dashboard/pause/", pause, name="taskclaim_pause"),
            *super().get_urls(),
        ]

    def dashboard(self, request: HttpRequest) -> HttpResponse:
        """The dashboard page (staff only; shows the models the user may view)."""
        return dashboard_view(request, self.admin_site)

    def pause(self, request: HttpRequest) -> HttpResponse:
        """Pause or resume a model or one of its queues (POST; the model's change
        permission; CSRF-protected like every admin view)."""
        return pause_view(request, self.admin_site)

    def has_stop_permission(self, request: HttpRequest) -> bool:
        """Stopping a worker needs the registry's change permission."""
        return bool(request.user.has_perm("taskclaim.change_workerprocess"))

    @admin.action(
        description=_("Stop selected workers gracefully (they finish what they run)"),
        permissions=("stop",),
    )
    def stop_workers(self, request: HttpRequest, queryset: models.QuerySet) -> None:
        """Ask each selected live worker to stop gracefully; report asked / skipped, and
        log one entry per worker asked."""
        if not self.has_stop_permission(request):
            raise PermissionDenied
        rows = list(
            queryset.annotate(**{NOW_ANNOTATION: DbNow()}).values_list(
                "worker_id", "stopped_at", "stop_requested_at", "last_seen", NOW_ANNOTATION
            )
        )
        wanted = [wid for wid, stopped, asked, _, _ in rows if stopped is None and asked is None]
        ages = {wid: (now - seen).total_seconds() for wid, _, _, seen, now in rows}
        by = request.user.get_username()
        asked = []
        for worker_id in wanted:  # one statement each: the log says exactly who was asked
            if request_stop([worker_id], by, using=queryset.db):
                asked.append(worker_id)
                log_model_action(
                    request,
                    WorkerProcess,
                    str(_("Asked worker %(worker)s to stop.") % {"worker": worker_id}),
                )
        skipped = len(rows) - len(asked)
        text = _("Stop: %(done)s asked to stop, %(skipped)s skipped") % {
            "done": len(asked),
            "skipped": skipped,
        }
        if skipped:
            text += " (" + str(_("already stopped or already asked")) + ")"
        if asked:
            text += ". " + stop_outlook(asked, ages)
        else:
            text += "."
        self.message_user(request, text, messages.SUCCESS if asked else messages.WARNING)

    @admin.display(description=_("state"))
    def state_badge(self, obj: WorkerProcess) -> str:
        """live / stopping / silent / stopped, judged by the database clock as the filter
        judges it."""
        if obj.stopped_at is not None:
            return badge("cancelled", _("stopped"))
        if not heard_from_recently(obj.last_seen, annotated_now(obj)):
            return badge("failed", _("silent"))
        if obj.stop_requested_at is not None:
            return badge("ready", _("stopping"))
        return badge("done", _("live"))

    @admin.display(description=_("heartbeat"), ordering="last_seen")
    def seen(self, obj: WorkerProcess) -> str:
        """How long ago the worker's last heartbeat was."""
        age = (annotated_now(obj) - obj.last_seen).total_seconds()
        return _("%(age)s ago") % {"age": humanize_seconds(age)}

    @admin.display(description=_("in flight"), ordering="in_flight")
    def load(self, obj: WorkerProcess) -> str:
        """Tasks held now, of the threads that run them ("2 / 4")."""
        return f"{obj.in_flight} / {obj.concurrency}"

    @admin.display(description=_("processed"), ordering="processed")
    def done(self, obj: WorkerProcess) -> int:
        """Tasks this process has run (a short header: the column is narrow)."""
        return int(obj.processed)

    @admin.display(description=_("up"), ordering="started_at")
    def up_for(self, obj: WorkerProcess) -> str:
        """How long the process has run (until it stopped), by the database clock."""
        end = obj.stopped_at or annotated_now(obj)
        return humanize_seconds(max(0.0, (end - obj.started_at).total_seconds()))

    @admin.display(description=_("running tasks"))
    def running_tasks(self, obj: WorkerProcess) -> str:
        """The bodies running at the worker's last refresh, longest first, each with when
        it started (the refresh's database time less its age) and for how long: those of
        the models the user may view (:data:`VIEWABLE_ATTR`; none where it is not set),
        the others only counted."""
        viewable: frozenset[str] = getattr(obj, VIEWABLE_ATTR, frozenset())
        every = obj.running or []
        running = [e for e in every if e.get("model") in viewable]
        hidden = len(every) - len(running)
        if not running:
            if obj.running is None and obj.in_flight:
                return str(_("not reported by this worker's version"))
            if hidden:
                return str(_("%(n)s of models you may not view") % {"n": hidden})
            return "—"
        site = self.admin_site.name
        rows = []
        for entry in running:
            age = float(entry.get("age") or 0)
            since = obj.last_seen - timedelta(seconds=age)
            rows.append(
                (
                    _task_link(site, entry["model"], entry["pk"]) if entry.get("model") else "?",
                    localtime(since).strftime("%Y-%m-%d %H:%M:%S"),
                    humanize_seconds(age),
                )
            )
        body = format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td></tr>", rows)
        more = obj.in_flight - len(every) if obj.in_flight > len(every) else 0
        notes = []
        if hidden:
            notes.append(_("and %(n)s of models you may not view") % {"n": hidden})
        if more:
            notes.append(_("and %(n)s more held") % {"n": more})
        tail = format_html_join("", "<p>{}</p>", ((note,) for note in notes))
        return format_html(
            '<table class="taskclaim-running"><thead><tr><th>{}</th><th>{}</th><th>{}</th>'
            "</tr></thead><tbody>{}</tbody></table>{}",
            _("task"),
            _("started"),
            _("running for (at last heartbeat)"),
            body,
            tail,
        )

    @admin.display(description=_("stop request"))
    def stop_request(self, obj: WorkerProcess) -> str:
        """Who asked this worker to stop, and when; "—" when nobody did."""
        if obj.stop_requested_at is None:
            return "—"
        return str(
            _("asked by %(by)s at %(at)s")
            % {
                "by": obj.stop_requested_by or "?",
                "at": localtime(obj.stop_requested_at).strftime("%Y-%m-%d %H:%M:%S"),
            }
        )
