"""The admin's audit trail: every operation an operator runs from the taskclaim admin
(claim actions, task buttons, pause and resume) is written as a Django admin
``LogEntry`` — who, when, what — beside the ``django_taskclaim.admin`` log line."""

from __future__ import annotations

from typing import Any

from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.db import models
from django.http import HttpRequest

__all__ = ["log_model_action", "log_object_action"]


def _user_id(request: HttpRequest) -> Any:
    """The acting user's primary key (the admin views only let signed-in staff in)."""
    pk = request.user.pk
    if pk is None:
        raise PermissionDenied
    return pk


def log_model_action(request: HttpRequest, model: type[models.Model], message: str) -> LogEntry:
    """Record that ``request.user`` ran an operation on ``model`` as a whole (a
    changelist action, a pause): one ``CHANGE`` entry of the model's content type, with
    no object id; ``message`` says what was done, and its start (the model's label
    first) is the entry's title in "Recent actions"."""
    content_type = ContentType.objects.get_for_model(model, for_concrete_model=False)
    return LogEntry.objects.create(
        user_id=_user_id(request),
        content_type=content_type,
        object_id=None,
        object_repr=f"{model._meta.label}: {message}"[:200],
        action_flag=CHANGE,
        change_message=message,
    )


def log_object_action(request: HttpRequest, obj: Any, message: str) -> LogEntry:
    """Record that ``request.user`` ran an operation on the row ``obj`` (a task's
    button): one ``CHANGE`` entry, shown in that row's admin history."""
    return LogEntry.objects.log_actions(
        user_id=_user_id(request),
        queryset=[obj],
        action_flag=CHANGE,
        change_message=message,
        single_object=True,
    )
