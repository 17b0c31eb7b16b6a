"""The doctor's queue checks, from the figures ``taskclaim_stats`` shows: rows waiting
too long, leases nobody reaped, failed rows, silent workers, finished rows to prune."""

from __future__ import annotations

from datetime import timedelta

from django.db import DEFAULT_DB_ALIAS

from django_taskclaim.config import bounds
from django_taskclaim.config.settings import BOUNDS, taskclaim_settings
from django_taskclaim.db import DbNow
from django_taskclaim.flow.pause import describe, paused
from django_taskclaim.models import WorkerProcess
from django_taskclaim.ops.doctor.context import ModelContext
from django_taskclaim.ops.doctor.findings import Finding, duration_option, human_bytes
from django_taskclaim.ops.figures import humanize_seconds, live_workers
from django_taskclaim.recovery.prune import prune
from django_taskclaim.rules import silent_after, silent_worker_q
from django_taskclaim.settle.dependents import HELD, stuck_dependents

READY_AGE, NOT_REAPED, FAILED, SILENT, PRUNE = (
    "TC-D020",
    "TC-D021",
    "TC-D022",
    "TC-D023",
    "TC-D030",
)
#: Paused queues of a model (``docs/pause.md``).
PAUSED = "TC-D024"
#: Waiting rows no settle will release (``docs/workflows.md``).
STUCK_WAITING = "TC-D025"
#: How many waiting rows :func:`stuck_waiting` looks at (the oldest).
WAITING_LOOKED_AT = 1000


def paused_queues(ctx: ModelContext) -> Finding:
    """``TC-D024``: the model's paused queues, each with since when, by whom and its
    ready backlog; a warning while any is paused (a pause is deliberate, a forgotten one
    is a stopped queue)."""
    rows = paused(ctx.model, using=ctx.alias)
    if not rows:
        return Finding(PAUSED, "ok", ctx.alias, "no queue is paused", ctx.label)
    fix = "; ".join(
        f"python manage.py taskclaim_queue resume {ctx.label}"
        + (f" --queue {row.queue}" if row.queue else "")
        for row in rows
    )
    return Finding(
        PAUSED,
        "warning",
        ctx.alias,
        "; ".join(describe(row, using=ctx.alias) for row in rows),
        ctx.label,
        detail="claims of the paused rows return nothing until resumed (docs/pause.md)",
        fix=f"when the pause is over: {fix}",
    )


def ready_age(ctx: ModelContext) -> Finding:
    """``TC-D020``: how long the oldest due ``ready`` row has waited (from its
    ``created_at``); a warning above ``limits.ready_age`` seconds."""
    alias, label = ctx.alias, ctx.label
    stats = ctx.stats
    if not ctx.opts.has("created_at"):
        return Finding(
            READY_AGE, "ok", alias, "the wait of ready rows is unknown: no created_at field", label
        )
    age = stats.oldest_ready_age
    if age is None:
        return Finding(READY_AGE, "ok", alias, "no ready row is due", label)
    title = f"the oldest due ready row has waited {humanize_seconds(age)}"
    if age <= ctx.limits.ready_age:
        return Finding(READY_AGE, "ok", alias, title, label)
    serving = sum(1 for w in live_workers(ctx.registry or alias) if label in w.models)
    return Finding(
        READY_AGE,
        "warning",
        alias,
        title,
        label,
        detail=f"{stats.counts.get('ready', 0)} ready rows; {serving} live worker(s) serve "
        f"{label}; a warning above {humanize_seconds(ctx.limits.ready_age)}",
        fix=f"Run (more) workers for it: {ctx.command('worker')} "
        "(--concurrency / --processes for more at once); taskclaim_stats shows the live ones.",
    )


def not_reaped(ctx: ModelContext) -> Finding:
    """``TC-D021``: rows still ``processing`` well after their lease ended (the
    ``expired()`` rule, for longer than ``limits.reap_grace_intervals`` reap intervals):
    nothing reaps this database."""
    alias, label = ctx.alias, ctx.label
    interval = float(
        bounds.number(
            taskclaim_settings.REAP_INTERVAL,
            "TASKCLAIM_REAP_INTERVAL",
            BOUNDS["REAP_INTERVAL"],
        )
    )
    grace = ctx.limits.reap_grace_intervals * interval
    expired = ctx.stats.expired
    overdue = (
        ctx.rows().expired().filter(locked_until__lt=DbNow() - timedelta(seconds=grace)).count()
        if expired
        else 0
    )
    if overdue:
        return Finding(
            NOT_REAPED,
            "warning",
            alias,
            f"{overdue} row(s) still processing more than {humanize_seconds(grace)} after "
            "their lease ended",
            label,
            detail=f"{expired} expired lease(s) in all. Workers reap every "
            f"TASKCLAIM_REAP_INTERVAL ({interval:g}s), so no worker or reaper runs for this "
            "database, or its reaps fail",
            fix=f"Run {ctx.command('reaper')} now (it takes them back), then keep "
            "workers running (they reap) or run python manage.py reaper --interval "
            f"{interval:g} as a service",
        )
    if expired:
        return Finding(
            NOT_REAPED,
            "ok",
            alias,
            f"{expired} lease(s) ended less than {humanize_seconds(grace)} ago: the next "
            "reap takes them back",
            label,
        )
    return Finding(NOT_REAPED, "ok", alias, "no row is processing past its lease", label)


