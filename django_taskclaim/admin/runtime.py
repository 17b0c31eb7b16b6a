"""The runtime of a task row, from its own ``claimed_at`` (when its current or last
attempt was claimed, by the database clock): the changelist's "runtime" column and the
held row's "running for" line. Read from the row and the database ``now()`` the admin
queryset annotates it with: no query of its own, whatever the number of rows shown."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib import admin
from django.utils.html import format_html
from django.utils.timezone import localtime
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from django_taskclaim.admin.display import annotated_now, humanize_seconds
from django_taskclaim.config.options import get_options

__all__ = ["RuntimeColumnMixin", "held_since", "row_runtime"]

#: The states whose runtime is ``finished_at - claimed_at`` (a cancelled row's
#: ``finished_at`` is when it was cancelled, not when an attempt ended).
FINISHED_STATES = ("done", "failed")


def row_runtime(obj: Any) -> tuple[str, float] | None:
    """``("running", seconds)`` for a ``processing`` row (the database's now less its
    ``claimed_at``), ``("finished", seconds)`` for a ``done`` or ``failed`` one
    (``finished_at - claimed_at``), ``None`` otherwise: another state, a model without
    ``claimed_at``, a row claimed before the field existed or requeued since. Reads
    only the row (the database's now from the admin's annotation)."""
    opts = get_options(obj)
    if not opts.has("claimed_at"):
        return None
    claimed: datetime | None = obj.claimed_at
    if claimed is None:
        return None
    state = opts.state_of(getattr(obj, opts.status_field))
    if state == "processing":
        return "running", max(0.0, (annotated_now(obj) - claimed).total_seconds())
    if state in FINISHED_STATES and opts.has("finished_at"):
        finished: datetime | None = obj.finished_at
        if finished is not None and finished >= claimed:
            return "finished", (finished - claimed).total_seconds()
    return None


class RuntimeColumnMixin:
    """The "runtime" column of a claimable model's changelist (part of
    :class:`~django_taskclaim.admin.mixin.ClaimableAdminMixin`)."""

    @admin.display(description=gettext_lazy("runtime"))
    def runtime(self, obj: Any) -> str:
        """ "running 1m 35s" for a held row, "42s" for a finished one (from its claim to
        its end), "—" otherwise (:func:`row_runtime`); the exact start as a tooltip."""
        found = row_runtime(obj)
        if found is None:
            return "—"
        kind, seconds = found
        text = humanize_seconds(seconds)
        if kind == "running":
            text = _("running %(age)s") % {"age": text}
        since = localtime(obj.claimed_at).strftime("%Y-%m-%d %H:%M:%S")
        return format_html(
            '<span class="taskclaim-runtime" data-runtime="{}" data-seconds="{}" title="{}">'
            "{}</span>",
            kind,
            f"{seconds:.3f}",
            _("claimed at %(since)s") % {"since": since},
            text,
        )


def held_since(obj: Any) -> str | None:
    """For a held row's page: how long its attempt has run, from ``claimed_at`` (exact,
    no query), e.g. "running for 1m 35s (since 14:22:48)"; ``None`` when the row does not
    say (no field, not held)."""
    found = row_runtime(obj)
    if found is None or found[0] != "running":
        return None
    since = localtime(obj.claimed_at).strftime("%Y-%m-%d %H:%M:%S")
    return _("running for %(age)s (since %(since)s)") % {
        "age": humanize_seconds(found[1]),
        "since": since,
    }
