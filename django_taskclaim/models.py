"""Models of the app itself: the lease-lock table, the worker registry, and the periodic
work records (the slots enqueued, and the runs of periodic functions).

The abstract mixins users put on their own models live in :mod:`django_taskclaim.model.mixins`
and are re-exported here, so ``from django_taskclaim.models import ClaimableModel`` works.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.core import checks
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.utils.translation import gettext_lazy as _

from django_taskclaim.db import DbNow
from django_taskclaim.model.indexes import claim_indexes
from django_taskclaim.model.mixins import (
    ClaimableMixin,
    ClaimableModel,
    ClaimFieldsMixin,
    ErrorFieldMixin,
    ScheduleFieldsMixin,
    StatusFieldMixin,
    TimestampFieldsMixin,
)
from django_taskclaim.periodic.call import run_function

__all__ = [
    "ClaimFieldsMixin",
    "ClaimableMixin",
    "ClaimableModel",
    "ErrorFieldMixin",
    "Lease",
    "PeriodicRun",
    "PeriodicSlot",
    "QueueDepth",
    "QueuePause",
    "RateSlot",
    "ScheduleFieldsMixin",
    "StatusFieldMixin",
    "TaskAttempt",
    "TaskHistory",
    "TimestampFieldsMixin",
    "WorkerProcess",
    "claim_indexes",
]


def app_not_installed(**kwargs: Any) -> list[checks.CheckMessage]:
    """``taskclaim.E008``: a model uses the mixins but ``django_taskclaim`` is not in
    ``INSTALLED_APPS`` (its own tables, locks and checks would be missing). Registered
    only then; one line per model using the mixins, or one for the project."""
    users = [m for m in apps.get_models() if issubclass(m, ClaimableMixin)]
    message = (
        "'django_taskclaim' is not in INSTALLED_APPS: add it to INSTALLED_APPS "
        "(the models using django_taskclaim.models.ClaimableModel need its tables)"
    )
    if not users:
        return [checks.Error(message, id="taskclaim.E008")]
    return [checks.Error(message, obj=model, id="taskclaim.E008") for model in users]


if apps.apps_ready and not apps.is_installed("django_taskclaim"):
    # Imported by a project's models without the app installed: the models below are
    # still defined (their explicit app_label keeps Django from stopping with a traceback
    # about Lease) and this check tells what to do, in one line.
    checks.register(app_not_installed)


class Lease(models.Model):
    """A named lease lock: held by ``owner`` until ``locked_until`` (database clock).

    ``token`` grows by one at every acquisition of the key, so a holder whose lease was
    taken over can be fenced: its renew / release name a stale token and change nothing.
    """

    key = models.CharField(_("key"), max_length=255, unique=True)
    owner = models.CharField(_("owner"), max_length=255)
    token = models.BigIntegerField(_("fencing token"), default=1, db_default=1)
    locked_until = models.DateTimeField(_("locked until"))
    acquired_at = models.DateTimeField(_("acquired at"), db_default=DbNow())

    class Meta:
        app_label = "taskclaim"  # so a project without the app still sets up (E008)
        verbose_name = _("lease lock")
        verbose_name_plural = _("lease locks")
        ordering = ["key"]

    def __str__(self) -> str:
        return self.key


#: How many running bodies a worker lists in its registry row (the rest are counted only).
RUNNING_SHOWN = 50


class WorkerProcess(models.Model):
    """A live (or recently live) worker process, kept up to date by its heartbeat."""

    worker_id = models.CharField(_("worker id"), max_length=255, unique=True)
    hostname = models.CharField(_("host"), max_length=255)
    pid = models.PositiveIntegerField(_("pid"))
    started_at = models.DateTimeField(_("started at"), db_default=DbNow())
    last_seen = models.DateTimeField(_("last heartbeat"), db_default=DbNow())
    stopped_at = models.DateTimeField(_("stopped at"), null=True, blank=True)
    model_labels = models.JSONField(_("models"), default=list, blank=True)
    concurrency = models.PositiveIntegerField(_("threads"), default=1)
    in_flight = models.PositiveIntegerField(_("tasks in flight"), default=0)
    processed = models.PositiveBigIntegerField(_("tasks processed"), default=0)
    #: The bodies running at the last refresh: ``[{"model": label, "pk": text, "age":
    #: seconds running then}]`` (at most :data:`RUNNING_SHOWN`); ``None`` from a worker
    #: of a version that does not report them.
    running = models.JSONField(_("running tasks"), null=True, blank=True)
    #: An operator asked this worker to stop gracefully (finish what it holds, claim no
    #: more): when, and who. The worker sees it at its next registry refresh.
    stop_requested_at = models.DateTimeField(_("stop requested at"), null=True, blank=True)
    stop_requested_by = models.CharField(
        _("stop requested by"), max_length=150, blank=True, default="", db_default=""
    )

    class Meta:
        app_label = "taskclaim"  # so a project without the app still sets up (E008)
        verbose_name = _("worker")
        verbose_name_plural = _("workers")
        ordering = ["-last_seen"]
        indexes = [models.Index(fields=["last_seen"], name="taskclaim_worker_seen")]

    def __str__(self) -> str:
        return self.worker_id


class Dashboard(WorkerProcess):
    """No table of its own: the admin index's link to the queue dashboard ("Dashboard"
    under "Task claims"), whose page lives on the worker registry's admin."""

    class Meta:
        proxy = True
        app_label = "taskclaim"
        verbose_name = _("dashboard")
        verbose_name_plural = _("dashboard")
        default_permissions = ()
        # The metrics view's own permission (staff users; Prometheus sends the token)
        permissions = [("view_metrics", _("Can read the metrics (Prometheus text)"))]


