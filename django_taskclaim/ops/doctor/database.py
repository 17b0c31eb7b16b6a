"""The doctor's checks of one database and of the settings about it: can it be reached,
does the declared pooler mode match what is there, how far apart are the clocks, and can
heartbeats keep each lease alive."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections
from django.utils import timezone

from django_taskclaim.backends import for_connection
from django_taskclaim.checks.core import heartbeat_problem
from django_taskclaim.checks.locks import pooler_messages
from django_taskclaim.config import bounds
from django_taskclaim.config.options import get_options
from django_taskclaim.config.settings import taskclaim_settings
from django_taskclaim.db import db_now
from django_taskclaim.exceptions import LockUsageError, TaskClaimError
from django_taskclaim.locks.advisory_lock import refuse_if_proxied
from django_taskclaim.ops.doctor.findings import BAD_OPTION_FIX, Finding, Thresholds, first_line
from django_taskclaim.wakeup.trigger import trigger_state

REACHABLE, POOLER, PROXY, CLOCK, HEARTBEAT, DURABLE, TRIGGER = (
    "TC-D001",
    "TC-D002",
    "TC-D003",
    "TC-D004",
    "TC-D005",
    "TC-D006",
    "TC-D007",
)


def reachable(alias: str) -> Finding:
    """``TC-D001``: the database answers the cheapest statement; an error (with the
    driver's message in one line) when it does not."""
    conn = connections[alias]
    try:
        with conn.cursor() as cursor:
            cursor.execute(for_connection(conn).ping_sql)
            cursor.fetchall()
        version = ".".join(str(part) for part in conn.get_database_version())
    except (DatabaseError, ImproperlyConfigured, OSError) as exc:
        return Finding(
            REACHABLE,
            "error",
            alias,
            f"database {alias!r} cannot be reached",
            detail=first_line(exc),
            fix=f"Check DATABASES[{alias!r}] (HOST, PORT, NAME, USER, PASSWORD) and that "
            "the server runs and accepts connections from this host.",
        )
    return Finding(
        REACHABLE, "ok", alias, f"database {alias!r} answers ({conn.display_name} {version})"
    )


def pooler(alias: str, *, connected: bool) -> list[Finding]:
    """``TC-D002``: the system checks about poolers for this database (the declared
    ``TASKCLAIM_POOLER_MODE`` against its settings); ``TC-D003``: whether a pooler or
    proxy really sits between while no mode is declared (the check that refuses
    session-scope advisory locks, run now)."""
    conn = connections[alias]
    mode = taskclaim_settings.POOLER_MODE
    found = [
        Finding(
            POOLER,
            "warning",
            alias,
            message.msg,
            detail=f"system check {message.id}",
            fix=str(message.hint),
        )
        for message in pooler_messages({alias: conn.settings_dict}, mode)
    ]
    sql = for_connection(conn)
    if not sql.pooler_mode_applies:
        return found or [
            Finding(
                POOLER,
                "ok",
                alias,
                "TASKCLAIM_POOLER_MODE does not apply here (it describes a pooler in front "
                "of PostgreSQL)",
            )
        ]
    if not found:
        found.append(Finding(POOLER, "ok", alias, f"TASKCLAIM_POOLER_MODE is {mode!r}"))
    if connected and mode is None:
        try:
            refuse_if_proxied(conn, sql)
        except LockUsageError as exc:
            found.append(
                Finding(
                    PROXY,
                    "warning",
                    alias,
                    "a pooler or proxy sits between Django and the database, and "
                    "TASKCLAIM_POOLER_MODE does not say which",
                    detail=str(exc),
                    fix='Set TASKCLAIM_POOLER_MODE = "transaction" if it pools transactions '
                    '(pgBouncer pool_mode = transaction), "session" if it pools sessions '
                    "or is a plain proxy.",
                )
            )
        else:
            found.append(
                Finding(
                    PROXY,
                    "ok",
                    alias,
                    "no pooler detected: the server reported no port but the one dialled",
                )
            )
    return found


def durable_commits(alias: str) -> Finding:
    """``TC-D006``: commits the server acknowledges are on disk before it says so
    (:meth:`~django_taskclaim.backends.base.DatabaseSQL.commit_durability`), as this
    project's connections to ``alias`` see it (session settings in ``OPTIONS`` count)."""
    conn = connections[alias]
    sql = for_connection(conn)
    if sql.durability_sql is None:
        return Finding(DURABLE, "ok", alias, "commits are as durable as the database makes them")
    with conn.cursor() as cursor:
        cursor.execute(sql.durability_sql)
        (value,) = cursor.fetchone()
    problem = sql.commit_durability(value)
    if problem is None:
        return Finding(DURABLE, "ok", alias, f"commits are flushed to disk ({value})")
    severity, why = problem
    return Finding(
        DURABLE,
        "error" if severity == "error" else "warning",
        alias,
        why,
        detail="the row is then ready again under the token its first worker still holds: "
        "the next claim hands that token out again, fencing cannot tell the two workers "
        "apart, and the task runs twice within its lease",
        fix="Keep commits durable for the connections that claim and complete rows "
        "(PostgreSQL: synchronous_commit = on, or local; MariaDB/MySQL: "
        "innodb_flush_log_at_trx_commit = 1), in the server's configuration and in "
        "DATABASES[...]['OPTIONS'].",
    )


def notify_trigger(model: Any, alias: str) -> list[Finding]:
    """``TC-D007`` (PostgreSQL): a model with ``notify = "trigger"`` has its trigger, as
    it should be now; a model without has none left over. Nothing for the others."""
    if not for_connection(connections[alias]).supports_notify_trigger:
        return []
    label = model._meta.label
    state = trigger_state(model, alias)
    fix = (
        "Run python manage.py migrate on this database: it creates, updates and drops the "
        "notify triggers to match the models."
    )
    if state == "ok":
        return [Finding(TRIGGER, "ok", alias, "the notify trigger is in place", label)]
    if state == "none":
        return []
    title = {
        "missing": "notify = 'trigger', but the table has no notify trigger",
        "stale": "the notify trigger names another channel, label or ready state",
        "unwanted": "a notify trigger is left on the table, but notify is not 'trigger'",
    }[state]
    detail = (
        "workers are woken by polling only (every TASKCLAIM_POLL_INTERVAL)"
        if state in ("missing", "stale")
        else "every ready row is announced twice: by the trigger and by the saving process"
    )
    return [Finding(TRIGGER, "warning", alias, title, label, detail=detail, fix=fix)]


def host_now() -> datetime:
    """This host's clock (``timezone.now()``)."""
    return timezone.now()


def clock(alias: str, leases: list[float], limits: Thresholds) -> Finding:
    """``TC-D004``: the offset between this host's clock and the database's, less half
    the round trip it was read in. A warning above ``limits.clock_warning`` seconds; an
    error above ``limits.clock_error_fraction`` of the shortest lease in ``leases``
    (``TASKCLAIM_LEASE`` when empty)."""
    before = host_now()
    database = db_now(alias)
    after = host_now()
    if not settings.USE_TZ:
        database = database.replace(tzinfo=None)
    middle = before + (after - before) / 2
    offset = (database - middle).total_seconds()
    sure = max(0.0, abs(offset) - (after - before).total_seconds() / 2)
    shortest = min(leases) if leases else _lease_setting()
    error_at = math.inf if shortest is None else shortest * limits.clock_error_fraction
    ahead = "ahead of" if offset > 0 else "behind"
    title = f"the database clock is {abs(offset):.3f}s {ahead} this host's"
    detail = (
        f"a warning above {limits.clock_warning:g}s, an error above "
        f"{limits.clock_error_fraction:g} of the shortest lease "
        f"({f'{error_at:g}s' if shortest is not None else 'none valid'}). Leases "
        "and schedules run on the database clock; times this host computes "
        "(timezone.now() in run_after, deadlines, logs) are off by the offset"
    )
    if sure <= min(limits.clock_warning, error_at):
        return Finding(CLOCK, "ok", alias, title, detail=detail)
    return Finding(
        CLOCK,
        "error" if sure > error_at else "warning",
        alias,
        title,
        detail=detail,
        fix="Synchronise the clocks of this host and of the database server with NTP "
        "(chronyc tracking or timedatectl shows the state on each).",
    )


def _lease_setting() -> float | None:
    """``TASKCLAIM_LEASE`` in seconds, or ``None`` when it is invalid (``taskclaim.E005``)."""
    try:
        value = bounds.number(taskclaim_settings.LEASE, "TASKCLAIM_LEASE", bounds.LEASE)
    except TaskClaimError:
        return None
    return float(value)


def heartbeat(model: Any, alias: str) -> Finding:
    """``TC-D005``: the heartbeat keeps the model's lease alive (system check
    ``taskclaim.E006``, called as it is)."""
    label = model._meta.label
    try:
        lease = get_options(model).lease
    except TaskClaimError as exc:
        return Finding(
            HEARTBEAT,
            "error",
            alias,
            "the claim options are invalid",
            label,
            detail=first_line(exc),
            fix=BAD_OPTION_FIX,
        )
    message = heartbeat_problem(model, lease)
    if message is not None:
        return Finding(
            HEARTBEAT,
            "error",
            alias,
            message.msg,
            label,
            detail=f"system check {message.id}",
            fix=str(message.hint),
        )
    beat = taskclaim_settings.HEARTBEAT_INTERVAL
    every = "at a third of the lease" if beat is None else f"every {beat}s"
    return Finding(
        HEARTBEAT,
        "ok",
        alias,
        f"heartbeats {every} keep the {lease:g}s lease alive",
        label,
    )
