"""Django admin support: a mixin for your own ModelAdmin, a dashboard, and the app's models.

The app registers nothing of yours. Add the mixin to the admin of a claimable model::

    from django.contrib import admin
    from django_taskclaim.admin import ClaimableAdminMixin

    @admin.register(Document)
    class DocumentAdmin(ClaimableAdminMixin, admin.ModelAdmin):
        list_display = ["title"]

and its changelist gains status badges, attempts, holder, lease remaining, the last error,
filters, a per-status summary and the actions requeue / retry failed / cancel / release
lease / reap now. Every action needs the change permission, narrows the selection to the
rows where it is legal, is fenced (a state-conditioned UPDATE that bumps the claim token,
so a worker holding a row loses its claim instead of overwriting the change), works in
bounded batches on "select all", and reports what it did and what it skipped.

The app's own models (lease locks and the worker registry) are registered on the default
admin site when this package is imported (the admin's autodiscovery does it); the
dashboard lives at ``admin:taskclaim_dashboard`` and on the app's index page
(``/admin/taskclaim/``), linked from the admin index. The pages' styles are the static
file ``django_taskclaim/admin.css``.

Modules: :mod:`.mixin` (the mixin), :mod:`.actions` (its actions), :mod:`.filters`,
:mod:`.dashboard`, :mod:`.own_models` (the app's models), :mod:`.periodic` (the periodic
schedules, slots and runs) and :mod:`.display` (badges, labels, durations).
"""

from __future__ import annotations

from django_taskclaim.admin.actions import ClaimActionsMixin
from django_taskclaim.admin.dashboard import dashboard_context, dashboard_view
from django_taskclaim.admin.display import (
    NOW_ANNOTATION,
    STYLESHEET,
    annotated_now,
    badge,
    humanize_seconds,
    site_by_name,
    state_label,
)
from django_taskclaim.admin.filters import ClaimStatusFilter, ErrorFilter, LeaseFilter
from django_taskclaim.admin.mixin import (
    CLAIM_COLUMNS,
    DEFAULT_STATUS_ORDERING,
    READONLY_CLAIM_FIELDS,
    ClaimableAdminMixin,
)
from django_taskclaim.admin.own_models import LeaseAdmin, ReadOnlyAdminMixin, WorkerProcessAdmin
from django_taskclaim.admin.own_models import _AliveFilter as _AliveFilter
from django_taskclaim.admin.periodic import PeriodicRunAdmin, PeriodicSlotAdmin

#: The admin site of a request's ``current_app`` (used by the ``taskclaim_dashboard`` tag).
_site_by_name = site_by_name

__all__ = [
    "CLAIM_COLUMNS",
    "DEFAULT_STATUS_ORDERING",
    "NOW_ANNOTATION",
    "READONLY_CLAIM_FIELDS",
    "STYLESHEET",
    "ClaimActionsMixin",
    "ClaimStatusFilter",
    "ClaimableAdminMixin",
    "ErrorFilter",
    "LeaseAdmin",
    "LeaseFilter",
    "PeriodicRunAdmin",
    "PeriodicSlotAdmin",
    "ReadOnlyAdminMixin",
    "WorkerProcessAdmin",
    "annotated_now",
    "badge",
    "dashboard_context",
    "dashboard_view",
    "humanize_seconds",
    "site_by_name",
    "state_label",
]
