"""What the doctor reports: :class:`Finding`, the thresholds it judges by, the exit code."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any, Literal

from django.db import DatabaseError, connections, transaction

from django_taskclaim.exceptions import TaskClaimError
from django_taskclaim.redact import redact

Severity = Literal["ok", "warning", "error"]
#: The severities, mildest first.
SEVERITIES: tuple[Severity, ...] = ("ok", "warning", "error")
#: The fix of a check that could not run (a database error).
CHECK_FAILED_FIX = (
    "Run python manage.py migrate (a missing table or column fails here) and make sure "
    "the database user may read the table; the detail has the database's error."
)
#: The fix of a check stopped by an invalid option.
BAD_OPTION_FIX = "Run python manage.py check --tag taskclaim and correct what it reports."


@dataclass(frozen=True)
class Finding:
    """One result of the doctor: what was looked at, how it stands, and how to fix it.

    ``id`` is stable (``TC-D001`` …, see ``docs/doctor.md``); ``model`` is a model label,
    or ``None`` for a finding about the database or the settings; ``fix`` is the
    command to run or the setting to change, never empty unless ``severity`` is
    ``"ok"`` (construction refuses that).
    """

    id: str
    severity: Severity
    database: str
    title: str
    model: str | None = None
    detail: str = ""
    fix: str = ""

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"{self.id}: severity must be one of {SEVERITIES}")
        if self.severity != "ok" and not self.fix.strip():
            raise ValueError(f"{self.id}: a {self.severity} must name its fix")

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dictionary of every field."""
        return asdict(self)


@dataclass(frozen=True)
class Thresholds:
    """Where the doctor draws its lines (the defaults are documented in docs/doctor.md)."""

    #: Clock offset (seconds) between this host and the database above which it warns.
    clock_warning: float = 1.0
    #: … and the fraction of the shortest lease above which the offset is an error.
    clock_error_fraction: float = 0.1
    #: Rows in a table below which a plan that skips an index is not judged (the
    #: planner rightly prefers a scan of a small table), nor a missing index an error.
    plan_min_rows: int = 10_000
    #: Seconds the oldest due ``ready`` row may have waited before it warns.
    ready_age: float = 900.0
    #: Reap intervals (``TASKCLAIM_REAP_INTERVAL``) a lease may be expired for before it
    #: counts as not reaped.
    reap_grace_intervals: float = 2.0
    #: Age of finished rows the prune check counts, and that its fix prunes.
    prune_after: timedelta = timedelta(days=7)
    #: Finished rows older than :attr:`prune_after` from which the prune check warns.
    prune_min_rows: int = 10_000
    #: The ``LIMIT`` of the claim query whose plan is read.
    explain_limit: int = 10


def exit_code(findings: Iterable[Finding], *, fail_on: Severity = "warning") -> int:
    """``2`` if any finding is an error, else ``1`` if any is a warning (``0`` instead
    when ``fail_on`` is ``"error"``), else ``0``."""
    worst = max((SEVERITIES.index(f.severity) for f in findings), default=0)
    if worst == 2:
        return 2
    if worst == 1 and fail_on == "warning":
        return 1
    return 0


def first_line(exc: BaseException) -> str:
    """The first line of an error's text (its class name when it has none), any
    password in it hidden (:func:`~django_taskclaim.redact.redact`)."""
    text = redact(str(exc)).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def guarded(
    check_id: str,
    what: str,
    database: str,
    model: str | None,
    check: Callable[[], list[Finding]],
) -> list[Finding]:
    """``check()``'s findings; a database error or an invalid option becomes one error
    finding ``check_id`` saying that ``what`` could not be checked, and why.

    Inside the caller's transaction the check runs in a savepoint, so a failed
    statement does not abort that transaction (PostgreSQL) for the checks after it.
    """
    conn = connections[database]
    scope = transaction.atomic(using=database) if conn.in_atomic_block else nullcontext()
    try:
        with scope:
            return check()
    except DatabaseError as exc:
        return [
            Finding(
                check_id,
                "error",
                database,
                f"{what}: the check failed",
                model,
                detail=first_line(exc),
                fix=CHECK_FAILED_FIX,
            )
        ]
    except TaskClaimError as exc:
        return [
            Finding(
                check_id,
                "error",
                database,
                f"{what}: an option is invalid",
                model,
                detail=first_line(exc),
                fix=BAD_OPTION_FIX,
            )
        ]


def duration_option(age: timedelta) -> str:
    """``age`` as ``taskclaim_prune --older-than`` reads it: ``7d``, ``12h``, ``90s``."""
    seconds = int(age.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def human_bytes(size: int) -> str:
    """``1536`` → ``"1.5 KiB"``."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"  # pragma: no cover - the loop always returns


def format_findings(findings: Iterable[Finding], code: int) -> str:
    """One line per finding (severity, id, model, title); under a warning or an error,
    its detail and its fix, indented; then a count per severity and the exit code
    (``taskclaim_doctor``'s text)."""
    findings = list(findings)
    width = max((len(f.model or "-") for f in findings), default=1)
    lines = []
    for f in findings:
        lines.append(f"{f.severity:<8} {f.id}  {(f.model or '-'):<{width}}  {f.title}")
        if f.severity != "ok":
            if f.detail:
                lines.append(f"{'':<8} {'':<7}  {'':<{width}}  detail: {f.detail}")
            lines.append(f"{'':<8} {'':<7}  {'':<{width}}  fix: {f.fix}")
    counts = {s: sum(1 for f in findings if f.severity == s) for s in SEVERITIES}
    lines.append("")
    lines.append(
        f"{counts['ok']} ok, {counts['warning']} warning(s), {counts['error']} error(s); "
        f"exit {code}"
    )
    return "\n".join(lines)