class QueuePause(models.Model):
    """A paused queue: no claim takes a ``ready`` row of ``model`` (an ``app_label.Model``
    label) — of the queue ``queue`` only, or of every queue when ``queue`` is ``""``
    — while this row exists. Resuming deletes it. Rows already ``processing`` finish
    normally. ``paused_by`` / ``paused_at`` say who paused it and when (database clock).
    """

    model = models.CharField(_("model"), max_length=255)
    queue = models.CharField(_("queue"), max_length=255, blank=True, default="")
    paused_at = models.DateTimeField(_("paused at"), db_default=DbNow())
    paused_by = models.CharField(_("paused by"), max_length=255, blank=True, default="")
    reason = models.CharField(_("reason"), max_length=255, blank=True, default="")

    class Meta:
        app_label = "taskclaim"  # so a project without the app still sets up (E008)
        verbose_name = _("paused queue")
        verbose_name_plural = _("paused queues")
        ordering = ["model", "queue"]
        constraints = [
            models.UniqueConstraint(fields=["model", "queue"], name="taskclaim_pause_once")
        ]

    def __str__(self) -> str:
        return f"{self.model} queue={self.queue}" if self.queue else self.model


class RateSlot(models.Model):
    """One slot of a rate limit's ring: ``N`` rows per limited scope (``model``, an
    ``app_label.Model`` label, and ``scope``: ``""`` for the whole model, else
    ``queue:<name>`` or ``key:<value>``), each holding the claim time (database clock)
    of the last task start that used it. A claim takes one slot per row it claims, only
    a slot whose ``last_start`` is more than one window old, and writes its own claim
    time there in the same transaction: at most ``N`` starts in any window, and nothing
    to release (a killed worker leaks no slot). Created on first use (docs/rate-limits.md).
    """

    model = models.CharField(_("model"), max_length=255)
    scope = models.CharField(_("scope"), max_length=255, blank=True, default="")
    slot = models.PositiveIntegerField(_("slot"))
    last_start = models.DateTimeField(_("last start"))

    class Meta:
        app_label = "taskclaim"  # so a project without the app still sets up (E008)
        verbose_name = _("rate limit slot")
        verbose_name_plural = _("rate limit slots")
        constraints = [
            models.UniqueConstraint(
                fields=["model", "scope", "slot"], name="taskclaim_rate_slot_once"
            )
        ]
        indexes = [
            models.Index(fields=["model", "scope", "last_start"], name="taskclaim_rate_free"),
            # what operators read and pruning looks for: a model's slots by claim time
            # (those of the current window, however many idle rings the table holds)
            models.Index(fields=["model", "last_start"], name="taskclaim_rate_recent"),
        ]

    def __str__(self) -> str:
        return f"{self.model} {self.scope or '*'} #{self.slot}"


