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
bounded batches on "select all", and reports what it did and what it skipped. A task's
change page gets Retry / Requeue / Cancel buttons (the same operations, fenced on the
token the page showed), the changelist and the dashboard Pause / Resume forms, and every
change is written as an admin ``LogEntry``.

The app's own models (lease locks, the worker registry, paused queues) are registered on the default
admin site when this package is imported (the admin's autodiscovery does it); the
dashboard lives at ``admin:taskclaim_dashboard`` and on the app's index page
(``/admin/taskclaim/``), linked from the admin index. The pages' styles are the static
file ``django_taskclaim/admin.css``.

Modules: :mod:`.mixin` (the mixin), :mod:`.actions` (its actions), :mod:`.task_page`
(the task buttons), :mod:`.pause` (pause / resume), :mod:`.audit` (the log entries),
:mod:`.filters`, :mod:`.dashboard`, :mod:`.own_models` (the app's models),
:mod:`.workers` (the worker registry: running tasks, graceful stop),
:mod:`.periodic` (the periodic schedules, slots and runs) and :mod:`.display` (badges,
labels, durations). Import a name from the module that defines it; only
:class:`ClaimableAdminMixin` is named here.
"""

from __future__ import annotations

# The app's own models are registered on the default admin site when the admin's
# autodiscovery imports this package.
from django_taskclaim.admin import own_models, periodic, workers  # noqa: F401
from django_taskclaim.admin.mixin import ClaimableAdminMixin

__all__ = ["ClaimableAdminMixin"]