def failed(ctx: ModelContext) -> Finding:
    """``TC-D022``: rows that ended ``failed`` (their attempts used up); a warning when
    there is any."""
    alias, label = ctx.alias, ctx.label
    count = ctx.stats.counts.get("failed", 0)
    if not count:
        return Finding(FAILED, "ok", alias, "no failed row", label)
    name = ctx.model.__name__
    age = duration_option(ctx.limits.prune_after)
    return Finding(
        FAILED,
        "warning",
        alias,
        f"{count} failed row(s)",
        label,
        detail="each used up its attempts; last_error says why",
        fix=f"Read last_error in the admin (filter: failed) and, once the cause is fixed, "
        f"retry them with its 'Retry selected failed tasks' action or "
        f"{name}.objects.failed().requeue() in python manage.py shell; to drop them: "
        f"{ctx.command('taskclaim_prune', '--states', 'failed', '--older-than', age)}",
    )


def silent_workers(alias: str) -> Finding:
    """``TC-D023``: registered workers not stopped and not heard from for
    ``TASKCLAIM_WORKER_SILENT_AFTER`` seconds (the registry's silent rule); a warning
    naming them."""
    rows = list(
        WorkerProcess.objects.using(alias)
        .filter(silent_worker_q())
        .order_by("worker_id")
        .values_list("worker_id", "hostname", "pid")
    )
    if not rows:
        return Finding(SILENT, "ok", alias, "no silent worker in the registry")
    first = rows[0][0]
    option = "" if alias == DEFAULT_DB_ALIAS else f" --database {alias}"
    return Finding(
        SILENT,
        "warning",
        alias,
        f"{len(rows)} silent worker(s): {', '.join(r[0] for r in rows)}",
        detail=f"not heard from for {silent_after():g}s (TASKCLAIM_WORKER_SILENT_AFTER): "
        "paused, cut off or dead; their rows wait for their leases. "
        + "; ".join(f"{w} is pid {pid} on {host}" for w, host, pid in rows),
        fix="Check each process on its host. For one that is gone, "
        f"python manage.py reaper --release-worker {first}{option} frees its rows "
        "now (never for one that runs), then delete its row in the admin (Workers).",
    )


def prunable(ctx: ModelContext) -> Finding:
    """``TC-D030``: finished rows older than ``limits.prune_after`` (what
    ``taskclaim_prune`` would delete) and the table's size where the vendor tells; a
    warning from ``limits.prune_min_rows`` rows."""
    alias, label, limits = ctx.alias, ctx.label, ctx.limits
    if not ctx.opts.has("finished_at"):
        return Finding(
            PRUNE, "ok", alias, "the age of finished rows is unknown: no finished_at field", label
        )
    age = duration_option(limits.prune_after)
    count = prune(ctx.model, older_than=limits.prune_after, dry_run=True, using=alias)
    size = "size unknown on this database"
    statement = ctx.sql.table_size(ctx.table, ctx.conn.ops.quote_name(ctx.table))
    if statement is not None:
        with ctx.conn.cursor() as cursor:
            cursor.execute(statement.sql, statement.params)
            row = cursor.fetchone()
        if row and row[0] is not None:
            size = f"the table takes {human_bytes(int(row[0]))}"
    title = f"{count} done or cancelled row(s) finished more than {age} ago"
    detail = f"{size}; a warning from {limits.prune_min_rows} rows"
    command = ctx.command("taskclaim_prune", "--older-than", age)
    if count < limits.prune_min_rows:
        return Finding(PRUNE, "ok", alias, title, label, detail=f"{detail}; prune: {command}")
    return Finding(
        PRUNE,
        "warning",
        alias,
        title,
        label,
        detail=detail,
        fix=f"{command} (add --dry-run to count first; schedule it, e.g. daily).",
    )


def stuck_waiting(ctx: ModelContext) -> Finding:
    """``TC-D025``: ``waiting`` rows (of the oldest :data:`WAITING_LOOKED_AT`) that no
    settle will release — a prerequisite deleted by hand or written final outside the
    library, a row waiting for nothing — and rows held for an operator after a failed
    prerequisite (``on_failure='hold'``). Any is a warning naming up to five."""
    found = stuck_dependents(ctx.model, ctx.alias, limit=WAITING_LOOKED_AT)
    if not found:
        return Finding(STUCK_WAITING, "ok", ctx.alias, "no waiting row is stuck", ctx.label)
    held = [pk for pk, why in found if why.startswith(HELD)]
    stuck = [pk for pk, why in found if not why.startswith(HELD)]
    parts = []
    if stuck:
        parts.append(f"{len(stuck)} waiting row(s) no settle will release")
    if held:
        parts.append(f"{len(held)} held for an operator (on_failure='hold')")
    shown = "; ".join(f"#{pk}: {why}" for pk, why in found[:5])
    return Finding(
        STUCK_WAITING,
        "warning",
        ctx.alias,
        ", ".join(parts),
        ctx.label,
        detail=shown + (f"; … {len(found) - 5} more" if len(found) > 5 else ""),
        fix=(
            "requeue the failed or deleted prerequisite's work (the admin's Retry / Requeue), "
            "or cancel the waiting row (the admin's Cancel action); a row that waits for "
            f"nothing: {ctx.label}.objects.filter(pk__in=[...]).update(status='ready') "
            'and notify() (docs/workflows.md, "Operators")'
        ),
    )
