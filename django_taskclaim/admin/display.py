"""What the admin pages show a value as: state labels, badges, durations, the stylesheet."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from django.contrib import admin
from django.contrib.admin.sites import all_sites
from django.db import DEFAULT_DB_ALIAS
from django.utils.html import format_html, format_html_join

from django_taskclaim.db import db_now
from django_taskclaim.ops.figures import humanize_seconds
from django_taskclaim.row.status import Status

__all__ = [
    "NOW_ANNOTATION",
    "STYLESHEET",
    "annotated_now",
    "badge",
    "dotted",
    "humanize_seconds",
    "site_by_name",
    "state_label",
]

#: The static stylesheet of every admin page of the app (badges, summary, dashboard).
STYLESHEET = "django_taskclaim/admin.css"
#: Name of the annotation carrying the database's ``now()`` on each admin row.
NOW_ANNOTATION = "taskclaim_db_now"


def state_label(state: str) -> str:
    """Translated label of a logical state; an unknown name is returned as is."""
    try:
        return str(Status(state).label)
    except ValueError:
        return state


def badge(state: str | None, text: Any = None) -> str:
    """HTML of a status badge (``taskclaim-badge taskclaim-<state>``, coloured by
    :data:`STYLESHEET`); ``text`` defaults to the state's label. Escapes ``text``."""
    return format_html(
        '<span class="taskclaim-badge taskclaim-{}">{}</span>',
        state or "unknown",
        text if text is not None else state_label(state or "?"),
    )


def dotted(path: str) -> str:
    """HTML of a dotted path (``pkg.module.send_report``) that a narrow column may wrap
    after a dot or an underscore, never elsewhere (a ``<wbr>`` after each). Escapes
    ``path``."""
    pieces = re.split(r"(?<=[._])", str(path))
    return format_html(
        '<span class="taskclaim-path">{}</span>',
        format_html_join(format_html("<wbr>{}", ""), "{}", ((p,) for p in pieces if p)),
    )


def annotated_now(obj: Any) -> datetime:
    """The database's ``now()`` for the figures of row ``obj``: the value the admin
    queryset annotated it with (:data:`NOW_ANNOTATION`), else read from the row's
    database (one query). Never the web server's clock."""
    value = getattr(obj, NOW_ANNOTATION, None)
    if value is None:
        return db_now(obj._state.db or DEFAULT_DB_ALIAS)
    return value


def site_by_name(name: str | None) -> admin.AdminSite:
    """The admin site registered under ``name`` (a request's ``current_app``), else the
    default site."""
    for site in all_sites:
        if site.name == name:
            return site
    return admin.site