class TaskHistory(models.Model):
    """Attempts that ended ``done`` / ``failed`` in one minute (database clock, UTC), per
    claimable model (``model``, an ``app_label.Model`` label) and queue (``queue``,
    ``""`` for a model without queues): what the admin's charts and its "done, last N
    min" figures read instead of scanning the finished rows. Written by the workers
    (counted in memory, added with one upsert per heartbeat:
    :mod:`django_taskclaim.worker.history`), never per task; rows finished outside a
    worker are not counted.
    Rows older than 7 days are deleted (docs/admin.md, "Charts")."""

    model = models.CharField(_("model"), max_length=255)
    queue = models.CharField(_("queue"), max_length=255, blank=True, default="")
    minute = models.DateTimeField(_("minute"))
    done = models.PositiveBigIntegerField(_("done"), default=0)
    failed = models.PositiveBigIntegerField(_("failed"), default=0)

    class Meta:
        app_label = "taskclaim"  # so a project without the app still sets up (E008)
        verbose_name = _("task history minute")
        verbose_name_plural = _("task history")
        constraints = [
            models.UniqueConstraint(
                fields=["model", "queue", "minute"], name="taskclaim_history_once"
            )
        ]
        indexes = [models.Index(fields=["model", "minute"], name="taskclaim_history_model")]

    def __str__(self) -> str:
        return f"{self.model} {self.queue or '*'} @ {self.minute:%Y-%m-%d %H:%M}"


class QueueDepth(models.Model):
    """How many rows of a claimable model (``model``, an ``app_label.Model`` label) were
    ``ready`` and ``processing`` at one minute (database clock, UTC): the samples the
    admin's "queue depth" chart draws (rows do not remember when they were ready). One
    worker per model takes each, about every ``TASKCLAIM_DEPTH_SAMPLE_INTERVAL`` seconds,
    in one statement (:mod:`django_taskclaim.worker.maintenance.depth`); at most one row
    per model and minute; rows older than 48 hours are deleted by the workers."""

    model = models.CharField(_("model"), max_length=255)
    minute = models.DateTimeField(_("minute"))
    ready = models.PositiveBigIntegerField(_("ready"), default=0)
    processing = models.PositiveBigIntegerField(_("processing"), default=0)

    class Meta:
        app_label = "taskclaim"  # so a project without the app still sets up (E008)
        verbose_name = _("queue depth sample")
        verbose_name_plural = _("queue depth samples")
        constraints = [
            models.UniqueConstraint(fields=["model", "minute"], name="taskclaim_depth_once")
        ]

    def __str__(self) -> str:
        return f"{self.model} @ {self.minute:%Y-%m-%d %H:%M}: {self.ready} ready"


class PeriodicSlot(models.Model):
    """One slot of a periodic schedule, enqueued: the insert-as-lock of that slot.

    Unique on ``(schedule, slot)``: the scheduler inserts it in the same transaction as
    the work it enqueues, so a second scheduler's insert of the same slot fails and
    enqueues nothing. ``target`` / ``target_pk`` name the row the slot created.
    """

    schedule = models.CharField(_("schedule"), max_length=200)
    slot = models.DateTimeField(_("slot"))
    created_at = models.DateTimeField(_("enqueued at"), db_default=DbNow())
    enqueued_by = models.CharField(_("enqueued by"), max_length=255, blank=True, default="")
    target = models.CharField(_("model"), max_length=255, blank=True, default="")
    target_pk = models.CharField(_("row"), max_length=255, blank=True, default="")

    class Meta:
        app_label = "taskclaim"  # so a project without the app still sets up (E008)
        verbose_name = _("periodic slot")
        verbose_name_plural = _("periodic slots")
        ordering = ["-slot"]
        constraints = [
            models.UniqueConstraint(fields=["schedule", "slot"], name="taskclaim_slot_once")
        ]

    def __str__(self) -> str:
        return f"{self.schedule} @ {self.slot:%Y-%m-%d %H:%M:%S}"


class PeriodicRun(ClaimableModel):
    """The run of a periodic function for one slot: an ordinary claimable row, so it is
    leased, retried, recovered and fenced like any task. ``result`` holds what the
    function returned (JSON, or its ``repr``)."""

    schedule = models.CharField(_("schedule"), max_length=200)
    slot = models.DateTimeField(_("slot"))
    function = models.CharField(_("function"), max_length=255)
    result = models.JSONField(_("result"), null=True, blank=True, encoder=DjangoJSONEncoder)

    class Meta(ClaimableModel.Meta):
        app_label = "taskclaim"  # so a project without the app still sets up (E008)
        verbose_name = _("periodic run")
        verbose_name_plural = _("periodic runs")
        ordering = ["-slot"]
        constraints = [
            models.UniqueConstraint(fields=["schedule", "slot"], name="taskclaim_run_once")
        ]

    def __str__(self) -> str:
        return f"{self.schedule} @ {self.slot:%Y-%m-%d %H:%M:%S}"

    def process(self) -> Any:
        """Call the function (with this row if it takes an argument); see
        :func:`django_taskclaim.periodic.call.run_function`."""
        return run_function(self)


