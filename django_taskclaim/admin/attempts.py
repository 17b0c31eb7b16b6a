"""Each attempt's story on a task's admin page: the attempts the workers recorded for the
row (``taskclaim.TaskAttempt``, see ``TASKCLAIM_ATTEMPT_LOG``), newest first — when each
started (database clock), on which worker, how long it ran, what became of it and its
error. One query, served by the journal's index on (model, row, number)."""

from __future__ import annotations

from typing import Any

from django.utils.html import format_html, format_html_join
from django.utils.text import Truncator
from django.utils.timezone import localtime
from django.utils.translation import gettext_lazy as _

from django_taskclaim.admin.display import humanize_seconds
from django_taskclaim.config.settings import taskclaim_settings
from django_taskclaim.models import TaskAttempt

__all__ = ["attempt_table"]

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
