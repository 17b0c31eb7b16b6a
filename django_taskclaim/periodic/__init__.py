"""Periodic work, enqueued exactly once per slot across all hosts.

Declare it in code::

    from django_taskclaim.periodic import periodic

    @periodic("0 3 * * *", tz="Europe/Paris")          # a function: one run per slot
    def nightly_report(): ...

    @periodic(every=timedelta(minutes=5), missed="catch_up")
    class Sweep(ClaimableModel):                          # a model: one row per slot
        slot = models.DateTimeField(null=True)

        @classmethod
        def for_slot(cls, slot):                          # optional: the row to save
            return cls(slot=slot)

Every worker runs a scheduler thread (``--no-scheduler`` to leave it out) that enqueues
each due slot with the insert-as-lock of :func:`.slots.enqueue_slot`; the work then runs
as an ordinary claimed task. See ``docs/periodic.md``.

Modules: :mod:`.cron` (the cron syntax), :mod:`.timing` (slots in time zones, DST),
:mod:`.registry` (``@periodic``), :mod:`.slots` (the database side).
"""

from __future__ import annotations

from django_taskclaim.periodic.registry import (
    MISSED_POLICIES,
    Due,
    Schedule,
    discover,
    get,
    periodic,
    register,
    schedules,
    unregister,
)

__all__ = [
    "MISSED_POLICIES",
    "Due",
    "Schedule",
    "discover",
    "get",
    "periodic",
    "register",
    "schedules",
    "unregister",
]
