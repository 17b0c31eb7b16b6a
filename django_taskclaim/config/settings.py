"""Project-wide settings, all prefixed ``TASKCLAIM_`` and read live on every access.

:class:`TaskClaimSettings` declares each setting once, as a typed attribute
(:class:`Setting`: its type, default, bounds, whether ``None`` is allowed, or why it was
removed); :data:`TABLE` and every other lookup here (:data:`SETTINGS`, :data:`DEFAULTS`,
:data:`BOUNDS`, :data:`NONE_ALLOWED`, :data:`REMOVED`) are derived from it, so a new
setting is one line of the class.

``from django_taskclaim.config.settings import taskclaim_settings`` then
``taskclaim_settings.LEASE`` returns ``settings.TASKCLAIM_LEASE`` if the project sets
it, else its default, and mypy knows it is a ``float``. Because nothing is cached,
``override_settings`` works.
Unknown ``TASKCLAIM_*`` names are reported by the system check ``taskclaim.E001``,
removed ones by ``taskclaim.E007``; numeric ones are checked against their bounds with
:func:`django_taskclaim.config.bounds.number` (:func:`setting_problem`, ``taskclaim.E005``,
in :mod:`django_taskclaim.checks.core`). Every setting is documented in
``docs/settings.md`` (``tests/config/test_settings_table.py`` keeps the two equal).
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any, overload

from django.conf import settings

from django_taskclaim.config import bounds
from django_taskclaim.config.bounds import DAY, MAX_LEASE, Bound
from django_taskclaim.exceptions import ConfigurationError

PREFIX = "TASKCLAIM_"
#: The tag of every django-taskclaim system check (``manage.py check --tag taskclaim``).
CHECK_TAG = "taskclaim"


class Setting[T]:
    """One ``TASKCLAIM_<name>`` setting, declared as an attribute of
    :class:`TaskClaimSettings` (its name is the attribute's).

    Read on :data:`taskclaim_settings`, it is ``settings.TASKCLAIM_<name>`` if the project
    sets it, else ``default``: read live (``override_settings`` works), typed ``T`` for
    mypy. ``kind`` is the type (or types) of its values; ``bound`` the range a number must
    lie in (``None``: not a number, or not bounded); ``none_allowed`` says ``None`` means
    "not set" (a default derived elsewhere, or "never"). A setting with ``removed`` set
    no longer exists: setting it is an error with that hint (what to do instead), and
    reading it an ``AttributeError``.
    """

    name: str

    def __init__(
        self,
        kind: type | tuple[type, ...],
        default: T,
        bound: Bound | None = None,
        *,
        none_allowed: bool = False,
        removed: str | None = None,
    ) -> None:
        self.kind = kind
        self.default = default
        self.bound = bound
        self.none_allowed = none_allowed
        self.removed = removed

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Setting({PREFIX}{self.name})"

    @overload
    def __get__(self, instance: None, owner: type | None = None) -> Setting[T]: ...

    @overload
    def __get__(self, instance: object, owner: type | None = None) -> T: ...

    def __get__(self, instance: object, owner: type | None = None) -> Setting[T] | T:
        if instance is None:
            return self
        if self.removed is not None:
            raise AttributeError(f"unknown django-taskclaim setting {PREFIX}{self.name}")
        value: T = getattr(settings, PREFIX + self.name, self.default)
        return value


_DEAD_AFTER = (
    "silence is no longer taken as death: a silent worker's rows wait for their lease "
    "(or for its supervisor, or an operator, to release them). Use "
    "TASKCLAIM_WORKER_SILENT_AFTER to say when the admin and stats show a worker as silent."
)


class TaskClaimSettings:
    """Live, typed view of the ``TASKCLAIM_*`` settings with their defaults: every
    setting declared once, in the order of ``docs/settings.md`` (without the prefix).

    A range shared with ``ClaimMeta`` options and call arguments is named in
    :mod:`~django_taskclaim.config.bounds` (``bounds.LEASE`` …); the others are written
    here.
    """

    # Claiming: auto | skip_locked | cas | advisory | serializable | hold
    STRATEGY: Setting[str] = Setting(str, "auto")
    # seconds a claim is held before the reaper may take it back
    LEASE: Setting[float] = Setting(float, 300.0, bounds.LEASE)
    # claims before a task ends failed
    MAX_ATTEMPTS: Setting[int] = Setting(int, 5, bounds.MAX_ATTEMPTS)
    # seconds; delay = RETRY_BACKOFF * 2 ** (attempts - 1), at most RETRY_BACKOFF_MAX
    RETRY_BACKOFF: Setting[float] = Setting(float, 2.0, bounds.RETRY_BACKOFF)
    RETRY_BACKOFF_MAX: Setting[float] = Setting(float, 3600.0, bounds.RETRY_BACKOFF)
    # +/- fraction of random jitter applied to the backoff
    RETRY_JITTER: Setting[float] = Setting(float, 0.25, bounds.RETRY_JITTER)
    # rows read per round by the cas strategy
    CAS_CANDIDATES: Setting[int] = Setting(int, 16, Bound(1, 10_000, whole=True))
    # claims of this many rows or more take turns per table; None = never
    CLAIM_GATE: Setting[int | None] = Setting(int, 50, bounds.CLAIM_GATE, none_allowed=True)
    # seconds a task body may run (None = no deadline); then its flag is set and the
    # attempt fails with TimeoutError
    TIMEOUT: Setting[float | None] = Setting(float, None, bounds.TIMEOUT, none_allowed=True)
    # seconds past its deadline before a --processes child running it is replaced;
    # None = the model's lease
    TIMEOUT_GRACE: Setting[float | None] = Setting(
        float, None, bounds.TIMEOUT_GRACE, none_allowed=True
    )
    # retries of deadlocks / serialization failures / "database is locked"
    DB_RETRIES: Setting[int] = Setting(int, 10, Bound(0, 1000, whole=True))
    # Recovery: rows per reaper statement; seconds between periodic reaps inside workers
    REAP_BATCH: Setting[int] = Setting(int, 1000, Bound(1, 100_000, whole=True))
    REAP_INTERVAL: Setting[float] = Setting(float, 30.0, Bound(0.1, DAY))
    # shown as silent after this long; display only, never death
    WORKER_SILENT_AFTER: Setting[float] = Setting(float, 60.0, Bound(1.0, MAX_LEASE))
    WORKER_DEAD_AFTER: Setting[None] = Setting(object, None, removed=_DEAD_AFTER)
    # Worker: seconds between polls when no notification arrives
    POLL_INTERVAL: Setting[float] = Setting(float, 1.0, Bound(0.01, 3600.0))
    # aliases one worker fleet drains; None = each model's router alias
    WORKER_DATABASES: Setting[list[str] | tuple[str, ...] | None] = Setting(
        (list, tuple), None, none_allowed=True
    )
    # seconds a worker may hold completions to write them in one batch
    ACK_WINDOW: Setting[float] = Setting(float, 0.05, Bound(0.0, 60.0))
    # seconds a --burst worker retries a database that keeps failing before it exits 6
    BURST_GIVE_UP: Setting[float] = Setting(float, 30.0, Bound(1.0, DAY))
    # seconds; None = a third of the lease
    HEARTBEAT_INTERVAL: Setting[float | None] = Setting(
        float, None, Bound(0.01, 15 * DAY), none_allowed=True
    )
    # Notifications and poolers (PostgreSQL): NOTIFY workers when ready rows are committed
    # (True, "trigger" or False), on this channel; POOLER_MODE is pgBouncer's pool_mode
    NOTIFY: Setting[bool | str] = Setting((bool, str), True)
    NOTIFY_CHANNEL: Setting[str] = Setting(str, "taskclaim")
    POOLER_MODE: Setting[str | None] = Setting(
        str, None, none_allowed=True
    )  # None | "session" | "transaction"
    # Monitoring: the bearer token the metrics view accepts; None = staff users with the
    # permission taskclaim.view_metrics only
    METRICS_TOKEN: Setting[str | None] = Setting(str, None, none_allowed=True)
    # queues per model given a series of their own (the busiest); the rest are summed up
    # in one series, queue "(other)" (the metrics view, taskclaim_metrics, OpenTelemetry)
    METRICS_MAX_QUEUES: Setting[int] = Setting(int, 50, Bound(1, 10_000, whole=True))
    # The outbox relay's broker URL when taskclaim_relay is given no --url (after the
    # environment variable of the same name); None = none
    RELAY_URL: Setting[str | None] = Setting(str, None, none_allowed=True)
    # Each attempt's story (taskclaim.TaskAttempt): which attempts workers record ("errors":
    # those that did not end done; "all"; "off") and how many are kept per row
    ATTEMPT_LOG: Setting[str] = Setting(str, "errors")
    ATTEMPTS_KEPT: Setting[int] = Setting(int, 10, Bound(1, 1000, whole=True))
    # seconds between two samples of a model's ready / processing rows (the admin's queue
    # depth chart), taken by one worker per model; None = no samples
    DEPTH_SAMPLE_INTERVAL: Setting[float | None] = Setting(
        float, 60.0, Bound(10.0, 3600.0), none_allowed=True
    )

    if not TYPE_CHECKING:  # at run time only: mypy reports an unknown name instead

        def __getattr__(self, name: str) -> Any:
            raise AttributeError(f"unknown django-taskclaim setting {PREFIX}{name}")

    def unknown_names(self) -> list[tuple[str, str | None]]:
        """Return ``(name, suggestion)`` for each ``TASKCLAIM_*`` setting we do not know."""
        found = []
        known = [PREFIX + k for k in DEFAULTS]
        for name in dir(settings):
            if name.startswith(PREFIX) and name[len(PREFIX) :] not in DEFAULTS:
                if name[len(PREFIX) :] in REMOVED:
                    continue  # reported with its own message
                close = difflib.get_close_matches(name, known, n=1)
                found.append((name, close[0] if close else None))
        return found

    def removed_names(self) -> list[tuple[str, str]]:
        """``(name, what to do instead)`` for each removed ``TASKCLAIM_*`` setting set."""
        return [(PREFIX + n, why) for n, why in REMOVED.items() if hasattr(settings, PREFIX + n)]


#: Every ``TASKCLAIM_*`` setting, removed ones included, in the order of
#: :class:`TaskClaimSettings` (and of ``docs/settings.md``).
TABLE: tuple[Setting[Any], ...] = tuple(
    v for v in vars(TaskClaimSettings).values() if isinstance(v, Setting)
)
#: name (without prefix) -> :class:`Setting`, for every setting that exists.
SETTINGS: dict[str, Setting[Any]] = {s.name: s for s in TABLE if s.removed is None}
#: name (without prefix) -> default value.
DEFAULTS: dict[str, Any] = {name: s.default for name, s in SETTINGS.items()}
#: name (without prefix) -> bounds, for every numeric setting (``taskclaim.E005``).
BOUNDS: dict[str, Bound] = {n: s.bound for n, s in SETTINGS.items() if s.bound is not None}
#: Settings whose ``None`` means "not set" (a default derived elsewhere, or "never").
NONE_ALLOWED = frozenset(name for name, s in SETTINGS.items() if s.none_allowed)
#: Settings that existed once, with what to do instead (reported by ``taskclaim.E007``).
REMOVED: dict[str, str] = {s.name: s.removed for s in TABLE if s.removed is not None}


def setting_problem(name: str, value: Any) -> str | None:
    """Why the value of ``TASKCLAIM_<name>`` is out of its :data:`BOUNDS`, or ``None``
    if it is fine (a setting of :data:`NONE_ALLOWED` may also be ``None``)."""
    if value is None and name in NONE_ALLOWED:
        return None
    try:
        bounds.number(value, name, BOUNDS[name])
    except ConfigurationError as exc:
        return str(exc)
    return None


taskclaim_settings = TaskClaimSettings()