class TaskAttempt(models.Model):
    """One attempt of a task row, as the worker that ran it saw it: which row (model label
    and primary key as text), its attempt number, the worker, when its body started (the
    database clock), how long it ran, what became of it and its error. Written by the
    workers in bulk with their heartbeat (``TASKCLAIM_ATTEMPT_LOG`` says which attempts);
    the last ``TASKCLAIM_ATTEMPTS_KEPT`` per row are kept, none older than 7 days."""

    model = models.CharField(_("model"), max_length=100)
    row = models.CharField(_("row"), max_length=191)
    number = models.PositiveIntegerField(_("attempt"))
    worker = models.CharField(_("worker"), max_length=255, blank=True, default="")
    started_at = models.DateTimeField(_("started at"))
    runtime = models.FloatField(_("runtime (s)"))
    outcome = models.CharField(_("outcome"), max_length=16)
    error = models.TextField(_("error"), blank=True, default="")

    class Meta:
        app_label = "taskclaim"
        verbose_name = _("task attempt")
        verbose_name_plural = _("task attempts")
        ordering = ["model", "row", "-number"]
        indexes = [
            models.Index(fields=["model", "row", "number"], name="taskclaim_attempt_row"),
            models.Index(fields=["started_at"], name="taskclaim_attempt_age"),
        ]

    def __str__(self) -> str:
        return f"{self.model} #{self.row}, attempt {self.number}: {self.outcome}"


class TaskDependency(models.Model):
    """One edge of a dependency graph: the row ``dependent`` (``dependent_model``, an
    ``app_label.Model`` label, and ``dependent_pk``, its primary key as text) waits for
    the row ``prerequisite`` (the same pair), of any claimable models whose ``ClaimMeta``
    declares ``dependents``. Written by ``after=`` at enqueue; ``outcome`` is empty while
    the edge is open and becomes the prerequisite's final state (``done``, ``failed``,
    ``cancelled``) in the transaction of the settle that closed it, ``settled_at`` its
    database clock. ``on_failure`` is the dependent's policy when a prerequisite ends
    ``failed`` / ``cancelled`` (the same on each of its edges): ``cancel``, ``run`` or
    ``hold``. An edge held by ``hold`` stays open. See docs/workflows.md."""

    prerequisite_model = models.CharField(_("prerequisite model"), max_length=100)
    prerequisite_pk = models.CharField(_("prerequisite"), max_length=191)
    dependent_model = models.CharField(_("dependent model"), max_length=100)
    dependent_pk = models.CharField(_("dependent"), max_length=191)
    on_failure = models.CharField(_("on failure"), max_length=8, default="cancel")
    outcome = models.CharField(_("outcome"), max_length=16, blank=True, default="")
    created_at = models.DateTimeField(_("created at"), db_default=DbNow())
    settled_at = models.DateTimeField(_("settled at"), null=True, blank=True)

    class Meta:
        app_label = "taskclaim"
        verbose_name = _("task dependency")
        verbose_name_plural = _("task dependencies")
        indexes = [
            models.Index(
                fields=["prerequisite_model", "prerequisite_pk"], name="taskclaim_dep_prereq"
            ),
            # A settle closes the edges from its rows to one dependent: with both pairs in
            # each index, whichever the planner picks finds them without reading the
            # dependent's other edges (a fan-in of 100,000).
            models.Index(
                fields=["dependent_model", "dependent_pk", "prerequisite_model", "prerequisite_pk"],
                name="taskclaim_dep_dependent",
            ),
        ]

    def __str__(self) -> str:
        return (
            f"{self.dependent_model} #{self.dependent_pk} after "
            f"{self.prerequisite_model} #{self.prerequisite_pk}"
        )


