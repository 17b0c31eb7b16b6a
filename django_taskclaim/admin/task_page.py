"""The buttons of a task's admin change page: Retry, Requeue and Cancel, each one row,
fenced on the claim token the page showed, running the changelist actions' operations
(:data:`~django_taskclaim.admin.actions.CLAIM_ACTIONS`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.db import models
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.functional import Promise
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from django_taskclaim.admin.actions import CLAIM_ACTIONS
from django_taskclaim.admin.audit import log_object_action
from django_taskclaim.admin.display import state_label
from django_taskclaim.config.options import get_options
from django_taskclaim.model.queryset import as_claim_queryset

__all__ = ["TASK_BUTTONS", "TaskButton", "TaskPageMixin"]

logger = logging.getLogger("django_taskclaim.admin")

#: The POST field naming the button pressed, and the one carrying the token shown.
BUTTON_FIELD = "taskclaim_button"
VERSION_FIELD = "taskclaim_version"


@dataclass(frozen=True)
class TaskButton:
    """A button of a task's page: the operation it runs and the states it is offered in."""

    name: str
    label: Promise
    action: str
    states: tuple[str, ...]
    primary: bool = False


#: Retry a failed task; requeue a finished (done / cancelled) one; cancel a ready or
#: processing one (the model must map ``cancelled``). A failed task offers Retry only:
#: on it, Requeue would do the same.
TASK_BUTTONS: tuple[TaskButton, ...] = (
    TaskButton("retry", gettext_lazy("Retry"), "retry_failed", ("failed",), primary=True),
    TaskButton("requeue", gettext_lazy("Requeue"), "requeue", ("done", "cancelled"), primary=True),
    TaskButton("cancel", gettext_lazy("Cancel task"), "cancel", ("ready", "processing")),
)


class TaskPageMixin:
    """The change page of a claimable model's admin, with the task buttons.

    Guarantees: a button is shown only when the row's state allows it and the user has
    the change permission for the row; pressing it (POST, CSRF-protected, 403 without
    the permission) changes the row only if it still has the state and claim token the
    page showed — one state-conditioned UPDATE that bumps the token, so a worker that
    claimed the row meanwhile keeps it untouched and the operator is told "the row
    changed meanwhile, nothing done"; a change is written as a ``LogEntry`` in the row's
    history. The page has no "Save and add another".
    """

    change_form_template = "django_taskclaim/admin/change_form.html"

    # These come from ModelAdmin at runtime.
    model: type[models.Model]
    admin_site: admin.AdminSite

    def get_urls(self) -> list[Any]:
        """Adds ``<pk>/taskclaim/`` (``admin:<app>_<model>_taskclaim``), where the
        buttons post, in front of the usual URLs."""
        meta = self.model._meta
        view = self.admin_site.admin_view(self.taskclaim_button_view)
        name = f"{meta.app_label}_{meta.model_name}_taskclaim"
        own = [path("<path:object_id>/taskclaim/", view, name=name)]
        return own + list(super().get_urls())  # type: ignore[misc]

    def task_buttons(self, request: HttpRequest, obj: Any) -> list[TaskButton]:
        """The buttons offered for ``obj``: those its state allows, if the user may
        change it."""
        if obj is None or not self.has_change_permission(request, obj):  # type: ignore[attr-defined]
            return []
        opts = get_options(self.model)
        state = opts.state_of(getattr(obj, opts.status_field))
        return [
            b for b in TASK_BUTTONS if state in b.states and CLAIM_ACTIONS[b.action].available(opts)
        ]

    def _url(self, request: HttpRequest, obj: Any, view: str) -> str:
        meta = self.model._meta
        url = reverse(
            f"admin:{meta.app_label}_{meta.model_name}_{view}",
            args=(quote(obj.pk),),
            current_app=self.admin_site.name,
        )
        return f"{url}?{request.GET.urlencode()}" if request.GET else url

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Any = None,
    ) -> TemplateResponse:
        """The change form with the task buttons, without "Save and add another"."""
        if change and obj is not None:
            context["show_save_and_add_another"] = False
            opts = get_options(self.model)
            state = opts.state_of(getattr(obj, opts.status_field))
            context["taskclaim_task"] = {
                "state": state or "unknown",
                "state_label": state_label(state or "?"),
                "version": obj.version,
                "buttons": self.task_buttons(request, obj),
                "url": self._url(request, obj, "taskclaim"),
                "field": BUTTON_FIELD,
                "version_field": VERSION_FIELD,
            }
        return super().render_change_form(  # type: ignore[misc]
            request, context, add=add, change=change, form_url=form_url, obj=obj
        )

    def taskclaim_button_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Run the pressed button on one row, fenced on the token the page showed, and
        go back to the row's page with the outcome as a message."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        obj = self.get_object(request, unquote(object_id))  # type: ignore[attr-defined]
        if obj is None:
            return self._get_obj_does_not_exist_redirect(  # type: ignore[attr-defined]
                request, self.model._meta, object_id
            )
        if not self.has_change_permission(request, obj):  # type: ignore[attr-defined]
            raise PermissionDenied
        back = HttpResponseRedirect(self._url(request, obj, "change"))
        name = request.POST.get(BUTTON_FIELD, "")
        button = next((b for b in TASK_BUTTONS if b.name == name), None)
        opts = get_options(self.model)
        if button is None or not CLAIM_ACTIONS[button.action].available(opts):
            messages.error(request, _("Unknown task action; nothing done."))
            return back
        try:
            seen = int(request.POST.get(VERSION_FIELD, ""))
        except ValueError:
            messages.error(
                request,
                _("%(action)s: the page sent no claim token; nothing done.")
                % {"action": button.label},
            )
            return back
        before = opts.state_of(getattr(obj, opts.status_field))
        queryset = self.get_queryset(request).filter(pk=obj.pk, version=seen)  # type: ignore[attr-defined]
        target = as_claim_queryset(queryset).in_state(*button.states)
        done = CLAIM_ACTIONS[button.action].run(target, None)
        now = self.model._base_manager.using(obj._state.db).filter(pk=obj.pk).first()
        after = opts.state_of(getattr(now, opts.status_field)) if now is not None else None
        logger.info(
            "admin task button model=%s pk=%s button=%s user=%s done=%s",
            opts.label,
            obj.pk,
            button.name,
            getattr(request.user, "pk", None),
            done,
        )
        if done:
            text = _("%(action)s: “%(obj)s” is now %(state)s.") % {
                "action": button.label,
                "obj": now if now is not None else obj,
                "state": state_label(after or "?"),
            }
            log_object_action(
                request,
                now if now is not None else obj,
                f"{button.label}: {state_label(before or '?')} → {state_label(after or '?')}",
            )
            messages.success(request, text)
        elif now is None:
            messages.warning(
                request,
                _("%(action)s: the row no longer exists, nothing done.") % {"action": button.label},
            )
        else:
            messages.warning(
                request,
                _("%(action)s: the row changed meanwhile (now %(state)s), nothing done.")
                % {"action": button.label, "state": state_label(after or "?")},
            )
        return back
