"""Each attempt's story on a task's admin page: the attempts the workers recorded for the
row (``taskclaim.TaskAttempt``, see ``TASKCLAIM_ATTEMPT_LOG``), newest first — when each
started (database clock), on which worker, how long it ran, what became of it and its
error. One query, served by the journal's index on (model, row, number). Then the
row's completed durable steps (``taskclaim.TaskStep``), in the order they completed."""

from __future__ import annotations

import json
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.utils.html import format_html, format_html_join
from django.utils.text import Truncator
from django.utils.timezone import localtime
from django.utils.translation import gettext_lazy as _

from django_taskclaim.admin.display import humanize_seconds
from django_taskclaim.config.settings import taskclaim_settings
from django_taskclaim.models import TaskAttempt, TaskEventWait, TaskStep

__all__ = ["attempt_table", "event_waits", "has_steps", "step_table"]

#: Attempts shown on a page at most (the journal keeps ``TASKCLAIM_ATTEMPTS_KEPT``).
SHOWN = 50


def _runtime(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    return humanize_seconds(seconds) if seconds >= 60 else f"{seconds:.1f} s"


def attempt_table(obj: Any) -> str:
    """HTML of the attempts recorded for row ``obj`` (newest first), or a line saying
    there are none and which attempts the workers record."""
    rows = list(
        TaskAttempt.objects.using(obj._state.db or "default")
        .filter(model=type(obj)._meta.label, row=str(obj.pk)[:191])
        .order_by("-started_at", "-number")[:SHOWN]
    )
    if not rows:
        mode = taskclaim_settings.ATTEMPT_LOG
        if mode == "off":
            return str(_('not recorded (TASKCLAIM_ATTEMPT_LOG = "off")'))
        if mode == "errors":
            return str(_("none recorded: the workers record attempts that did not end done"))
        return str(_("none recorded yet"))
    body = format_html_join(
        "",
        '<tr data-outcome="{}"><td class="num">{}</td><td>{}</td><td>{}</td><td>{}</td>'
        "<td>{}</td><td>{}</td></tr>",
        (
            (
                a.outcome,
                a.number,
                localtime(a.started_at).strftime("%Y-%m-%d %H:%M:%S"),
                a.worker or "—",
                _runtime(a.runtime),
                a.outcome,
                format_html(
                    '<span title="{}">{}</span>',
                    Truncator(a.error).chars(500),
                    Truncator(a.error.strip().splitlines()[-1]).chars(80),
                )
                if a.error.strip()
                else "—",
            )
            for a in rows
        ),
    )
    return format_html(
        '<table class="taskclaim-attempts"><thead><tr><th class="num">{}</th><th>{}</th>'
        "<th>{}</th><th>{}</th><th>{}</th><th>{}</th></tr></thead><tbody>{}</tbody></table>",
        _("attempt"),
        _("started"),
        _("worker"),
        _("ran for"),
        _("outcome"),
        _("error"),
        body,
    )


def _steps_of(obj: Any) -> Any:
    label = (type(obj)._meta.concrete_model or type(obj))._meta.label
    return TaskStep.objects.using(obj._state.db or "default").filter(
        task_model=label, task_pk=str(obj.pk)
    )


def has_steps(obj: Any) -> bool:
    """Whether row ``obj`` completed any durable step (one indexed query)."""
    return bool(_steps_of(obj).exists())


def step_table(obj: Any) -> str:
    """HTML of the durable steps row ``obj`` completed, in the order they completed:
    name, the attempt that ran it, when (database clock) and its stored result."""
    rows = list(_steps_of(obj).order_by("created_at", "pk")[:SHOWN])
    if not rows:
        return "—"
    body = format_html_join(
        "",
        '<tr><td>{}</td><td class="num">{}</td><td>{}</td><td><code>{}</code></td></tr>',
        (
            (
                s.name,
                s.attempt,
                localtime(s.created_at).strftime("%Y-%m-%d %H:%M:%S"),
                Truncator(json.dumps(s.result, cls=DjangoJSONEncoder)).chars(120),
            )
            for s in rows
        ),
    )
    return format_html(
        '<table class="taskclaim-attempts taskclaim-steps"><thead><tr><th>{}</th>'
        '<th class="num">{}</th><th>{}</th><th>{}</th></tr></thead><tbody>{}</tbody></table>',
        _("step"),
        _("attempt"),
        _("completed"),
        _("result"),
        body,
    )


def event_waits(obj: Any) -> list[tuple[str, Any]]:
    """The events row ``obj`` is parked for: (name, deadline), one indexed query."""
    label = (type(obj)._meta.concrete_model or type(obj))._meta.label
    rows = TaskEventWait.objects.using(obj._state.db or "default").filter(
        task_model=label, task_pk=str(obj.pk)
    )
    return list(rows.order_by("deadline").values_list("name", "deadline"))