class TaskFanIn(models.Model):
    """The fan-in counter of one dependent row (``dependent_model``, ``dependent_pk``, as
    in :class:`TaskDependency`): of its ``total`` prerequisites, how many are still
    ``open`` and how many ended ``done``, ``failed`` or ``cancelled``. Written with the
    edges by ``after=``; every settle that closes edges of the dependent updates it in
    the settle's own transaction, under a lock of this row, and the settle that brings
    ``open`` to 0 releases the dependent (``released_at``, database clock): one small
    row per dependent, so a prerequisite's settle costs the same whether the dependent
    waits for ten rows or a hundred thousand. An edge held by ``on_failure='hold'``
    stays open and is not counted as settled. See docs/workflows.md, "Fan-in"."""

    dependent_model = models.CharField(_("dependent model"), max_length=100)
    dependent_pk = models.CharField(_("dependent"), max_length=191)
    on_failure = models.CharField(_("on failure"), max_length=8, default="cancel")
    total = models.PositiveIntegerField(_("prerequisites"), default=0)
    open = models.PositiveIntegerField(_("open"), default=0)
    done = models.PositiveIntegerField(_("done"), default=0)
    failed = models.PositiveIntegerField(_("failed"), default=0)
    cancelled = models.PositiveIntegerField(_("cancelled"), default=0)
    created_at = models.DateTimeField(_("created at"), db_default=DbNow())
    released_at = models.DateTimeField(_("released at"), null=True, blank=True)

    class Meta:
        app_label = "taskclaim"
        verbose_name = _("task fan-in")
        verbose_name_plural = _("task fan-ins")
        constraints = [
            models.UniqueConstraint(
                fields=["dependent_model", "dependent_pk"], name="taskclaim_fanin_dependent"
            ),
        ]

    def __str__(self) -> str:
        return (
            f"{self.dependent_model} #{self.dependent_pk}: {self.open} of {self.total} "
            "prerequisites open"
        )


class TaskStep(models.Model):
    """One completed durable step of a task row (``task_model``, ``task_pk``, as in
    :class:`TaskDependency`): its ``name``, the JSON ``result`` its function returned,
    and the claim token it was written under. Written by ``task.step(name, fn)`` inside
    a fenced transaction with the step's own database writes, so both commit while the
    claim is still held, or neither; a later attempt of the row finds it and gets the
    stored result without running the step again. See docs/workflows.md, "Durable
    steps"."""

    task_model = models.CharField(_("task model"), max_length=100)
    task_pk = models.CharField(_("task"), max_length=191)
    name = models.CharField(_("step"), max_length=100)
    result = models.JSONField(_("result"), null=True, blank=True, encoder=DjangoJSONEncoder)
    token = models.BigIntegerField(_("claim token"))
    attempt = models.PositiveIntegerField(_("attempt"))
    created_at = models.DateTimeField(_("completed at"), db_default=DbNow())

    class Meta:
        app_label = "taskclaim"
        verbose_name = _("task step")
        verbose_name_plural = _("task steps")
        constraints = [
            models.UniqueConstraint(
                fields=["task_model", "task_pk", "name"], name="taskclaim_step_once"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.task_model} #{self.task_pk}: step {self.name}"


class TaskEvent(models.Model):
    """A named event rows may wait for (``task.wait_for_event(name)``): ``emitted_at`` and
    ``payload`` once ``emit(name, payload)`` committed (the first emit wins), or a row
    written by the first wait, not emitted yet. Emit and wait lock this row, so a wait
    either sees the emit or is woken by it. See docs/workflows.md, "Waiting for an
    event"."""

    name = models.CharField(_("name"), max_length=191, unique=True)
    payload = models.JSONField(_("payload"), null=True, blank=True, encoder=DjangoJSONEncoder)
    emitted_at = models.DateTimeField(_("emitted at"), null=True, blank=True)

    class Meta:
        app_label = "taskclaim"
        verbose_name = _("task event")
        verbose_name_plural = _("task events")

    def __str__(self) -> str:
        return f"{self.name} ({'emitted' if self.emitted_at else 'awaited'})"


class TaskEventWait(models.Model):
    """A row (``task_model``, ``task_pk``) parked until the event ``name`` is emitted or
    ``deadline`` (database clock) passes; the emit makes the row due at once."""

    name = models.CharField(_("event"), max_length=191)
    task_model = models.CharField(_("task model"), max_length=100)
    task_pk = models.CharField(_("task"), max_length=191)
    deadline = models.DateTimeField(_("deadline"))
    created_at = models.DateTimeField(_("since"), db_default=DbNow())

    class Meta:
        app_label = "taskclaim"
        verbose_name = _("task event wait")
        verbose_name_plural = _("task event waits")
        constraints = [
            models.UniqueConstraint(
                fields=["task_model", "task_pk", "name"], name="taskclaim_wait_once"
            ),
        ]
        indexes = [models.Index(fields=["name"], name="taskclaim_wait_event")]

    def __str__(self) -> str:
        return f"{self.task_model} #{self.task_pk} waits for {self.name}"
